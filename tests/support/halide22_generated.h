/* What Halide 22's generated code checks of its buffer arguments before anything else, for the
 * hand-written pipelines that emulate it (tests/support/halide22_*.c): the type word (all 32
 * bits, the third field 0), the dimensions, Halide's default stride constraint, the bounds
 * query's answer for an elementwise stage and the bounds check of its input. */
#ifndef TESTS_SUPPORT_HALIDE22_GENERATED_H
#define TESTS_SUPPORT_HALIDE22_GENERATED_H

#include <stdint.h>
#include <string.h>

#include "HalideRuntime.h"

/* The type word of a buffer of `code`/`bits` scalars in Halide 22. */
#define TYPE22(code, bits) ((uint32_t)(code) | ((uint32_t)(bits) << 8))

static inline uint32_t type_word(const halide_buffer_t *buf) {
    uint32_t word;
    memcpy(&word, &buf->type, sizeof word);
    return word;
}

static inline int is_bounds_query(const halide_buffer_t *buf) {
    return buf->host == NULL && buf->device == 0;
}

/* What generated code checks of a buffer argument before anything else: present, its type
 * (all 32 bits), its dimensions, and a dense innermost dimension (Halide's default
 * constraint). */
static inline int check_buffer(void *uc, const char *name, const halide_buffer_t *buf,
                               uint32_t type, int dimensions) {
    if (buf == NULL) {
        return halide_error_buffer_argument_is_null(uc, name);
    }
    if (type_word(buf) != type) {
        return halide_error_bad_type(uc, name, type, type_word(buf));
    }
    if (buf->dimensions != dimensions) {
        return halide_error_bad_dimensions(uc, name, dimensions, buf->dimensions);
    }
    if (!is_bounds_query(buf) && buf->dim[0].stride != 1) {
        return halide_error_constraint_violated(uc, "stride.0", buf->dim[0].stride, "1", 1);
    }
    return 0;
}

/* An input's region, as the bounds query answers it: the output's. */
static inline void require_region(halide_buffer_t *input, const halide_buffer_t *output) {
    for (int d = 0; d < output->dimensions; d++) {
        input->dim[d].min = output->dim[d].min;
        input->dim[d].extent = output->dim[d].extent;
    }
}

static inline int covers(void *uc, const char *name, const halide_buffer_t *input,
                         const halide_buffer_t *output) {
    for (int d = 0; d < output->dimensions; d++) {
        int out_max = output->dim[d].min + output->dim[d].extent - 1;
        int in_max = input->dim[d].min + input->dim[d].extent - 1;
        if (input->dim[d].min > output->dim[d].min || in_max < out_max) {
            return halide_error_access_out_of_bounds(uc, name, d, output->dim[d].min, out_max,
                                                     input->dim[d].min, in_max);
        }
    }
    return 0;
}

/* An elementwise stage's checks of its `input` and `output` (2-D, scalars of `type`): the
 * buffers', then the bounds query's answer (the input's region is the output's), then the
 * input's region. H22_QUERIED where the call was a bounds query (answered: nothing to compute),
 * 0 to compute, else Halide's error code. */
enum { H22_QUERIED = 1 };

static inline int check_elementwise(void *uc, halide_buffer_t *input, halide_buffer_t *output,
                                    uint32_t type) {
    int err = check_buffer(uc, "input", input, type, 2);
    if (err == 0) {
        err = check_buffer(uc, "output", output, type, 2);
    }
    if (err != 0) {
        return err;
    }
    if (is_bounds_query(input)) {
        require_region(input, output);
    }
    if (is_bounds_query(input) || is_bounds_query(output)) {
        return H22_QUERIED;
    }
    return covers(uc, "input", input, output);
}

#endif
