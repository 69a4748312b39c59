// h22vk_scale's kernel, shaped as Halide 22's code generator makes one (PR 8954;
// src/CodeGen_Vulkan_Dev.cpp at abbf7ff983): output(x, y) = input(x, y) * gain + bias.
//
// Its arguments in Halide's launch order, buffers first, then scalars widest first: input,
// output, gain, in_stride, out_stride, in_dx, in_dy, width, height, bias. The uniform block at
// binding 0 holds the scalars packed in that order (30 bytes: bias is 16-bit), zeros to a
// multiple of 4 bytes, then one int32 element offset per buffer, in buffer order; buffer j is
// at binding 1 + j, bound whole from the start of its VkBuffer, and every index into it is
// counted from the buffer's min element plus its offset.
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = 8, local_size_y = 8) in;
layout(set = 0, binding = 0) uniform Arguments {
    layout(offset = 0) float gain;
    layout(offset = 4) int in_stride;   // input.stride.1
    layout(offset = 8) int out_stride;  // output.stride.1
    layout(offset = 12) int in_dx;      // output.min.0 - input.min.0
    layout(offset = 16) int in_dy;      // output.min.1 - input.min.1
    layout(offset = 20) int width;      // output.extent.0
    layout(offset = 24) int height;     // output.extent.1
    layout(offset = 28) int16_t bias;
    layout(offset = 32) int input_offset;
    layout(offset = 36) int output_offset;
} a;
layout(set = 0, binding = 1) buffer Input { float input_data[]; };
layout(set = 0, binding = 2) buffer Output { float output_data[]; };

void main() {
    int x = int(gl_GlobalInvocationID.x), y = int(gl_GlobalInvocationID.y);
    if (x < a.width && y < a.height) {
        float value = input_data[(y + a.in_dy) * a.in_stride + x + a.in_dx + a.input_offset];
        output_data[y * a.out_stride + x + a.output_offset] = value * a.gain + float(a.bias);
    }
}
