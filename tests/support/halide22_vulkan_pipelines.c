/* Vulkan pipelines as Halide 22's generated code makes them, written by hand (no Halide 22
 * compiler is released), around kernels shaped as Halide 22's code generator makes them
 * (tests/support/halide22_kernels/, compiled and wrapped in Halide's Vulkan module format at
 * test time by tests/support/halide22_vulkan.py, which writes halide22_vulkan_kernels.h:
 * H22VK_KERNELS, the module's bytes). Built into a no_runtime library: every runtime function
 * it calls is the shim's, which serves it as Halide 22's by its metadata (argument types with 0
 * in halide_type_t's third field).
 *
 * Each pipeline does with the runtime what Halide 22's generated code does for a GPU pipeline
 * (the calls OffloadGPULoops and the host code generator make, in their order):
 * halide_vulkan_initialize_kernels with the library's own kernel state first, at every call
 * (bounds queries included); its type, dimension and stride checks; the bounds query;
 * halide_copy_to_device of every buffer, outputs included; halide_vulkan_run with the
 * arguments in Halide's order (buffers, then scalars widest first, each list ending in 0); the
 * outputs marked device-dirty; halide_vulkan_finalize_kernels at the end, as the destructor
 * generated code registers for it.
 * - h22vk_scale(input: float32 2-D, gain: float32, bias: int16, output: float32 2-D):
 *   output(x, y) = input(x, y) * gain + bias, kernel _kernel_scale (scale.comp);
 * - h22vk_add(a: uint8 1-D, b: int16 1-D, out: int32 1-D): out(x) = a(x) + b(x), kernel
 *   _kernel_add (add.comp), which takes buffers only; a and b share out's min.
 */
#include <stdint.h>
#include <string.h>

#include "HalideRuntime.h"
#include "halide22_runtime.h"
#include "halide22_generated.h"
#include "halide22_vulkan_kernels.h"

/* The Vulkan entry points generated code calls, as HalideRuntimeVulkan.h (a C++ header)
 * declares them. */
const struct halide_device_interface_t *halide_vulkan_device_interface(void);
int halide_vulkan_initialize_kernels(void *user_context, void **state_ptr, const char *src,
                                     int size);
int halide_vulkan_run(void *user_context, void *state_ptr, const char *entry_name, int blocksX,
                      int blocksY, int blocksZ, int threadsX, int threadsY, int threadsZ,
                      int shared_mem_bytes, size_t arg_sizes[], void *args[],
                      int8_t arg_is_buffer[]);
void halide_vulkan_finalize_kernels(void *user_context, void *state_ptr);

/* Every buffer on the device, as generated code asks before a launch (an output too: its
 * allocation). */
static int to_device(void *uc, halide_buffer_t *const *buffers, int count) {
    for (int i = 0; i < count; i++) {
        int result = halide_copy_to_device(uc, buffers[i], halide_vulkan_device_interface());
        if (result != 0) {
            return result;
        }
    }
    return 0;
}

/* --- h22vk_scale ------------------------------------------------------------------------ */

static void *scale_state; /* the library's kernel state, as generated code keeps one */

static int scale_body(void *uc, halide_buffer_t *input, float gain, int16_t bias,
                      halide_buffer_t *output) {
    const uint32_t f32 = TYPE22(halide_type_float, 32);
    int result = check_buffer(uc, "input", input, f32, 2);
    result = result ? result : check_buffer(uc, "output", output, f32, 2);
    if (result != 0) {
        return result;
    }
    if (is_bounds_query(input)) {
        require_region(input, output);
    }
    if (is_bounds_query(input) || is_bounds_query(output)) {
        return 0;
    }
    result = covers(uc, "input", input, output);
    halide_buffer_t *buffers[] = {input, output};
    result = result ? result : to_device(uc, buffers, 2);
    if (result != 0) {
        return result;
    }
    int32_t in_stride = input->dim[1].stride, out_stride = output->dim[1].stride;
    int32_t in_dx = output->dim[0].min - input->dim[0].min;
    int32_t in_dy = output->dim[1].min - input->dim[1].min;
    int32_t width = output->dim[0].extent, height = output->dim[1].extent;
    size_t arg_sizes[] = {8, 8, 4, 4, 4, 4, 4, 4, 4, 2, 0};
    void *args[] = {input, output, &gain, &in_stride, &out_stride, &in_dx, &in_dy, &width,
                    &height, &bias, NULL};
    int8_t arg_is_buffer[] = {1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    result = halide_vulkan_run(uc, scale_state, "_kernel_scale", (width + 7) / 8,
                               (height + 7) / 8, 1, 8, 8, 1, 0, arg_sizes, args, arg_is_buffer);
    if (result == 0) {
        output->flags |= halide_buffer_flag_device_dirty;
    }
    return result;
}

int h22vk_scale(halide_buffer_t *input, float gain, int16_t bias, halide_buffer_t *output) {
    void *uc = NULL;
    int result = halide_vulkan_initialize_kernels(uc, &scale_state, (const char *)H22VK_KERNELS,
                                                  (int)sizeof H22VK_KERNELS);
    if (result != 0) {
        return result;
    }
    result = scale_body(uc, input, gain, bias, output);
    halide_vulkan_finalize_kernels(uc, scale_state);
    return result;
}

int h22vk_scale_argv(void **args) {
    return h22vk_scale((halide_buffer_t *)args[0], *(float *)args[1], *(int16_t *)args[2],
                       (halide_buffer_t *)args[3]);
}

static const struct halide_filter_argument_t scale_arguments[] = {
    {"input", halide_argument_kind_input_buffer, 2, {halide_type_float, 32, 0}, NULL, NULL,
     NULL, NULL, NULL},
    {"gain", halide_argument_kind_input_scalar, 0, {halide_type_float, 32, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"bias", halide_argument_kind_input_scalar, 0, {halide_type_int, 16, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"output", halide_argument_kind_output_buffer, 2, {halide_type_float, 32, 0}, NULL, NULL,
     NULL, NULL, NULL},
};
static const struct halide_filter_metadata_t scale_metadata = {
    1, 4, scale_arguments, "x86-64-linux-no_runtime-vulkan", "h22vk_scale"};

const struct halide_filter_metadata_t *h22vk_scale_metadata(void) {
    return &scale_metadata;
}

/* --- h22vk_add -------------------------------------------------------------------------- */

static void *add_state;

static int add_body(void *uc, halide_buffer_t *a, halide_buffer_t *b, halide_buffer_t *out) {
    int result = check_buffer(uc, "a", a, TYPE22(halide_type_uint, 8), 1);
    result = result ? result : check_buffer(uc, "b", b, TYPE22(halide_type_int, 16), 1);
    result = result ? result : check_buffer(uc, "out", out, TYPE22(halide_type_int, 32), 1);
    if (result != 0) {
        return result;
    }
    if (is_bounds_query(a)) {
        require_region(a, out);
    }
    if (is_bounds_query(b)) {
        require_region(b, out);
    }
    if (is_bounds_query(a) || is_bounds_query(b) || is_bounds_query(out)) {
        return 0;
    }
    /* (The kernel has no scalars to say where out's elements are in the inputs: a constraint
     * puts them at the same coordinates.) */
    if (a->dim[0].min != out->dim[0].min) {
        return halide_error_constraint_violated(uc, "a.min.0", a->dim[0].min, "out.min.0",
                                                out->dim[0].min);
    }
    if (b->dim[0].min != out->dim[0].min) {
        return halide_error_constraint_violated(uc, "b.min.0", b->dim[0].min, "out.min.0",
                                                out->dim[0].min);
    }
    result = covers(uc, "a", a, out);
    result = result ? result : covers(uc, "b", b, out);
    halide_buffer_t *buffers[] = {a, b, out};
    result = result ? result : to_device(uc, buffers, 3);
    if (result != 0 || out->dim[0].extent == 0) {
        return result;
    }
    size_t arg_sizes[] = {8, 8, 8, 0};
    void *args[] = {a, b, out, NULL};
    int8_t arg_is_buffer[] = {1, 1, 1, 0};
    result = halide_vulkan_run(uc, add_state, "_kernel_add", out->dim[0].extent, 1, 1, 1, 1, 1,
                               0, arg_sizes, args, arg_is_buffer);
    if (result == 0) {
        out->flags |= halide_buffer_flag_device_dirty;
    }
    return result;
}

int h22vk_add(halide_buffer_t *a, halide_buffer_t *b, halide_buffer_t *out) {
    void *uc = NULL;
    int result = halide_vulkan_initialize_kernels(uc, &add_state, (const char *)H22VK_KERNELS,
                                                  (int)sizeof H22VK_KERNELS);
    if (result != 0) {
        return result;
    }
    result = add_body(uc, a, b, out);
    halide_vulkan_finalize_kernels(uc, add_state);
    return result;
}

int h22vk_add_argv(void **args) {
    return h22vk_add((halide_buffer_t *)args[0], (halide_buffer_t *)args[1],
                     (halide_buffer_t *)args[2]);
}

static const struct halide_filter_argument_t add_arguments[] = {
    {"a", halide_argument_kind_input_buffer, 1, {halide_type_uint, 8, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"b", halide_argument_kind_input_buffer, 1, {halide_type_int, 16, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"out", halide_argument_kind_output_buffer, 1, {halide_type_int, 32, 0}, NULL, NULL, NULL,
     NULL, NULL},
};
static const struct halide_filter_metadata_t add_metadata = {
    1, 3, add_arguments, "x86-64-linux-no_runtime-vulkan", "h22vk_add"};

const struct halide_filter_metadata_t *h22vk_add_metadata(void) {
    return &add_metadata;
}
