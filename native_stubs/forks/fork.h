/* Forks (fork.c): the process a backend binds in, which it passes to shim_refuse_after_fork
 * on every entry point that uses the device; that returns gpu_device_error (reported through
 * halide_error, naming `api`) in a forked child. */
#ifndef SHIM_FORKS_FORK_H
#define SHIM_FORKS_FORK_H

#include "shim_native.h"

pid_t shim_bound_process(void);
int shim_refuse_after_fork(void *user_context, pid_t bound, const char *api);

#endif
