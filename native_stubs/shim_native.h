/* The base header of the native runtime library (the cffi module shim._native): what every
 * layer below native_stubs/ stands on, and all the cffi module's own source includes.
 *
 * Every .c file includes this first, then the headers of the modules below it that it uses
 * (the layers, lowest first: calls/, profiling/, forks/, devices/, backends/, fast/; the order
 * is tests/test_native_layers.py's, which checks it). It pulls in Halide's real runtime
 * header, so each halide_* function we define is checked against Halide's own prototype, and
 * holds nothing of any one module: Halide's ABI, the library's API (abi/) and the atomic
 * access to a buffer's fields that every layer shares.
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
#include "halide22_runtime.h"
#include "halide_device_impl.h"
#include "shim_calls.h"
#include "shim_buffers.h"
#include "shim_allocations.h"
#include "shim_backends.h"
#include "shim_fast_paths.h"
#include "shim_dlpack.h"
#include "shim_signals.h"
#include "shim_profile.h"
#include "shim_trace.h"
#include "shim_fork.h"
#include "shim_releases.h"
#include "shim_callbacks.h"

/* Generic entry points Halide defines but its public header does not declare. */
int halide_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                  const struct halide_device_interface_t *device_interface);
int halide_device_and_host_free(void *user_context, struct halide_buffer_t *buf);
/* Halide 21's own implementations of the entry points the shim serves per release (the
 * profiler's, in profiling/halide_profiler.c; halide_default_trace, in profiling/trace_handlers.c):
 * the runtime object's symbols, renamed at build time (native_stubs/build.py: HALIDE21_RENAMED)
 * so that the shim's definitions take Halide's names. */
int halide21_profiler_instance_start(void *user_context, const char *pipeline_name,
                                     int num_funcs, const uint64_t *func_names,
                                     struct halide_profiler_instance_state *instance);
int halide21_profiler_instance_end(void *user_context,
                                   struct halide_profiler_instance_state *instance);
void halide21_profiler_memory_allocate(void *user_context,
                                       struct halide_profiler_instance_state *instance,
                                       int func_id, uint64_t incr);
void halide21_profiler_memory_free(void *user_context,
                                   struct halide_profiler_instance_state *instance, int func_id,
                                   uint64_t decr);
void halide21_profiler_stack_peak_update(void *user_context,
                                         struct halide_profiler_instance_state *instance,
                                         uint64_t *f_values);
int32_t halide21_default_trace(void *user_context, const struct halide_trace_event_t *event);

/* Halide's GPU entry points as cffi reads them (abi/halide_runtime_gpu.h): the context hooks its
 * runtime defines without declaring, and Vulkan's, whose header (HalideRuntimeVulkan.h) is C++
 * only (a default argument). */
#include "halide_runtime_gpu.h"

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
