/* What the backends use of the generic device entry points (device_generic.c), beyond the API
 * Python has too (abi/shim_backends.h). */
#ifndef SHIM_DEVICES_DEVICE_GENERIC_H
#define SHIM_DEVICES_DEVICE_GENERIC_H

#include "shim_native.h"

/* Whether `buf` holds memory of `backend` whose native handle a caller may take or detach:
 * success; SHIM_NO_NATIVE_HANDLE when it has none (no device memory, or a crop's proxy
 * placeholder, which is a host address); an error code, reported through halide_error, for a
 * NULL buffer or one on another device interface (where Halide aborts). */
enum { SHIM_NO_NATIVE_HANDLE = 1 };
int shim_check_native_handle(void *user_context, const halide_buffer_t *buf, int backend,
                             const char *routine);

#endif
