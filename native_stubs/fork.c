/* Devices initialized before a fork. A child has a copy of its parent's driver objects (an
 * OpenCL queue, a CUDA context) but none of the driver's threads, and drivers do not support
 * that: a launch there waits forever. Each backend notes the process it was bound in, and
 * every entry point that would use the device refuses in any other. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "shim_native.h"

static pid_t current_process;

static void after_fork_in_child(void) {
    __atomic_store_n(&current_process, getpid(), __ATOMIC_RELAXED);
}

static void watch_forks(void) {
    __atomic_store_n(&current_process, getpid(), __ATOMIC_RELAXED);
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

pid_t shim_bound_process(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, watch_forks);
    return __atomic_load_n(&current_process, __ATOMIC_RELAXED);
}

int shim_refuse_after_fork(void *user_context, pid_t bound, const char *api) {
    if (__builtin_expect(bound == __atomic_load_n(&current_process, __ATOMIC_RELAXED), 1)) {
        return halide_error_code_success;
    }
    char message[160];
    snprintf(message, sizeof message,
             "%s: the device was initialized in the parent process; a forked child cannot "
             "use it\n", api);
    halide_error(user_context, message);
    return halide_error_code_gpu_device_error;
}
