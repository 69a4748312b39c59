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

#endif
