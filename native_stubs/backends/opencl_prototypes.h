/* What a kernel's prototype and body in a pipeline's OpenCL source say about its parameters,
 * and the source rewritten so that buffers get an offset (opencl_prototypes.c), for the
 * launches in opencl.c and the backend's compiles (shim/backends/opencl.py, through
 * shim_opencl_rewrite_source). Nothing outside native_stubs/backends/ (and
 * fuzz/c/opencl_prototypes.c) includes this. */
#ifndef SHIM_BACKENDS_OPENCL_PROTOTYPES_H
#define SHIM_BACKENDS_OPENCL_PROTOTYPES_H

#include <stddef.h>
#include <stdint.h>

enum { SHIM_CL_MASKED_PARAMS = 64 };

typedef struct {
    int params; /* in its prototype; -1 where the source declares no such kernel */
    /* Bit i, of the first 64: a pointer to const or __constant data, or an image taken
     * __read_only (the kernel cannot write through it). */
    uint64_t read_only;
    /* Bit i: a buffer the rewritten source (shim_cl_rewrite_offsets) takes at an element offset,
     * in a ulong parameter after the original ones, in the order of i. */
    uint64_t offset;
    uint8_t element_size[SHIM_CL_MASKED_PARAMS]; /* bytes, of each parameter in `offset` */
} shim_cl_prototype;

/* The kernel `name` as `source` (NUL-terminated) declares it ("__kernel void NAME(...)"). */
void shim_cl_kernel_prototype(const char *source, const char *name, shim_cl_prototype *out);

/* `source` (NUL-terminated) with each buffer parameter of each kernel that can take an offset
 * (see `offset` above) renamed, a ulong offset parameter per such buffer appended, and the
 * original name declared at the kernel's entry as the renamed pointer plus its offset.
 * malloc'd and NUL-terminated, its length in *size; NULL if out of memory. */
char *shim_cl_rewrite_offsets(const char *source, size_t *size);

#endif
