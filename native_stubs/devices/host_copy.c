/* halide_buffer_copy into host memory, in C (host_copy.h).
 *
 * A pipeline's copy stages (Func::copy_to_host(), one copy a row in a folded async schedule)
 * are such copies between its own buffers; through Python each cost tens of microseconds where
 * Halide's runtime does a memcpy. Served here, with no lock and no Python, are the copies whose
 * outcome this file can prove equal to the Python core's (shim/core/runtime.py buffer_copy,
 * its host-to-host branch), everything else declined:
 *  - no device allocation on the destination, nor a crop's proxy (device and device_interface
 *    read with acquire, as the no-op paths read them: device_generic.c), so that its host
 *    holds its only copy; the source's data in its host memory (no device allocation, or one
 *    of the shim's that is not device-dirty: the Python core's from_host_valid), or, for
 *    shim_copy_from_device, in a device allocation the native layer served (served.c), whose
 *    bytes mirror the source's host layout from its min element: the overlap is read in one
 *    read (straight into the destination where it is one run), as the Python core's _read
 *    of it does;
 *  - neither is a shim.Buffer's struct (SHIM_BUFFER_FLAG_PYTHON) nor a member of a shared
 *    family (SHIM_BUFFER_FLAG_REGIONS), nor a struct generated code copied from one (Halide's
 *    _halide_buffer_crop copies the flags). A shim.Buffer belongs to a family in Python, whose
 *    lock the Python core takes: a shared family's members write the family's host regions
 *    (whose boxes and derived bits only that lock keeps whole, shim/memory/aliasing.py), a
 *    family may be abandoned at a fork (its buffers refused in the child, as
 *    tests/test_fork_reads.py checks, which C cannot see from the struct), and its device
 *    allocation may be made under that lock while this copy runs. A pipeline's own buffers
 *    and the fast call's numpy arrays have no family: the Python core takes no lock for them
 *    either, so skipping it here changes nothing;
 *  - both hosts set, elements of one size (as Python measures them: bits rounded up to bytes),
 *    a non-negative number of dimensions, and a destination whose elements are each at their
 *    own address (else which write lands last is numpy's order of iteration, not ours);
 *  - the offsets fit in int64, and where the source and destination bytes may overlap (views
 *    of one memory), room for a copy of the source: numpy's copyto, which the Python core uses,
 *    reads such a source whole before writing, and so does this file.
 */
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "devices/element_layout.h"
#include "devices/host_copy.h"
#include "devices/served.h"
#include "profiling/profile.h"

/* A buffer the Python core would copy without a family lock (a snapshot with acquire loads),
 * with host memory. */
static bool bare_with_host(const halide_buffer_t *buf) {
    return !(shim_flags_load(buf) & (SHIM_BUFFER_FLAG_PYTHON | SHIM_BUFFER_FLAG_REGIONS)) &&
           buf->host != NULL && buf->dimensions >= 0 && (buf->dimensions == 0 || buf->dim != NULL);
}

/* Such a buffer whose host memory is the only copy of its data. */
static bool host_only(const halide_buffer_t *buf) {
    return shim_device_load(buf) == 0 &&
           __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) == NULL &&
           bare_with_host(buf);
}

/* Such a buffer whose host memory holds its data (the Python core's from_host_valid): host
 * only, or with a device allocation of the shim's (halide_buffer_copy asks for no other) that
 * holds no newer data. */
static bool host_valid(const halide_buffer_t *buf) {
    return host_only(buf) ||
           (bare_with_host(buf) && !(shim_flags_load(buf) & halide_buffer_flag_device_dirty));
}

static int64_t magnitude(int64_t v) {
    return v < 0 ? -v : v;
}

/* Whether no two elements the copy writes share a byte: with the dimensions by increasing
 * stride magnitude (as the copy's layout has them), each stride clears everything the
 * dimensions inside it reach. */
static bool writes_apart(const shim_layout *l) {
    int64_t reach = l->run;
    for (int i = 0; i < l->count; i++) {
        int64_t step = magnitude(l->dims[i].to);
        if (step < reach) {
            return false;
        }
        reach += (l->dims[i].extent - 1) * step; /* (no overflow: shim_copy_layout_of) */
    }
    return true;
}

/* The lowest and one past the highest byte a side touches, from its start: (the magnitudes'
 * sums fit in int64: shim_copy_layout_of) */
static void bounds(const shim_layout *l, int64_t start, bool to, int64_t *lo, int64_t *hi) {
    *lo = start;
    *hi = start + l->run;
    for (int i = 0; i < l->count; i++) {
        int64_t reach = (l->dims[i].extent - 1) * (to ? l->dims[i].to : l->dims[i].stride);
        *(reach < 0 ? lo : hi) += reach;
    }
}

typedef struct {
    const uint8_t *from;
    uint8_t *to;
    int64_t run;
} copying;

static bool copy_run(int64_t at, int64_t to, void *context) {
    copying *c = context;
    memcpy(c->to + to, c->from + at, (size_t)c->run);
    return true;
}

/* Through `staging`, a run after another: the source's runs into it, then out of it. */
static bool gather_run(int64_t at, int64_t to, void *context) {
    copying *c = context;
    (void)to;
    memcpy(c->to, c->from + at, (size_t)c->run);
    c->to += c->run;
    return true;
}

static bool scatter_run(int64_t at, int64_t to, void *context) {
    copying *c = context;
    (void)at;
    memcpy(c->to + to, c->from, (size_t)c->run);
    c->from += c->run;
    return true;
}

/* The copy's layout (shim_copy_layout_of) where both sides' elements are of one size and the
 * destination's each at their own address; false (freed) where not. */
static bool planned(const halide_buffer_t *src, const halide_buffer_t *dst, shim_layout *l,
                    int64_t *src_start, int64_t *dst_start) {
    int64_t element = (src->type.bits + 7) / 8;
    if (element != (dst->type.bits + 7) / 8) {
        l->dims = NULL;
        l->index = NULL;
        return false; /* (the Python core's failure, with its message) */
    }
    if (shim_copy_layout_of(src, dst, element, l, src_start, dst_start) == SHIM_LAYOUT_MADE &&
        writes_apart(l)) {
        return true;
    }
    shim_layout_free(l);
    return false;
}

/* After a copy into dst's host memory: as flags.put_dirty(dst, HOST_DIRTY), set before
 * clearing; counted as served in C. */
static int copied_to_host(struct halide_buffer_t *src, struct halide_buffer_t *dst) {
    if (src != dst) {
        shim_flags_set(dst, halide_buffer_flag_host_dirty);
        shim_flags_clear(dst, halide_buffer_flag_device_dirty);
    }
    return shim_decided(SHIM_FN_BUFFER_COPY, SHIM_OUTCOME_SERVED, halide_error_code_success);
}

int shim_host_copy(struct halide_buffer_t *src, struct halide_buffer_t *dst) {
    if (!host_valid(src) || !host_only(dst)) {
        return SHIM_NOT_SERVED;
    }
    shim_layout l;
    int64_t src_start, dst_start;
    if (!planned(src, dst, &l, &src_start, &dst_start)) {
        return SHIM_NOT_SERVED;
    }
    int result = SHIM_NOT_SERVED;
    if (l.span != 0) {
        int64_t src_lo, src_hi, dst_lo, dst_hi;
        bounds(&l, src_start, false, &src_lo, &src_hi);
        bounds(&l, dst_start, true, &dst_lo, &dst_hi);
        const uint8_t *from = src->host + src_start;
        uint8_t *to = dst->host + dst_start;
        /* (addresses compared as integers: they are of one process's memory) */
        intptr_t s = (intptr_t)src->host, t = (intptr_t)dst->host;
        bool apart = s + src_hi <= t + dst_lo || t + dst_hi <= s + src_lo;
        if (apart) {
            copying c = {from, to, l.run};
            shim_layout_walk(&l, 0, copy_run, &c);
        } else {
            uint8_t *staging = malloc((size_t)l.span);
            if (staging == NULL) {
                goto done;
            }
            copying in = {from, staging, l.run};
            shim_layout_walk(&l, 0, gather_run, &in);
            copying out = {staging, to, l.run};
            shim_layout_walk(&l, 0, scatter_run, &out);
            free(staging);
        }
    }
    result = copied_to_host(src, dst);
done:
    shim_layout_free(&l);
    return result;
}

/* The reach of the copy's side (false: the source) within its device allocation, if it lies
 * inside it. */
static bool inside(const shim_layout *l, int64_t start, bool to, const shim_device_memory *m,
                   int64_t *lo, int64_t *hi) {
    bounds(l, start, to, lo, hi);
    return *lo >= 0 && *hi <= m->allocated;
}

int shim_copy_from_device(struct halide_buffer_t *src, struct halide_buffer_t *dst,
                          const shim_device_memory *from) {
    shim_layout l;
    int64_t src_start, dst_start, lo, hi;
    if (!host_only(dst) || !planned(src, dst, &l, &src_start, &dst_start)) {
        return SHIM_NOT_SERVED;
    }
    int result = SHIM_NOT_SERVED;
    if (l.span != 0) {
        if (!inside(&l, src_start, false, from, &lo, &hi)) {
            goto done; /* (a layout the allocation was not made for: the Python core reports) */
        }
        if (l.count == 0) { /* one run: straight into the destination */
            if (from->read(from->context, lo, dst->host + dst_start, hi - lo) != 0) {
                goto done;
            }
        } else { /* the source's reach in one read, then its runs out of it */
            uint8_t *staging = malloc((size_t)(hi - lo));
            if (staging == NULL || from->read(from->context, lo, staging, hi - lo) != 0) {
                free(staging);
                goto done;
            }
            copying c = {staging + (src_start - lo), dst->host + dst_start, l.run};
            shim_layout_walk(&l, 0, copy_run, &c);
            free(staging);
        }
    }
    result = copied_to_host(src, dst);
done:
    shim_layout_free(&l);
    return result;
}

/* After a copy into dst's device allocation: as flags.put_dirty(dst, DEVICE_DIRTY). */
static int copied_to_device(struct halide_buffer_t *dst) {
    shim_flags_set(dst, halide_buffer_flag_device_dirty);
    shim_flags_clear(dst, halide_buffer_flag_host_dirty);
    return shim_decided(SHIM_FN_BUFFER_COPY, SHIM_OUTCOME_SERVED, halide_error_code_success);
}

int shim_copy_to_device(struct halide_buffer_t *src, struct halide_buffer_t *dst,
                        const shim_device_memory *to) {
    shim_layout l;
    int64_t src_start, dst_start, lo, hi;
    if (src == dst || !host_valid(src) || !planned(src, dst, &l, &src_start, &dst_start)) {
        return SHIM_NOT_SERVED;
    }
    int result = SHIM_NOT_SERVED;
    if (l.span != 0) {
        if (!inside(&l, dst_start, true, to, &lo, &hi)) {
            goto done;
        }
        if (l.count == 0) { /* one run: straight from the source */
            if (to->write(to->context, lo, src->host + src_start, hi - lo) != 0) {
                goto done;
            }
        } else {
            /* The destination's reach read, its runs written into it, and written back: the
             * bytes between the runs go back as they were (the one in-order queue orders the
             * read after the work before it). */
            uint8_t *staging = malloc((size_t)(hi - lo));
            if (staging == NULL || to->read(to->context, lo, staging, hi - lo) != 0) {
                free(staging);
                goto done;
            }
            copying c = {src->host + src_start, staging + (dst_start - lo), l.run};
            shim_layout_walk(&l, 0, copy_run, &c);
            int failed = to->write(to->context, lo, staging, hi - lo);
            free(staging);
            if (failed) {
                goto done;
            }
        }
    }
    result = copied_to_device(dst);
done:
    shim_layout_free(&l);
    return result;
}

int shim_copy_between_devices(struct halide_buffer_t *src, struct halide_buffer_t *dst,
                              const shim_device_memory *from, const shim_device_memory *to,
                              int (*copy)(void *context, int64_t src_offset, int64_t dst_offset,
                                          int64_t nbytes),
                              void *context) {
    shim_layout l;
    int64_t src_start, dst_start, src_lo, src_hi, dst_lo, dst_hi;
    if (src == dst || !planned(src, dst, &l, &src_start, &dst_start)) {
        return SHIM_NOT_SERVED;
    }
    int result = SHIM_NOT_SERVED;
    if (l.span != 0) {
        if (l.count != 0 || !inside(&l, src_start, false, from, &src_lo, &src_hi) ||
            !inside(&l, dst_start, true, to, &dst_lo, &dst_hi) ||
            copy(context, src_lo, dst_lo, src_hi - src_lo) != 0) {
            goto done; /* (runs apart: the Python core's rectangle copies) */
        }
    }
    result = copied_to_device(dst);
done:
    shim_layout_free(&l);
    return result;
}
