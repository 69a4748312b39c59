/* halide_buffer_copy between two buffers' host memories, served in C (host_copy.c). */
#ifndef SHIM_DEVICES_HOST_COPY_H
#define SHIM_DEVICES_HOST_COPY_H

#include "shim_native.h"

/* The copy of `src`'s elements into `dst`'s host memory where their boxes overlap, and dst
 * marked host-dirty (unless it is src), exactly as the Python core's buffer_copy does it
 * (shim/core/runtime.py): success, counted as served in C while profiling; or SHIM_NOT_SERVED
 * (devices/served.h), with nothing done, where this file cannot prove it does the same, and
 * the Python core takes the call. For a copy with no destination interface only. */
int shim_host_copy(struct halide_buffer_t *src, struct halide_buffer_t *dst);

/* Reads `nbytes` of a source's device allocation from byte `offset` (from its min element) into
 * `host`: 0 once they are there. */
typedef int (*shim_device_reader)(void *context, int64_t offset, void *host, int64_t nbytes);

/* The same copy with the source's elements read from its device allocation, laid out as its
 * host memory would be from its min element over `allocated` bytes (a served allocation: the
 * caller has checked that this is where the source's data is), by `read`, one read. */
int shim_copy_from_device(struct halide_buffer_t *src, struct halide_buffer_t *dst,
                          int64_t allocated, shim_device_reader read, void *context);

#endif
