/* A buffer's elements as runs of contiguous bytes, and a copy's between two buffers
 * (element_layout.h). The walk keeps one counter per dimension, allocated with the layout, so
 * that copying a crop's elements costs memory for its dimensions, never for its elements or
 * runs (a 2048 x 2048 crop is 2048 runs of one row, walked with two counters). */
#include <stdlib.h>

#include "shim_native.h"
#include "devices/element_layout.h"

static int64_t saturated_add(int64_t a, int64_t b) {
    int64_t sum;
    return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

static int64_t saturated_mul(int64_t a, int64_t b) {
    int64_t product;
    return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}

/* The innermost dimensions whose elements follow each other (on both sides of a copy) are
 * one run. */
static void merge_runs(shim_layout *out) {
    int merged = 0;
    while (merged < out->count && out->dims[merged].stride == out->run &&
           out->dims[merged].to == out->run) {
        out->run = saturated_mul(out->run, out->dims[merged++].extent);
    }
    out->count -= merged;
    for (int i = 0; i < out->count; i++) {
        out->dims[i] = out->dims[i + merged];
    }
}

shim_layout_outcome shim_layout_of(const halide_buffer_t *buf, shim_layout *out) {
    *out = (shim_layout){shim_element_bytes(buf), shim_element_bytes(buf), 0, 0, NULL, NULL};
    if (buf->dimensions < 0) {
        return SHIM_LAYOUT_NEGATIVE;
    }
    int64_t reach = 0; /* in elements, from the min element to the last */
    bool empty = false;
    for (int d = 0; d < buf->dimensions; d++) {
        const halide_dimension_t *dim = &buf->dim[d];
        if (dim->stride < 0) {
            return SHIM_LAYOUT_NEGATIVE;
        }
        empty |= dim->extent <= 0;
        if (dim->extent > 1) {
            reach = saturated_add(reach, saturated_mul(dim->extent - 1, dim->stride));
        }
    }
    if (empty) {
        return SHIM_LAYOUT_MADE; /* no elements: no runs */
    }
    out->span = saturated_mul(saturated_add(reach, 1), out->element);
    /* (one allocation for both arrays, never of size 0) */
    size_t n = (size_t)buf->dimensions + 1;
    out->dims = malloc(n * (sizeof *out->dims + sizeof *out->index));
    if (out->dims == NULL) {
        return SHIM_LAYOUT_NO_MEMORY;
    }
    out->index = (int64_t *)(out->dims + n);
    for (int d = 0; d < buf->dimensions; d++) {
        const halide_dimension_t *dim = &buf->dim[d];
        if (dim->extent > 1 && dim->stride != 0) { /* insertion sort, by stride */
            int64_t stride = saturated_mul(dim->stride, out->element);
            shim_layout_dim next = {dim->extent, stride, stride};
            int i = out->count++;
            for (; i > 0 && out->dims[i - 1].stride > next.stride; i--) {
                out->dims[i] = out->dims[i - 1];
            }
            out->dims[i] = next;
        }
    }
    merge_runs(out);
    return SHIM_LAYOUT_MADE;
}

static int64_t magnitude(int64_t v) {
    return v < 0 ? -v : v;
}

shim_layout_outcome shim_copy_layout_of(const halide_buffer_t *src, const halide_buffer_t *dst,
                                        int64_t element, shim_layout *out, int64_t *src_start,
                                        int64_t *dst_start) {
    *out = (shim_layout){element, element, 0, 0, NULL, NULL};
    *src_start = *dst_start = 0;
    /* Over the dimensions both have, as overlap_plan's zip of the two boxes. */
    int n = src->dimensions < dst->dimensions ? src->dimensions : dst->dimensions;
    if (n < 0) {
        return SHIM_LAYOUT_NEGATIVE;
    }
    size_t slots = (size_t)n + 1; /* (one allocation for both arrays, never of size 0) */
    out->dims = malloc(slots * (sizeof *out->dims + sizeof *out->index));
    if (out->dims == NULL) {
        return SHIM_LAYOUT_NO_MEMORY;
    }
    out->index = (int64_t *)(out->dims + slots);
    /* Each side's start and reach (the sum of its steps' magnitudes) fit in int64, so that
     * the bytes either side touches can be told without overflow. */
    int64_t src_at = 0, dst_at = 0, src_reach = 0, dst_reach = 0, bytes = element;
    bool overflow = false;
    for (int d = 0; d < n; d++) {
        const halide_dimension_t *s = &src->dim[d], *t = &dst->dim[d];
        int64_t lo = s->min > t->min ? s->min : t->min;
        int64_t s_hi = (int64_t)s->min + s->extent, t_hi = (int64_t)t->min + t->extent;
        int64_t extent = (s_hi < t_hi ? s_hi : t_hi) - lo;
        if (extent <= 0) {
            out->count = 0; /* no overlap: nothing to copy */
            return SHIM_LAYOUT_MADE;
        }
        int64_t from = (int64_t)s->stride * element, to = (int64_t)t->stride * element;
        int64_t s_off, t_off, s_span, t_span;
        overflow |= __builtin_mul_overflow(lo - s->min, from, &s_off) ||
                    __builtin_mul_overflow(lo - t->min, to, &t_off) ||
                    __builtin_add_overflow(src_at, s_off, &src_at) ||
                    __builtin_add_overflow(dst_at, t_off, &dst_at) ||
                    __builtin_mul_overflow(extent - 1, magnitude(from), &s_span) ||
                    __builtin_mul_overflow(extent - 1, magnitude(to), &t_span) ||
                    __builtin_add_overflow(src_reach, s_span, &src_reach) ||
                    __builtin_add_overflow(dst_reach, t_span, &dst_reach) ||
                    __builtin_mul_overflow(bytes, extent, &bytes);
        if (extent > 1) { /* insertion sort, by the destination's stride's magnitude */
            shim_layout_dim next = {extent, from, to};
            int i = out->count++;
            for (; i > 0 && magnitude(out->dims[i - 1].to) > magnitude(to); i--) {
                out->dims[i] = out->dims[i - 1];
            }
            out->dims[i] = next;
        }
    }
    int64_t sum;
    if (overflow || __builtin_add_overflow(src_reach, element, &src_reach) ||
        __builtin_add_overflow(dst_reach, element, &dst_reach) ||
        __builtin_add_overflow(magnitude(src_at), src_reach, &sum) ||
        __builtin_add_overflow(magnitude(dst_at), dst_reach, &sum)) {
        return SHIM_LAYOUT_TOO_LARGE;
    }
    out->span = bytes;
    *src_start = src_at;
    *dst_start = dst_at;
    merge_runs(out);
    return SHIM_LAYOUT_MADE;
}

void shim_layout_free(shim_layout *layout) {
    free(layout->dims);
    layout->dims = NULL;
    layout->index = NULL;
}

bool shim_layout_walk(shim_layout *layout, int first, bool (*each)(int64_t, int64_t, void *),
                      void *context) {
    if (layout->span == 0) {
        return true;
    }
    int n = layout->count;
    for (int d = first; d < n; d++) {
        layout->index[d] = 0;
    }
    int64_t at = 0, to = 0;
    for (;;) {
        if (!each(at, to, context)) {
            return false;
        }
        /* The next place: the innermost counter up one, those that wrap back to 0. */
        int d = first;
        for (; d < n && ++layout->index[d] == layout->dims[d].extent; d++) {
            layout->index[d] = 0;
            at -= (layout->dims[d].extent - 1) * layout->dims[d].stride;
            to -= (layout->dims[d].extent - 1) * layout->dims[d].to;
        }
        if (d == n) {
            return true;
        }
        at += layout->dims[d].stride;
        to += layout->dims[d].to;
    }
}
