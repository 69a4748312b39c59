/* Where a buffer's elements lie, as runs of contiguous bytes, and the walk over them
 * (element_layout.c): what the GPU backends' staging copies (backends/opencl.c,
 * backends/vulkan_kernels.c) take a crop's elements, and only those, back with, in memory
 * bounded by the buffer's number of dimensions whatever its number of elements. */
#ifndef SHIM_DEVICES_ELEMENT_LAYOUT_H
#define SHIM_DEVICES_ELEMENT_LAYOUT_H

#include "shim_native.h"

typedef struct {
    int64_t extent, stride; /* stride in bytes */
} shim_layout_dim;

typedef struct {
    int64_t element; /* bytes of one element */
    int64_t run;     /* bytes of one run: the element, or the innermost dimensions it fills */
    int64_t span;    /* bytes from the min element to just past the last; 0: it has none */
    int count;       /* the dimensions the runs repeat over */
    shim_layout_dim *dims; /* those, by increasing stride */
    int64_t *index;        /* the walk's counters, one per dimension */
} shim_layout;

/* The bytes of one of a buffer's elements (Halide 22's type has no lanes: its third field is
 * 0). */
static inline int64_t shim_element_bytes(const halide_buffer_t *buf) {
    return ((buf->type.bits + 7) / 8) * (int64_t)(buf->type.lanes ? buf->type.lanes : 1);
}

/* The layout of `buf`'s elements: dimensions of one element, and those of stride 0 (which
 * reach no other element), left out; the innermost ones whose elements follow each other
 * merged into the run. A span past INT64_MAX is INT64_MAX (no device memory holds it). Free
 * with shim_layout_free, whatever the outcome. */
typedef enum {
    SHIM_LAYOUT_MADE,
    SHIM_LAYOUT_NEGATIVE, /* a negative stride or number of dimensions: none to make */
    SHIM_LAYOUT_NO_MEMORY,
} shim_layout_outcome;
shim_layout_outcome shim_layout_of(const halide_buffer_t *buf, shim_layout *out);
void shim_layout_free(shim_layout *layout);

/* Calls `each(offset, context)` with the offset, in bytes from the min element, of every
 * combination of the layout's dimensions from `first` on (dimensions before `first` are the
 * caller's to cover from each offset), while `each` returns true: true once every one was
 * given, false where `each` stopped the walk. Nothing for a layout with no elements. */
bool shim_layout_walk(shim_layout *layout, int first, bool (*each)(int64_t, void *),
                      void *context);

#endif
