/* Internal header of the native runtime library (the cffi module shim._native).
 *
 * Every .c file here includes this and only this. It pulls in Halide's real runtime header, so
 * each halide_* function we define is checked against Halide's own prototype.
 */
#ifndef SHIM_NATIVE_H
#define SHIM_NATIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <HalideRuntime.h>
#include <HalideRuntimeCuda.h>
#include <HalideRuntimeOpenCL.h>

/* The headers cffi reads too (abi/, fed to it by native_stubs/build.py): the native library's
 * API, and the Python core's callbacks, which the C files here call. */
#include "dlpack.h"
#include "halide_device_impl.h"
#include "shim_calls.h"
#include "shim_buffers.h"
#include "shim_backends.h"
#include "shim_fast_paths.h"
#include "shim_dlpack.h"
#include "shim_signals.h"
#include "shim_profile.h"
#include "shim_trace.h"
#include "shim_fork.h"
#include "shim_callbacks.h"

/* Signal handlers held from C (signals_held.c): while a thread is inside a hold, the shim's
 * handlers only note the signals that arrive, and its last release delivers them again, for
 * their handlers to run in Python, outside. The fast paths hold around a call (the device
 * callbacks of its run and its bookkeeping's Python code: a handler's exception landing before
 * that code's own deferred() would leave a use recorded for good, inside a callback it would
 * fail the call); so do the DLPack deleters and the shim's finalizers and context managers. */
void shim_signals_hold(void);
void shim_signals_release(void);

/* Forks (fork.c): the process a backend binds in, which it passes to shim_refuse_after_fork
 * on every entry point that uses the device; that returns gpu_device_error (reported through
 * halide_error, naming `api`) in a forked child. */
pid_t shim_bound_process(void);
int shim_refuse_after_fork(void *user_context, pid_t bound, const char *api);
/* What fork.c's handlers have the other files do. A child has only the forking thread: */
void shim_calls_keep_own(void);              /* call_context.c: its calls alone are running */
void shim_trace_forget_other_threads(void);  /* tracing.c: no other thread is in the handler */
void shim_profile_lock_for_fork(void);       /* profile.c: its counters whole in the child... */
void shim_profile_unlock_after_fork(void);   /* ...and free again, on both sides */

/* The fast path's calls (fastcall.c): begin returns false once calls are closed at exit. */
bool shim_calls_begin(void);
void shim_calls_end(void);
bool shim_calls_closed(void);

/* One of the call's thread-pool tasks returned an error (see call_context.c). */
void shim_call_task_failed(shim_call *call);

/* Whether `buf` holds memory of `backend` whose native handle a caller may take or detach
 * (device_generic.c): success; SHIM_NO_NATIVE_HANDLE when it has none (no device memory, or
 * a crop's proxy placeholder, which is a host address); an error code, reported through
 * halide_error, for a NULL buffer or one on another device interface (where Halide aborts). */
enum { SHIM_NO_NATIVE_HANDLE = 1 };
int shim_check_native_handle(void *user_context, const halide_buffer_t *buf, int backend,
                             const char *routine);

/* Generic entry points Halide defines but its public header does not declare. */
int halide_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                  const struct halide_device_interface_t *device_interface);
int halide_device_and_host_free(void *user_context, struct halide_buffer_t *buf);
int halide_acquire_cl_context(void *user_context, void **ctx, void **queue, bool create);
int halide_cuda_acquire_context(void *user_context, void **ctx, bool create);
int halide_cuda_release_context(void *user_context);
int halide_cuda_get_stream(void *user_context, void *ctx, void **stream);

/* Profiling (profile.c): the flag, read relaxed on every path it guards. */
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

static inline bool shim_owns_interface(const struct halide_device_interface_t *device_interface) {
    return shim_backend_of(device_interface) >= 0;
}

static inline bool shim_is_proxy(const struct halide_device_interface_t *device_interface) {
    return device_interface != NULL && device_interface == shim_backend_interface(SHIM_BACKEND_PROXY);
}

/* Whether a buffer whose device and device_interface fields read `device` and `interface` has
 * device memory of its own: a handle, and not the proxy interface a member of a shared family
 * carries until the family is on a device (its "handle" is then the member's own address).
 * The Python core asks the same with shim/memory/aliasing.py's has_allocation. */
static inline bool shim_has_allocation(uint64_t device,
                                       const struct halide_device_interface_t *interface) {
    return device != 0 && interface != NULL && !shim_is_proxy(interface);
}

/* Atomic access to halide_buffer_t::flags. Generated code writes flags inline, so every read the
 * shim bases a decision on is an acquire load, and every change is a read-modify-write that keeps
 * the other bits. */
static inline uint64_t shim_flags_load(const halide_buffer_t *buf) {
    return __atomic_load_n(&buf->flags, __ATOMIC_ACQUIRE);
}

static inline void shim_flags_clear(halide_buffer_t *buf, uint64_t bits) {
    __atomic_fetch_and(&buf->flags, ~bits, __ATOMIC_RELEASE);
}

static inline void shim_flags_set(halide_buffer_t *buf, uint64_t bits) {
    __atomic_fetch_or(&buf->flags, bits, __ATOMIC_RELEASE);
}

static inline uint64_t shim_device_load(const halide_buffer_t *buf) {
    return __atomic_load_n(&buf->device, __ATOMIC_ACQUIRE);
}

#endif
