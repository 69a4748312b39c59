/* Halide's OpenCL entry points, served by the shim's OpenCL backend (shim/backends/opencl.py).
 *
 * Python owns the OpenCL context, the allocations and the compiled programs (pyopencl).
 * Kernel launches, the call every GPU stage makes, stay in C: they look up the kernel, set
 * its arguments and enqueue it through the same ICD loader pyopencl uses, without Python and
 * without a global lock. Halide's runtime instead creates and releases a kernel object on
 * every launch; here kernel objects are kept in a small pool per entry point, and a thread
 * has one to itself while it sets arguments (clSetKernelArg is not thread-safe on one kernel).
 *
 * A device handle is a pointer to a shim_cl_handle, whose first two fields are Halide's
 * {uint64 offset; cl_mem mem}: native code written against Halide's headers reads it as
 * before. launch_mem is what a kernel receives for the buffer: the allocation itself, or a
 * sub-buffer at the crop's offset. Sub-buffers need offsets aligned to the device's base
 * address alignment (128 bytes on PoCL); a crop at any other offset has no launch_mem, and
 * launches that use it take the Python path, which stages the crop in an aligned buffer.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef void *cl_kernel;
typedef void *cl_mem;
typedef void *cl_program;
typedef void *cl_command_queue;
typedef void *cl_context;
typedef void *cl_event;

static struct {
    cl_int (*set_kernel_arg)(cl_kernel, cl_uint, size_t, const void *);
    cl_int (*enqueue_nd_range_kernel)(cl_command_queue, cl_kernel, cl_uint, const size_t *,
                                      const size_t *, const size_t *, cl_uint, const cl_event *,
                                      cl_event *);
    cl_kernel (*create_kernel)(cl_program, const char *, cl_int *);
    cl_int (*release_kernel)(cl_kernel);
    cl_context context;
    cl_command_queue queue;
    pid_t process; /* where it was bound (fork.c) */
} cl;

/* --- binding to the backend ------------------------------------------------------------- */

int shim_opencl_bind(const char *loader, void *context, void *queue) {
    void *library = dlopen(loader, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) {
        library = dlopen(loader, RTLD_NOW);
    }
    if (library == NULL) {
        return -1;
    }
    cl.set_kernel_arg = dlsym(library, "clSetKernelArg");
    cl.enqueue_nd_range_kernel = dlsym(library, "clEnqueueNDRangeKernel");
    cl.create_kernel = dlsym(library, "clCreateKernel");
    cl.release_kernel = dlsym(library, "clReleaseKernel");
    if (!cl.set_kernel_arg || !cl.enqueue_nd_range_kernel || !cl.create_kernel ||
        !cl.release_kernel) {
        return -2;
    }
    cl.process = shim_bound_process();
    cl.context = context;
    __atomic_store_n(&cl.queue, queue, __ATOMIC_RELEASE);
    return 0;
}

/* --- programs and their kernels ---------------------------------------------------------- */

enum { POOL_SIZE = 8 };

typedef struct kernel_entry {
    struct kernel_entry *next;
    char *name;
    pthread_mutex_t lock; /* guards idle[]: held for a push or a pop, never across a call */
    cl_kernel idle[POOL_SIZE];
    int idle_count;
} kernel_entry;

struct shim_cl_module {
    cl_program program;
    kernel_entry *entries; /* prepended under `lock`, read without it */
    pthread_mutex_t lock;
};

shim_cl_module *shim_opencl_module_new(void *program) {
    shim_cl_module *module = calloc(1, sizeof *module);
    if (module != NULL) {
        module->program = program;
        pthread_mutex_init(&module->lock, NULL);
    }
    return module;
}

static kernel_entry *find_entry(shim_cl_module *module, const char *name) {
    for (kernel_entry *e = __atomic_load_n(&module->entries, __ATOMIC_ACQUIRE); e; e = e->next) {
        if (strcmp(e->name, name) == 0) {
            return e;
        }
    }
    return NULL;
}

static kernel_entry *entry_for(shim_cl_module *module, const char *name) {
    kernel_entry *entry = find_entry(module, name);
    if (entry != NULL) {
        return entry;
    }
    pthread_mutex_lock(&module->lock);
    entry = find_entry(module, name);
    if (entry == NULL && (entry = calloc(1, sizeof *entry)) != NULL) {
        entry->name = strdup(name);
        pthread_mutex_init(&entry->lock, NULL);
        entry->next = module->entries;
        __atomic_store_n(&module->entries, entry, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&module->lock);
    return entry;
}

static cl_kernel take_kernel(shim_cl_module *module, kernel_entry *entry, cl_int *error) {
    cl_kernel kernel = NULL;
    pthread_mutex_lock(&entry->lock);
    if (entry->idle_count > 0) {
        kernel = entry->idle[--entry->idle_count];
    }
    pthread_mutex_unlock(&entry->lock);
    *error = 0;
    return kernel ? kernel : cl.create_kernel(module->program, entry->name, error);
}

static void give_kernel(kernel_entry *entry, cl_kernel kernel) {
    pthread_mutex_lock(&entry->lock);
    if (entry->idle_count < POOL_SIZE) {
        entry->idle[entry->idle_count++] = kernel;
        kernel = NULL;
    }
    pthread_mutex_unlock(&entry->lock);
    if (kernel != NULL) {
        cl.release_kernel(kernel);
    }
}

/* --- Halide's entry points ---------------------------------------------------------------- */

const struct halide_device_interface_t *halide_opencl_device_interface(void) {
    return shim_backend_interface(SHIM_BACKEND_OPENCL);
}

int halide_opencl_initialize_kernels(void *user_context, void **state_ptr, const char *src,
                                     int size) {
    int refused = shim_refuse_after_fork(user_context, cl.process, "OpenCL");
    if (refused) {
        return refused;
    }
    /* Every pipeline call starts here; after the first, the module is already compiled. */
    if (__atomic_load_n(state_ptr, __ATOMIC_ACQUIRE) != NULL) {
        return halide_error_code_success;
    }
    return shim_py_opencl_initialize(user_context, state_ptr, src, size);
}

void halide_opencl_finalize_kernels(void *user_context, void *state_ptr) {
    /* Programs stay compiled for the life of the process, shared by every module with the
     * same source. */
    (void)user_context;
    (void)state_ptr;
}

static int launch_failed(void *user_context, const char *what, const char *entry, int code) {
    char msg[256];
    snprintf(msg, sizeof msg, "OpenCL: %s failed for kernel %s: error %d\n", what, entry, code);
    halide_error(user_context, msg);
    return halide_error_code_gpu_device_error;
}

static int launch(SHIM_RUN_PARAMS) {
    shim_cl_module *module = state_ptr;
    const struct halide_device_interface_t *opencl = halide_opencl_device_interface();
    cl_command_queue queue = __atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE);
    if (module == NULL || queue == NULL) {
        halide_error(user_context, "OpenCL: kernel launched before its module was initialized\n");
        return halide_error_code_gpu_device_error;
    }
    int count = 0;
    bool staged = false;
    for (; arg_sizes[count] != 0; count++) {
        if (arg_is_buffer[count]) {
            const halide_buffer_t *buf = args[count];
            if (buf->device == 0 || buf->device_interface != opencl) {
                halide_error(user_context, "OpenCL: a kernel argument is not on the OpenCL device\n");
                return halide_error_code_gpu_device_error;
            }
            staged |= ((const shim_cl_handle *)buf->device)->launch_mem == NULL;
        }
    }
    if (staged) {
        return shim_py_opencl_run(user_context, state_ptr, entry_name, blocksX, blocksY, blocksZ,
                                  threadsX, threadsY, threadsZ, shared_mem_bytes, arg_sizes, args,
                                  arg_is_buffer);
    }
    kernel_entry *entry = entry_for(module, entry_name);
    if (entry == NULL) {
        return halide_error_out_of_memory(user_context);
    }
    cl_int error;
    cl_kernel kernel = take_kernel(module, entry, &error);
    if (kernel == NULL) {
        return launch_failed(user_context, "clCreateKernel", entry_name, error);
    }
    for (int i = 0; i < count && error == 0; i++) {
        if (arg_is_buffer[i]) {
            cl_mem mem = ((const shim_cl_handle *)((halide_buffer_t *)args[i])->device)->launch_mem;
            error = cl.set_kernel_arg(kernel, i, sizeof mem, &mem);
        } else {
            error = cl.set_kernel_arg(kernel, i, arg_sizes[i], args[i]);
        }
    }
    if (error == 0) {
        /* Halide's OpenCL kernels end with a __local argument for shared memory. */
        size_t local_bytes = shared_mem_bytes > 0 ? (size_t)shared_mem_bytes : 1;
        error = cl.set_kernel_arg(kernel, count, local_bytes, NULL);
    }
    if (error != 0) {
        give_kernel(entry, kernel);
        return launch_failed(user_context, "clSetKernelArg", entry_name, error);
    }
    size_t global[3] = {(size_t)blocksX * threadsX, (size_t)blocksY * threadsY,
                        (size_t)blocksZ * threadsZ};
    size_t local[3] = {(size_t)threadsX, (size_t)threadsY, (size_t)threadsZ};
    error = cl.enqueue_nd_range_kernel(queue, kernel, 3, NULL, global, local, 0, NULL, NULL);
    /* Arguments are captured at enqueue: the kernel object is free for the next launch. */
    give_kernel(entry, kernel);
    if (error != 0) {
        return launch_failed(user_context, "clEnqueueNDRangeKernel", entry_name, error);
    }
    return halide_error_code_success;
}

int halide_opencl_run(SHIM_RUN_PARAMS) {
    int refused = shim_refuse_after_fork(user_context, cl.process, "OpenCL");
    if (refused) {
        return refused;
    }
    if (shim_profile_on()) {
        return shim_profile_run(SHIM_BACKEND_OPENCL, __atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE),
                                launch, SHIM_RUN_ARGS);
    }
    return launch(SHIM_RUN_ARGS);
}

/* --- handles ------------------------------------------------------------------------------ */

int halide_opencl_wrap_cl_mem(void *user_context, struct halide_buffer_t *buf, uint64_t mem) {
    return halide_device_wrap_native(user_context, buf, mem, halide_opencl_device_interface());
}

int halide_opencl_detach_cl_mem(void *user_context, struct halide_buffer_t *buf) {
    int result = shim_check_native_handle(user_context, buf, SHIM_BACKEND_OPENCL,
                                          "halide_opencl_detach_cl_mem");
    if (result == SHIM_NO_NATIVE_HANDLE) {
        return halide_error_code_success; /* nothing attached: nothing to detach */
    }
    return result ? result : halide_device_detach_native(user_context, buf);
}

/* A shim OpenCL handle, or NULL (after halide_error where the buffer is another interface's). */
static const shim_cl_handle *handle_of(void *user_context, struct halide_buffer_t *buf,
                                       const char *routine) {
    int result = shim_check_native_handle(user_context, buf, SHIM_BACKEND_OPENCL, routine);
    return result ? NULL : (const shim_cl_handle *)shim_device_load(buf);
}

uintptr_t halide_opencl_get_cl_mem(void *user_context, struct halide_buffer_t *buf) {
    const shim_cl_handle *handle = handle_of(user_context, buf, "halide_opencl_get_cl_mem");
    return handle ? (uintptr_t)handle->mem : 0;
}

uint64_t halide_opencl_get_crop_offset(void *user_context, struct halide_buffer_t *buf) {
    const shim_cl_handle *handle = handle_of(user_context, buf, "halide_opencl_get_crop_offset");
    return handle ? handle->offset : 0;
}

/* --- what a pipeline's bundled runtime would otherwise run ----------------------------------
 *
 * A .so with Halide's runtime bundled registers halide_opencl_cleanup as a destructor, which
 * calls halide_opencl_device_release when the library unloads at exit, after Python is gone.
 * Both resolve to these definitions, since the shim's library comes first: the device state
 * is the shim's, released by Python at exit (shim/devices.py), so there is nothing to do. */

int halide_opencl_device_release(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}

void halide_opencl_cleanup(void) {
}

/* Halide's device preferences, set before the device is created; shim/backends/opencl.py
 * reads them after its own arguments and environment variables. */
static char *preferences[3];

static void set_preference(int which, const char *value) {
    char *copy = value ? strdup(value) : NULL;
    char *old = __atomic_exchange_n(&preferences[which], copy, __ATOMIC_ACQ_REL);
    (void)old; /* may still be read by a getter's caller: kept, as Halide keeps its own */
}

void halide_opencl_set_platform_name(const char *n) {
    set_preference(0, n);
}
const char *halide_opencl_get_platform_name(void *user_context) {
    (void)user_context;
    return __atomic_load_n(&preferences[0], __ATOMIC_ACQUIRE);
}
void halide_opencl_set_device_type(const char *n) {
    set_preference(1, n);
}
const char *halide_opencl_get_device_type(void *user_context) {
    (void)user_context;
    return __atomic_load_n(&preferences[1], __ATOMIC_ACQUIRE);
}
void halide_opencl_set_build_options(const char *n) {
    set_preference(2, n);
}
const char *halide_opencl_get_build_options(void *user_context) {
    (void)user_context;
    return __atomic_load_n(&preferences[2], __ATOMIC_ACQUIRE);
}

/* --- the context hooks Halide's headers name ----------------------------------------------- */

int halide_acquire_cl_context(void *user_context, void **ctx, void **queue, bool create) {
    int refused = shim_refuse_after_fork(user_context, cl.process, "OpenCL");
    if (refused) {
        return refused;
    }
    if (__atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE) == NULL) {
        if (!create) {
            *ctx = NULL;
            *queue = NULL;
            return halide_error_code_success;
        }
        int result = shim_py_opencl_start(user_context);
        if (result) {
            return result;
        }
    }
    *ctx = cl.context;
    *queue = cl.queue;
    return halide_error_code_success;
}

int halide_release_cl_context(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}
