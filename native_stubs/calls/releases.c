/* Which Halide release each call into the runtime is served by.
 *
 * Every pipeline in the process calls the same halide_* symbols, the shim's, whatever release
 * built it; where an entry point's meaning changed between releases (its arguments, the structs
 * it reads, the numbers it takes), the release of the library holding the caller's code decides
 * (abi/shim_releases.h). Python registers each library shim.load opens with its release
 * (shim/native/libraries.py) as the address range of its loaded segments; an entry point looks
 * its return address up. Libraries are never unloaded (a loaded pipeline's code stays), so the
 * registry only grows: an entry is written whole before the count that publishes it, and a
 * lookup reads the count with acquire, without a lock. Each thread remembers the last library
 * it found, since a pipeline's calls come from its own library one after another. */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "shim_native.h"
#include "calls/releases.h"

enum { LIBRARIES = 1024 };

typedef struct {
    uintptr_t start, end;
    int release;     /* atomic: a mask may settle it (shim_library_settle) */
    int alternative; /* atomic: -1 once settled or where there is none */
    int mask_count;
    uint64_t masks[2 * SHIM_MASKS][SHIM_FEATURE_WORDS]; /* release's, then alternative's */
} library;

static struct shim_release_facts releases[SHIM_RELEASES];
static bool defined[SHIM_RELEASES];
static int default_release;
static library libraries[LIBRARIES];
static int library_count; /* published with release: entries below it are whole */
/* Whether a library may be served by another release than the default: until one is, every
 * caller is served by the default, which shim_release_of answers without looking the caller
 * up (entry points called for every trace event would pay for it). Set for good, before the
 * library that may need it is published. */
static bool mixed;
static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread const library *last_found;

int shim_release_define(int index, const struct shim_release_facts *facts) {
    if (index < 0 || index >= SHIM_RELEASES) {
        return -1;
    }
    releases[index] = *facts;
    __atomic_store_n(&defined[index], true, __ATOMIC_RELEASE);
    return 0;
}

int shim_release_set_default(int index) {
    if (index < 0 || index >= SHIM_RELEASES || !__atomic_load_n(&defined[index], __ATOMIC_ACQUIRE)) {
        return -1;
    }
    if (__atomic_load_n(&library_count, __ATOMIC_ACQUIRE) > 0) {
        __atomic_store_n(&mixed, true, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&default_release, index, __ATOMIC_RELEASE);
    return 0;
}

static const library *library_at(uintptr_t address) {
    const library *hit = last_found;
    if (hit != NULL && address >= hit->start && address < hit->end) {
        return hit;
    }
    int count = __atomic_load_n(&library_count, __ATOMIC_ACQUIRE);
    for (int i = 0; i < count; i++) {
        if (address >= libraries[i].start && address < libraries[i].end) {
            last_found = &libraries[i];
            return &libraries[i];
        }
    }
    return NULL;
}

static int release_at(uintptr_t address) {
    const library *found = library_at(address);
    return found != NULL ? __atomic_load_n(&found->release, __ATOMIC_ACQUIRE)
                         : __atomic_load_n(&default_release, __ATOMIC_ACQUIRE);
}

const struct shim_release_facts *shim_release_of(const void *code) {
    if (!__atomic_load_n(&mixed, __ATOMIC_ACQUIRE)) {
        return &releases[__atomic_load_n(&default_release, __ATOMIC_ACQUIRE)];
    }
    return &releases[release_at((uintptr_t)code)];
}

const struct shim_release_facts *shim_release_facts(int index) {
    return &releases[index];
}

int shim_library_release(uintptr_t address) {
    return release_at(address);
}

int shim_library_alternative(uintptr_t address) {
    const library *found = library_at(address);
    return found != NULL ? __atomic_load_n(&found->alternative, __ATOMIC_ACQUIRE) : -1;
}

static bool same_mask(const uint64_t *a, const uint64_t *b) {
    return memcmp(a, b, SHIM_FEATURE_WORDS * sizeof *a) == 0;
}

static bool listed(const library *lib, int first, const uint64_t *mask) {
    for (int i = first; i < first + lib->mask_count; i++) {
        if (same_mask(lib->masks[i], mask)) {
            return true;
        }
    }
    return false;
}

int shim_library_settle(const void *code, const uint64_t *mask) {
    library *lib = (library *)library_at((uintptr_t)code);
    if (lib == NULL) {
        return __atomic_load_n(&default_release, __ATOMIC_ACQUIRE);
    }
    int alternative = __atomic_load_n(&lib->alternative, __ATOMIC_ACQUIRE);
    if (alternative >= 0) {
        bool theirs = listed(lib, 0, mask), other = listed(lib, lib->mask_count, mask);
        if (theirs != other) {
            /* (Two threads settling at once find the same answer: the masks are constants.) */
            if (other) {
                __atomic_store_n(&lib->release, alternative, __ATOMIC_RELEASE);
            }
            __atomic_store_n(&lib->alternative, -1, __ATOMIC_RELEASE);
        }
    }
    return __atomic_load_n(&lib->release, __ATOMIC_ACQUIRE);
}

/* The span of the loaded object one of whose segments holds `address`. */
typedef struct {
    uintptr_t address, start, end;
    bool found;
} object_span;

static int find_span(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    object_span *span = data;
    uintptr_t start = UINTPTR_MAX, end = 0;
    bool holds = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        if (segment->p_type != PT_LOAD) {
            continue;
        }
        uintptr_t lo = info->dlpi_addr + segment->p_vaddr, hi = lo + segment->p_memsz;
        holds |= span->address >= lo && span->address < hi;
        start = lo < start ? lo : start;
        end = hi > end ? hi : end;
    }
    if (holds) {
        span->start = start;
        span->end = end;
        span->found = true;
        return 1;
    }
    return 0;
}

int shim_library_register(uintptr_t address, int release, int alternative, int mask_count,
                          const uint64_t *masks) {
    if (release < 0 || release >= SHIM_RELEASES || alternative >= SHIM_RELEASES ||
        mask_count < 0 || mask_count > SHIM_MASKS) {
        return -1;
    }
    object_span span = {address, 0, 0, false};
    dl_iterate_phdr(find_span, &span);
    if (!span.found) {
        return -1;
    }
    pthread_mutex_lock(&register_lock);
    int count = __atomic_load_n(&library_count, __ATOMIC_RELAXED);
    int result = 0;
    library *lib = NULL;
    for (int i = 0; i < count; i++) {
        /* Loaded again (dlopen gives the same object): the same evidence, and what a mask may
         * have settled since stays. */
        lib = libraries[i].start == span.start ? &libraries[i] : lib;
    }
    if (lib == NULL && count == LIBRARIES) {
        result = -1;
    } else if (lib == NULL) {
        lib = &libraries[count];
        *lib = (library){span.start, span.end, release, alternative < 0 ? -1 : alternative,
                         mask_count, {{0}}};
        if (release != __atomic_load_n(&default_release, __ATOMIC_ACQUIRE) || alternative >= 0) {
            __atomic_store_n(&mixed, true, __ATOMIC_RELEASE);
        }
        if (alternative >= 0 && mask_count > 0) {
            memcpy(lib->masks, masks, (size_t)(2 * mask_count) * sizeof lib->masks[0]);
        }
        __atomic_store_n(&library_count, count + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&register_lock);
    return result;
}

void shim_releases_lock_for_fork(void) {
    pthread_mutex_lock(&register_lock);
}

void shim_releases_unlock_after_fork(void) {
    pthread_mutex_unlock(&register_lock);
}
