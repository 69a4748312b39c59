/* The extern stage on OpenCL for flv_cl_extern (generators.py): linked only into libraries
 * built for OpenCL, whose runtime defines Halide's OpenCL entry points.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "HalideRuntime.h"
#include "HalideRuntimeOpenCL.h"

static bool is_query(const halide_buffer_t *b) {
    return b->host == NULL && b->device == 0;
}

/* --- an extern stage on OpenCL ------------------------------------------------------------ */

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef void *cl_object;

static struct {
    cl_object (*create_program)(cl_object, cl_uint, const char **, const size_t *, cl_int *);
    cl_int (*build_program)(cl_object, cl_uint, const void *, const char *, void *, void *);
    cl_int (*context_info)(cl_object, cl_uint, size_t, void *, size_t *);
    cl_object (*create_kernel)(cl_object, const char *, cl_int *);
    cl_int (*set_arg)(cl_object, cl_uint, size_t, const void *);
    cl_int (*enqueue)(cl_object, cl_object, cl_uint, const size_t *, const size_t *,
                      const size_t *, cl_uint, const void *, void *);
    cl_int (*release_kernel)(cl_object);
    cl_int (*release_program)(cl_object);
} cl;

/* The program, built once for the context the runtime hands out. */
static cl_object program, program_context;
static pthread_mutex_t program_lock = PTHREAD_MUTEX_INITIALIZER;
static int launches;

int halide_acquire_cl_context(void *user_context, void **ctx, void **queue, bool create);
int halide_release_cl_context(void *user_context);

/* Binds the OpenCL functions from the ICD loader at `loader`: the one the runtime uses. */
int flv_cl_use(const char *loader) {
    void *library = dlopen(loader, RTLD_NOW);
    if (library == NULL) {
        return -1;
    }
    cl.create_program = dlsym(library, "clCreateProgramWithSource");
    cl.build_program = dlsym(library, "clBuildProgram");
    cl.context_info = dlsym(library, "clGetContextInfo");
    cl.create_kernel = dlsym(library, "clCreateKernel");
    cl.set_arg = dlsym(library, "clSetKernelArg");
    cl.enqueue = dlsym(library, "clEnqueueNDRangeKernel");
    cl.release_kernel = dlsym(library, "clReleaseKernel");
    cl.release_program = dlsym(library, "clReleaseProgram");
    return cl.release_program == NULL ? -2 : 0;
}

int flv_cl_launches(void) {
    return __atomic_load_n(&launches, __ATOMIC_RELAXED);
}

static const char *SOURCE =
    "__kernel void flv_affine(__global const int *in, ulong in_at, __global int *out,\n"
    "                         ulong out_at) {\n"
    "    size_t i = get_global_id(0);\n"
    "    out[out_at + i] = in[in_at + i] * 3 + 7;\n"
    "}\n";

static int fail(void *user_context, const char *what, cl_int error) {
    char message[128];
    snprintf(message, sizeof message, "flv_cl_affine: %s failed (%d)\n", what, error);
    halide_error(user_context, message);
    return -1;
}

static cl_object program_for(cl_object context, cl_int *error) {
    pthread_mutex_lock(&program_lock);
    if (program == NULL || program_context != context) {
        if (program != NULL) {
            cl.release_program(program);
        }
        program = cl.create_program(context, 1, &SOURCE, NULL, error);
        if (*error == 0) {
            cl_object devices[8];
            size_t size = 0;
            *error = cl.context_info(context, 0x1081 /* CL_CONTEXT_DEVICES */, sizeof devices,
                                     devices, &size);
            if (*error == 0) {
                *error = cl.build_program(program, (cl_uint)(size / sizeof devices[0]), devices,
                                          NULL, NULL, NULL);
            }
        }
        program_context = *error == 0 ? context : NULL;
        if (*error != 0 && program != NULL) {
            cl.release_program(program);
            program = NULL;
        }
    }
    cl_object result = program;
    pthread_mutex_unlock(&program_lock);
    return result;
}

/* out = in * 3 + 7 on the device, as an OpenCL kernel of its own on the runtime's context and
 * queue. Takes its input to the device itself; returns with the kernel queued (Halide orders
 * later work on the same queue). */
int flv_cl_affine(halide_buffer_t *in, halide_buffer_t *out) {
    if (is_query(in)) {
        in->dim[0].min = out->dim[0].min;
        in->dim[0].extent = out->dim[0].extent;
        return 0;
    }
    if (out->device == 0) {
        return fail(NULL, "an output with device memory", -1);
    }
    int result = halide_copy_to_device(NULL, in, halide_opencl_device_interface());
    if (result != 0) {
        return result;
    }
    void *context = NULL, *queue = NULL;
    result = halide_acquire_cl_context(NULL, &context, &queue, true);
    if (result != 0) {
        return result;
    }
    cl_int error = 0;
    cl_object built = program_for(context, &error);
    cl_object kernel = built == NULL ? NULL : cl.create_kernel(built, "flv_affine", &error);
    if (kernel == NULL) {
        halide_release_cl_context(NULL);
        return fail(NULL, "building the kernel", error);
    }
    void *in_mem = (void *)halide_opencl_get_cl_mem(NULL, in);
    void *out_mem = (void *)halide_opencl_get_cl_mem(NULL, out);
    uint64_t in_at = halide_opencl_get_crop_offset(NULL, in) / sizeof(int32_t);
    uint64_t out_at = halide_opencl_get_crop_offset(NULL, out) / sizeof(int32_t);
    /* (in may start before out: it covers what the bounds query asked, out's region) */
    in_at += (uint64_t)(out->dim[0].min - in->dim[0].min);
    error = cl.set_arg(kernel, 0, sizeof in_mem, &in_mem);
    error = error ? error : cl.set_arg(kernel, 1, sizeof in_at, &in_at);
    error = error ? error : cl.set_arg(kernel, 2, sizeof out_mem, &out_mem);
    error = error ? error : cl.set_arg(kernel, 3, sizeof out_at, &out_at);
    size_t global = (size_t)out->dim[0].extent;
    error = error ? error : cl.enqueue(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL);
    cl.release_kernel(kernel);
    halide_release_cl_context(NULL);
    if (error != 0) {
        return fail(NULL, "enqueueing the kernel", error);
    }
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    return 0;
}
