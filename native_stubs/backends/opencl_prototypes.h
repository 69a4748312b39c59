/* What a kernel's prototype in a pipeline's OpenCL source says about its parameters
 * (opencl_prototypes.c), for the launches in opencl.c. Nothing outside native_stubs/backends/
 * (and fuzz/c/opencl_prototypes.c) includes this. */
#ifndef SHIM_BACKENDS_OPENCL_PROTOTYPES_H
#define SHIM_BACKENDS_OPENCL_PROTOTYPES_H

#include <stdint.h>

/* The number of parameters of the kernel `name` as `source` (NUL-terminated) declares it
 * ("__kernel void NAME(...)"), -1 where it declares none; bit i of `*read_only` for each of
 * the first 64 that the kernel cannot write through: a pointer to const or __constant data, or
 * an image taken __read_only. */
int shim_cl_kernel_params(const char *source, const char *name, uint64_t *read_only);

#endif
