/* Where a buffer's elements lie, as runs of contiguous bytes, and the walk over them
 * (element_layout.c): what the GPU backends' staging copies (backends/opencl.c,
 * backends/vulkan_kernels.c) take a crop's elements, and only those, back with, in memory
 * bounded by the buffer's number of dimensions whatever its number of elements. A copy
 * between two buffers' layouts (halide_buffer_copy between host memories, devices/host_copy.c)
 * is one such layout whose dimensions step through each side by its own stride. */
#ifndef SHIM_DEVICES_ELEMENT_LAYOUT_H
#define SHIM_DEVICES_ELEMENT_LAYOUT_H

#include "shim_native.h"

typedef struct {
    int64_t extent, stride; /* stride in bytes */
    int64_t to;             /* the destination's stride in a copy's layout; else `stride` */
} shim_layout_dim;

typedef struct {
    int64_t element; /* bytes of one element */
    int64_t run;     /* bytes of one run: the element, or the innermost dimensions it fills */
    int64_t span;    /* bytes from the min element to just past the last (a copy's layout:
                      * the bytes it copies); 0: it has none */
    int count;       /* the dimensions the runs repeat over */
    shim_layout_dim *dims; /* those, by increasing stride (a copy's: destination stride) */
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
    SHIM_LAYOUT_TOO_LARGE, /* (a copy's layout) offsets past int64: no memory holds them */
} shim_layout_outcome;
shim_layout_outcome shim_layout_of(const halide_buffer_t *buf, shim_layout *out);

/* The copy of the elements `src` and `dst` both have, where their boxes overlap (nothing where
 * they do not), as shim/native/regions.py's overlap_plan plans it: over the dimensions both
 * have, elements of `element` bytes, any strides (negative too). Its dimensions step `stride`
 * through the source and `to` through the destination, sorted by the destination's (absolute)
 * stride; the run is what is contiguous on both sides. `src_start` and `dst_start`: the bytes
 * from each buffer's min element to the overlap's first. Free with shim_layout_free. */
shim_layout_outcome shim_copy_layout_of(const halide_buffer_t *src, const halide_buffer_t *dst,
                                        int64_t element, shim_layout *out, int64_t *src_start,
                                        int64_t *dst_start);
void shim_layout_free(shim_layout *layout);

/* Calls `each(offset, to, context)` with the offset, in bytes from the min element, of every
 * combination of the layout's dimensions from `first` on (dimensions before `first` are the
 * caller's to cover from each offset), and `to`, the same in the destination's strides (a
 * copy's layout; else equal to offset), while `each` returns true: true once every one was
 * given, false where `each` stopped the walk. Nothing for a layout with no elements. */
bool shim_layout_walk(shim_layout *layout, int first, bool (*each)(int64_t, int64_t, void *),
                      void *context);

#endif
