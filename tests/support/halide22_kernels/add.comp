// h22vk_add's kernel, shaped as Halide 22's code generator makes one (PR 8954): a kernel with
// buffer arguments only, out(x) = a(x) + b(x) over elements of three sizes, one invocation per
// element. Halide 22 gives it a uniform block all the same, at binding 0, holding one int32
// element offset per buffer (in elements of that buffer's type), and the buffers bindings 1..3.
#version 450
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) uniform Offsets {
    layout(offset = 0) int a_offset;
    layout(offset = 4) int b_offset;
    layout(offset = 8) int out_offset;
} o;
layout(set = 0, binding = 1) buffer A { uint8_t a[]; };
layout(set = 0, binding = 2) buffer B { int16_t b[]; };
layout(set = 0, binding = 3) buffer Out { int out_data[]; };

void main() {
    int i = int(gl_GlobalInvocationID.x);
    out_data[i + o.out_offset] = int(a[i + o.a_offset]) + int(b[i + o.b_offset]);
}
