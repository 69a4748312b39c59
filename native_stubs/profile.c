/* The native side of the profiler (shim/profiler.py): counts of the calls decided in C, and
 * kernel launches reported around the launch. Everything else is recorded in Python, where
 * the calls arrive anyway. */
#include "shim_native.h"

int shim_profiling;
static uint64_t counts[SHIM_FN_COUNT][SHIM_OUTCOME_COUNT];

void shim_profile_enable(bool on) {
    __atomic_store_n(&shim_profiling, on ? 1 : 0, __ATOMIC_RELEASE);
}

void shim_profile_note(enum shim_function function, enum shim_outcome outcome) {
    __atomic_fetch_add(&counts[function][outcome], 1, __ATOMIC_RELAXED);
}

uint64_t shim_profile_count(int function, int outcome) {
    if (function < 0 || function >= SHIM_FN_COUNT || outcome < 0 || outcome >= SHIM_OUTCOME_COUNT) {
        return 0;
    }
    return __atomic_load_n(&counts[function][outcome], __ATOMIC_RELAXED);
}

void shim_profile_reset(void) {
    for (int f = 0; f < SHIM_FN_COUNT; f++) {
        for (int o = 0; o < SHIM_OUTCOME_COUNT; o++) {
            __atomic_store_n(&counts[f][o], 0, __ATOMIC_RELAXED);
        }
    }
}

int shim_profile_run(int backend, void *stream, shim_run_fn run, SHIM_RUN_PARAMS) {
    shim_launch launch = {
        .backend = backend,
        .kernel = entry_name,
        .blocks = {blocksX, blocksY, blocksZ},
        .threads = {threadsX, threadsY, threadsZ},
        .shared_mem_bytes = shared_mem_bytes,
        .stream = stream,
    };
    int token = shim_py_profile_launch_begin(user_context, &launch);
    int result = run(SHIM_RUN_ARGS);
    shim_py_profile_launch_end(token, result);
    return result;
}
