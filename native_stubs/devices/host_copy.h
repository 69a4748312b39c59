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

/* A buffer's device allocation, laid out as its host memory would be from its min element over
 * `allocated` bytes (a served allocation, devices/served.c): blocking reads and writes at
 * offsets from the min element, 0 once done. */
typedef struct {
    int (*read)(void *context, int64_t offset, void *host, int64_t nbytes);
    int (*write)(void *context, int64_t offset, const void *host, int64_t nbytes);
    void *context;
    int64_t allocated;
} shim_device_memory;

/* The same copy with the source's data in its device allocation `from` (the caller has checked
 * that this is where it is), read in one read; dst's host memory as shim_host_copy's. */
int shim_copy_from_device(struct halide_buffer_t *src, struct halide_buffer_t *dst,
                          const shim_device_memory *from);
/* The copy of a source whose host memory holds its data into dst's device allocation `to`, and
 * dst marked device-dirty: one write where the destination's part is one run, else its reach
 * read, filled and written back. */
int shim_copy_to_device(struct halide_buffer_t *src, struct halide_buffer_t *dst,
                        const shim_device_memory *to);
/* The copy from the device allocation `from` into `to` on one device, by `copy` (offsets from
 * each one's start), where the overlap is one run on both sides; dst marked device-dirty. */
int shim_copy_between_devices(struct halide_buffer_t *src, struct halide_buffer_t *dst,
                              const shim_device_memory *from, const shim_device_memory *to,
                              int (*copy)(void *context, int64_t src_offset, int64_t dst_offset,
                                          int64_t nbytes),
                              void *context);

#endif
