/* The native side of the profiler (profile.c): the flag every profiled path reads, the counts
 * of the calls decided in C, and the kernel launches reported around the launch. */
#ifndef SHIM_PROFILING_PROFILE_H
#define SHIM_PROFILING_PROFILE_H

#include "shim_native.h"

/* The flag, read relaxed on every path it guards. */
extern int shim_profiling;
void shim_profile_note(enum shim_function function, enum shim_outcome outcome);

static inline bool shim_profile_on(void) {
    return __builtin_expect(__atomic_load_n(&shim_profiling, __ATOMIC_RELAXED), 0);
}

/* Returns `result`, counting the call as `outcome` of `function` while profiling. */
static inline int shim_decided(enum shim_function function, enum shim_outcome outcome,
                               int result) {
    if (shim_profile_on()) {
        shim_profile_note(function, outcome);
    }
    return result;
}

/* halide_<api>_run's parameters and arguments, for the launch paths and their profiling. */
#define SHIM_RUN_PARAMS                                                                     \
    void *user_context, void *state_ptr, const char *entry_name, int blocksX, int blocksY,  \
        int blocksZ, int threadsX, int threadsY, int threadsZ, int shared_mem_bytes,        \
        size_t arg_sizes[], void *args[], int8_t arg_is_buffer[]
#define SHIM_RUN_ARGS                                                                       \
    user_context, state_ptr, entry_name, blocksX, blocksY, blocksZ, threadsX, threadsY,     \
        threadsZ, shared_mem_bytes, arg_sizes, args, arg_is_buffer
typedef int (*shim_run_fn)(SHIM_RUN_PARAMS);

/* Runs `run` with the profiler told before and after: the launch path while profiling. */
int shim_profile_run(int backend, void *stream, shim_run_fn run, SHIM_RUN_PARAMS);

/* Inside a profiled launch: the number of buffers it staged around the kernel (copied into
 * a buffer of their own and back, where the kernel cannot take them in place). */
void shim_profile_launch_staged(int buffers);

/* Around a fork (forks/fork.c): the counters whole in the child, then free again on both
 * sides. */
void shim_profile_lock_for_fork(void);
void shim_profile_unlock_after_fork(void);

#endif
