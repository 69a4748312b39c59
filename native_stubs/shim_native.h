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

#include <HalideRuntime.h>

#include "halide_device_impl.h"
#include "shim_api.h"

/* The calling thread's context, or NULL outside any shim call. */
shim_call *shim_current_call(void);

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
