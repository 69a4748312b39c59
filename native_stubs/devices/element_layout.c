/* A buffer's elements as runs of contiguous bytes (element_layout.h). The walk keeps one
 * counter per dimension, allocated with the layout, so that copying a crop's elements costs
 * memory for its dimensions, never for its elements or runs (a 2048 x 2048 crop is 2048 runs
 * of one row, walked with two counters). */
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
            shim_layout_dim next = {dim->extent, saturated_mul(dim->stride, out->element)};
            int i = out->count++;
            for (; i > 0 && out->dims[i - 1].stride > next.stride; i--) {
                out->dims[i] = out->dims[i - 1];
            }
            out->dims[i] = next;
        }
    }
    /* The innermost dimensions whose elements follow each other are one run. */
    int merged = 0;
    while (merged < out->count && out->dims[merged].stride == out->run) {
        out->run = saturated_mul(out->run, out->dims[merged++].extent);
    }
    out->count -= merged;
    for (int i = 0; i < out->count; i++) {
        out->dims[i] = out->dims[i + merged];
    }
    return SHIM_LAYOUT_MADE;
}

void shim_layout_free(shim_layout *layout) {
    free(layout->dims);
    layout->dims = NULL;
    layout->index = NULL;
}

bool shim_layout_walk(shim_layout *layout, int first, bool (*each)(int64_t, void *),
                      void *context) {
    if (layout->span == 0) {
        return true;
    }
    int n = layout->count;
    for (int d = first; d < n; d++) {
        layout->index[d] = 0;
    }
    int64_t at = 0;
    for (;;) {
        if (!each(at, context)) {
            return false;
        }
        /* The next place: the innermost counter up one, those that wrap back to 0. */
        int d = first;
        for (; d < n && ++layout->index[d] == layout->dims[d].extent; d++) {
            layout->index[d] = 0;
            at -= (layout->dims[d].extent - 1) * layout->dims[d].stride;
        }
        if (d == n) {
            return true;
        }
        at += layout->dims[d].stride;
    }
}
