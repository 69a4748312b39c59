/* Pipelines as Halide 22's generated code makes them, written by hand on the shim's own
 * declarations of Halide 22's ABI (abi/halide22_runtime.h), since no Halide 22 compiler is
 * released: what the shim must serve the day one is. Built at test time into a no_runtime
 * library (tests/support/releases.py: build_c_library); every runtime function it calls is
 * the shim's.
 *
 * Each exports NAME_argv and NAME_metadata as Halide's AOT pipelines do, with Halide 22's
 * metadata (argument types with 0 in halide_type_t's third field), and does what Halide 22's
 * generated code does with the runtime at the points the tests look at:
 * - h22_scale(input: uint8 2-D, gain: int32, output: uint8 2-D): output = input * gain. Checks
 *   each buffer's whole type word as Halide 22 does (code | bits << 8, the third field 0),
 *   answers the bounds query (the input's region is the output's), and fails with
 *   halide_error_bad_type otherwise;
 * - h22_dispatch(questions: uint64 2-D, answers: int32 1-D): a multitarget dispatcher's
 *   questions, asked as Halide 22's dispatchers ask them: each row of `questions` is a feature
 *   mask (two words, Halide 22's numbering); answers[i] is halide_can_use_target_features'
 *   raw answer for row i (Halide 22 reads 2 and 3 itself).
 */
#include "HalideRuntime.h"
#include "halide22_runtime.h"
#include "halide22_generated.h"

static int bad_type(void *uc, const char *name, uint32_t want, const halide_buffer_t *buf) {
    return halide_error_bad_type(uc, name, want, type_word(buf));
}

/* --- h22_scale ------------------------------------------------------------------------- */

int h22_scale(halide_buffer_t *input, int32_t gain, halide_buffer_t *output) {
    int err = check_elementwise(NULL, input, output, TYPE22(halide_type_uint, 8));
    if (err != 0) {
        return err == H22_QUERIED ? 0 : err;
    }
    for (int y = output->dim[1].min; y < output->dim[1].min + output->dim[1].extent; y++) {
        for (int x = output->dim[0].min; x < output->dim[0].min + output->dim[0].extent; x++) {
            const uint8_t *in = input->host + (x - input->dim[0].min) * input->dim[0].stride +
                                (y - input->dim[1].min) * input->dim[1].stride;
            uint8_t *out = output->host + (x - output->dim[0].min) * output->dim[0].stride +
                           (y - output->dim[1].min) * output->dim[1].stride;
            *out = (uint8_t)(*in * gain);
        }
    }
    return 0;
}

int h22_scale_argv(void **args) {
    return h22_scale((halide_buffer_t *)args[0], *(int32_t *)args[1], (halide_buffer_t *)args[2]);
}

static const struct halide_filter_argument_t scale_arguments[] = {
    {"input", halide_argument_kind_input_buffer, 2, {halide_type_uint, 8, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"gain", halide_argument_kind_input_scalar, 0, {halide_type_int, 32, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"output", halide_argument_kind_output_buffer, 2, {halide_type_uint, 8, 0}, NULL, NULL,
     NULL, NULL, NULL},
};
static const struct halide_filter_metadata_t scale_metadata = {
    1, 3, scale_arguments, "x86-64-linux-no_runtime", "h22_scale"};

const struct halide_filter_metadata_t *h22_scale_metadata(void) {
    return &scale_metadata;
}

/* --- h22_dispatch ---------------------------------------------------------------------- */

int h22_dispatch(halide_buffer_t *questions, halide_buffer_t *answers) {
    void *uc = NULL;
    if (type_word(questions) != TYPE22(halide_type_uint, 64)) {
        return bad_type(uc, "Input buffer questions", TYPE22(halide_type_uint, 64), questions);
    }
    if (type_word(answers) != TYPE22(halide_type_int, 32)) {
        return bad_type(uc, "Output buffer answers", TYPE22(halide_type_int, 32), answers);
    }
    if (is_bounds_query(questions)) {
        questions->dim[0].min = 0;
        questions->dim[0].extent = 2;
        questions->dim[1].min = answers->dim[0].min;
        questions->dim[1].extent = answers->dim[0].extent;
    }
    if (is_bounds_query(questions) || is_bounds_query(answers)) {
        return 0;
    }
    for (int i = 0; i < answers->dim[0].extent; i++) {
        const uint64_t *row = (const uint64_t *)questions->host + i * questions->dim[1].stride;
        uint64_t mask[2] = {row[0], row[questions->dim[0].stride]};
        ((int32_t *)answers->host)[i * answers->dim[0].stride] =
            halide_can_use_target_features(2, mask);
    }
    return 0;
}

int h22_dispatch_argv(void **args) {
    return h22_dispatch((halide_buffer_t *)args[0], (halide_buffer_t *)args[1]);
}

static const struct halide_filter_argument_t dispatch_arguments[] = {
    {"questions", halide_argument_kind_input_buffer, 2, {halide_type_uint, 64, 0}, NULL, NULL,
     NULL, NULL, NULL},
    {"answers", halide_argument_kind_output_buffer, 1, {halide_type_int, 32, 0}, NULL, NULL,
     NULL, NULL, NULL},
};
static const struct halide_filter_metadata_t dispatch_metadata = {
    1, 2, dispatch_arguments, "x86-64-linux-no_runtime", "h22_dispatch"};

const struct halide_filter_metadata_t *h22_dispatch_metadata(void) {
    return &dispatch_metadata;
}
