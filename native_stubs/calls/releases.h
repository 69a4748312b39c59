/* What the other C files use of releases.c beyond abi/shim_releases.h: the release an entry
 * point serves its caller by. */
#ifndef SHIM_CALLS_RELEASES_H
#define SHIM_CALLS_RELEASES_H

#include "shim_native.h"

/* The facts of the release that built the library holding `code` (an entry point's return
 * address: SHIM_CALLER_RELEASE), the default release's where nobody registered it. Lock-free. */
const struct shim_release_facts *shim_release_of(const void *code);
/* Release `index`'s facts. */
const struct shim_release_facts *shim_release_facts(int index);
/* The index of the release the library holding `code` is served by, after settling it by
 * `mask` (SHIM_FEATURE_WORDS words) where the library was registered with an alternative. */
int shim_library_settle(const void *code, const uint64_t *mask);

/* Around a fork (forks/fork.c): the registry whole in the child, then free on both sides. */
void shim_releases_lock_for_fork(void);
void shim_releases_unlock_after_fork(void);

/* In an entry point: the facts of the release its caller was built by. Entry points that use it
 * are never inlined into one another, so the return address is the caller's. */
#define SHIM_CALLER_RELEASE() shim_release_of(__builtin_return_address(0))

#endif
