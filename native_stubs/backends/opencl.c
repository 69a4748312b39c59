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
 * address alignment (128 bytes on PoCL); a crop at any other offset has no launch_mem. The
 * programs are built from Halide's source rewritten to take an element offset per buffer
 * (opencl_prototypes.c): such a crop is given to a kernel as its allocation and its offset,
 * unless the kernel's use of that buffer may assume more alignment than an element's; then
 * launches stage the crop (see "staging" below), here too.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "devices/device_generic.h"
#include "devices/element_layout.h"
#include "devices/served.h"
#include "backends/opencl_prototypes.h"
#include "forks/fork.h"
#include "profiling/profile.h"

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef void *cl_kernel;
typedef void *cl_mem;
typedef void *cl_program;
typedef void *cl_command_queue;
typedef void *cl_context;
typedef void *cl_event;
typedef uint64_t cl_mem_flags;
typedef struct {
    cl_uint image_channel_order;
    cl_uint image_channel_data_type;
} cl_image_format;
typedef struct {
    cl_uint image_type;
    size_t image_width, image_height, image_depth, image_array_size;
    size_t image_row_pitch, image_slice_pitch;
    cl_uint num_mip_levels, num_samples;
    cl_mem buffer;
} cl_image_desc;

#define CL_MEM_READ_WRITE ((cl_mem_flags)1)
#define CL_BUFFER_CREATE_TYPE_REGION 0x1220
#define CL_OUT_OF_RESOURCES (-5)
#define CL_OUT_OF_HOST_MEMORY (-6)
#define CL_INVALID_VALUE (-30)
#define CL_INVALID_OPERATION (-59)
#define CL_IMAGE_FORMAT 0x1110
#define CL_IMAGE_ELEMENT_SIZE 0x1111
#define CL_IMAGE_WIDTH 0x1114
#define CL_IMAGE_HEIGHT 0x1115
#define CL_MEM_OBJECT_IMAGE2D 0x10F1
#define CL_MEM_OBJECT_IMAGE3D 0x10F2
#define CL_MEM_OBJECT_IMAGE1D 0x10F4

static struct {
    cl_int (*set_kernel_arg)(cl_kernel, cl_uint, size_t, const void *);
    cl_int (*enqueue_nd_range_kernel)(cl_command_queue, cl_kernel, cl_uint, const size_t *,
                                      const size_t *, const size_t *, cl_uint, const cl_event *,
                                      cl_event *);
    cl_kernel (*create_kernel)(cl_program, const char *, cl_int *);
    cl_int (*release_kernel)(cl_kernel);
    cl_mem (*create_buffer)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
    /* Optional: without it (an OpenCL 1.0 loader) crops at aligned offsets stay with the
     * Python backend. */
    cl_mem (*create_sub_buffer)(cl_mem, cl_mem_flags, cl_uint, const void *, cl_int *);
    cl_int (*release_mem_object)(cl_mem);
    cl_int (*retain_mem_object)(cl_mem);
    cl_int (*enqueue_write_buffer)(cl_command_queue, cl_mem, cl_uint, size_t, size_t, const void *,
                                   cl_uint, const cl_event *, cl_event *);
    cl_int (*enqueue_read_buffer)(cl_command_queue, cl_mem, cl_uint, size_t, size_t, void *,
                                  cl_uint, const cl_event *, cl_event *);
    cl_int (*enqueue_copy_buffer)(cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint,
                                  const cl_event *, cl_event *);
    cl_int (*enqueue_copy_buffer_rect)(cl_command_queue, cl_mem, cl_mem, const size_t *,
                                       const size_t *, const size_t *, size_t, size_t, size_t,
                                       size_t, cl_uint, const cl_event *, cl_event *);
    cl_int (*finish)(cl_command_queue);
    /* Images (halide_opencl_image_device_interface): optional, since only image launches need
     * them; an OpenCL 1.1 loader lacks clCreateImage. */
    cl_mem (*create_image)(cl_context, cl_mem_flags, const cl_image_format *,
                           const cl_image_desc *, void *, cl_int *);
    cl_int (*enqueue_copy_image)(cl_command_queue, cl_mem, cl_mem, const size_t *, const size_t *,
                                 const size_t *, cl_uint, const cl_event *, cl_event *);
    cl_int (*get_image_info)(cl_mem, cl_uint, size_t, void *, size_t *);
    cl_context context;
    cl_command_queue queue;
    pid_t process; /* where it was bound (forks/fork.c) */
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
    cl.create_buffer = dlsym(library, "clCreateBuffer");
    cl.create_sub_buffer = dlsym(library, "clCreateSubBuffer");
    cl.release_mem_object = dlsym(library, "clReleaseMemObject");
    cl.retain_mem_object = dlsym(library, "clRetainMemObject");
    cl.enqueue_write_buffer = dlsym(library, "clEnqueueWriteBuffer");
    cl.enqueue_read_buffer = dlsym(library, "clEnqueueReadBuffer");
    cl.enqueue_copy_buffer = dlsym(library, "clEnqueueCopyBuffer");
    cl.enqueue_copy_buffer_rect = dlsym(library, "clEnqueueCopyBufferRect");
    cl.finish = dlsym(library, "clFinish");
    cl.create_image = dlsym(library, "clCreateImage");
    cl.enqueue_copy_image = dlsym(library, "clEnqueueCopyImage");
    cl.get_image_info = dlsym(library, "clGetImageInfo");
    if (!cl.set_kernel_arg || !cl.enqueue_nd_range_kernel || !cl.create_kernel ||
        !cl.release_kernel || !cl.create_buffer || !cl.release_mem_object || !cl.retain_mem_object ||
        !cl.enqueue_write_buffer || !cl.enqueue_read_buffer ||
        !cl.enqueue_copy_buffer || !cl.enqueue_copy_buffer_rect || !cl.finish) {
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
    shim_cl_prototype prototype; /* what it writes, which buffers take offsets */
} kernel_entry;

struct shim_cl_module {
    cl_program program;
    char *source; /* for the kernels' prototypes */
    kernel_entry *entries; /* prepended under `lock`, read without it */
    pthread_mutex_t lock;
};

shim_cl_module *shim_opencl_module_new(void *program, const char *source, size_t size) {
    shim_cl_module *module = calloc(1, sizeof *module);
    char *copy = malloc(size + 1);
    if (module == NULL || copy == NULL) {
        free(module);
        free(copy);
        return NULL;
    }
    memcpy(copy, source, size);
    copy[size] = 0;
    module->program = program;
    module->source = copy;
    pthread_mutex_init(&module->lock, NULL);
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

/* Called with the module's lock held. */
static kernel_entry *new_entry(shim_cl_module *module, const char *name) {
    kernel_entry *entry = calloc(1, sizeof *entry);
    if (entry == NULL || (entry->name = strdup(name)) == NULL) {
        free(entry);
        return NULL;
    }
    /* What it may write (a staged crop is copied back only then), which buffers take offsets. */
    shim_cl_kernel_prototype(module->source, name, &entry->prototype);
    pthread_mutex_init(&entry->lock, NULL);
    entry->next = module->entries;
    __atomic_store_n(&module->entries, entry, __ATOMIC_RELEASE);
    return entry;
}

static kernel_entry *entry_for(shim_cl_module *module, const char *name) {
    kernel_entry *entry = find_entry(module, name);
    if (entry != NULL) {
        return entry;
    }
    pthread_mutex_lock(&module->lock);
    entry = find_entry(module, name);
    if (entry == NULL) {
        entry = new_entry(module, name);
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

/* The source a program is built from: Halide's, each kernel's buffers given offsets where they
 * can take them (opencl_prototypes.c); what follows a NUL in it is kept as it was. */
char *shim_opencl_program_source(const char *source, size_t size, size_t *out_size) {
    char *text = malloc(size + 1);
    if (text == NULL) {
        return NULL;
    }
    memcpy(text, source, size);
    text[size] = 0;
    size_t head = strlen(text), n = 0;
    char *rewritten = shim_cl_rewrite_offsets(text, &n);
    free(text);
    char *whole = rewritten ? realloc(rewritten, n + (size - head) + 1) : NULL;
    if (whole == NULL) {
        free(rewritten);
        return NULL;
    }
    memcpy(whole + n, source + head, size - head);
    whole[n + size - head] = 0;
    *out_size = n + size - head;
    return whole;
}

void shim_opencl_free_source(char *source) {
    free(source);
}

/* --- Halide's entry points ---------------------------------------------------------------- */

const struct halide_device_interface_t *halide_opencl_device_interface(void) {
    return shim_backend_interface(SHIM_BACKEND_OPENCL);
}

/* OpenCL image memory: the Python side is shim/backends/opencl_image.py; kernels take an
 * image where they take a buffer, so launches below serve both. */
const struct halide_device_interface_t *halide_opencl_image_device_interface(void) {
    return shim_backend_interface(SHIM_BACKEND_OPENCL_IMAGE);
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
    return shim_py_initialize_kernels(user_context, state_ptr, src, size,
                                      shim_backend_interface(SHIM_BACKEND_OPENCL));
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

/* --- staging: crops at offsets neither a sub-buffer nor the kernel's offset can take -------
 *
 * Halide indexes aligned vectors as arrays of vector types, so a kernel that does so for a
 * buffer cannot take it at an offset of a few elements (opencl_prototypes.c gives such a
 * parameter no offset), and a driver that allowed a misaligned sub-buffer would give it a
 * pointer it cannot use either. A crop such a parameter gets at a misaligned offset is staged
 * instead (and so are crops of images, which have no offsets): its bytes are copied into a buffer with the same
 * layout from offset 0, the kernel runs on that, and if the kernel may write the crop, the
 * crop's elements, only those, are copied back, all on the one in-order queue, so data around
 * the crop is never written.
 * The staging buffer stays in the crop's handle for its next launch: a launch takes it out
 * while it uses it (two threads launching with one crop at once get one each), and later
 * launches may take it at once, since their copies queue after this one's. */

struct shim_cl_staging {
    cl_mem mem;
    size_t size;
};

static void staging_free(shim_cl_staging *staging) {
    if (staging != NULL) {
        cl.release_mem_object(staging->mem); /* OpenCL keeps it until the queued copies ran */
        free(staging);
    }
}

/* The handle's staging buffer if it holds `size` bytes, else a new one (NULL: see *error). */
static shim_cl_staging *staging_take(shim_cl_handle *handle, size_t size, cl_int *error) {
    shim_cl_staging *staging = __atomic_exchange_n(&handle->staging, NULL, __ATOMIC_ACQ_REL);
    if (staging != NULL && staging->size >= size) {
        return staging;
    }
    staging_free(staging);
    staging = malloc(sizeof *staging);
    if (staging == NULL) {
        *error = CL_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    staging->size = size;
    staging->mem = cl.create_buffer(cl.context, CL_MEM_READ_WRITE, size, NULL, error);
    if (staging->mem == NULL) {
        *error = *error ? *error : CL_OUT_OF_RESOURCES;
        free(staging);
        return NULL;
    }
    return staging;
}

/* Back into the handle, unless another launch put one there meanwhile. */
static void staging_give(shim_cl_handle *handle, shim_cl_staging *staging) {
    shim_cl_staging *empty = NULL;
    if (!__atomic_compare_exchange_n(&handle->staging, &empty, staging, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED)) {
        staging_free(staging);
    }
}

void shim_opencl_handle_release(shim_cl_handle *handle) {
    shim_cl_staging *staging = __atomic_exchange_n(&handle->staging, NULL, __ATOMIC_ACQ_REL);
    bool forked = cl.process != shim_bound_process();
    if (staging != NULL && forked) {
        free(staging); /* a forked child must not call the driver: the cl_mem is the parent's */
    } else {
        staging_free(staging);
    }
    if (handle->native_made) {
        /* A crop's sub-buffer made here (make_crop_handle); the Python backend's are
         * pyopencl's, released with their handles there. */
        if (handle->launch_mem != NULL && handle->launch_mem != handle->mem && !forked) {
            cl.release_mem_object(handle->launch_mem);
        }
        free(handle);
    }
}

/* --- served allocations (devices/served.c) ------------------------------------------------ */

static bool driver_usable(void) {
    return __atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE) != NULL &&
           cl.process == shim_bound_process();
}

static uint64_t create_allocation(uint64_t size) {
    cl_int error = 0;
    cl_mem mem = cl.create_buffer(cl.context, CL_MEM_READ_WRITE, size ? size : 1, NULL, &error);
    return error == 0 ? (uint64_t)(uintptr_t)mem : 0;
}

void shim_opencl_retain(uint64_t mem) {
    cl.retain_mem_object((cl_mem)(uintptr_t)mem);
}

void shim_opencl_release(uint64_t mem) {
    cl.release_mem_object((cl_mem)(uintptr_t)mem);
}

/* A handle at the start of the allocation, as the Python backend's handle() makes for offset 0
 * (shim/backends/opencl.py): the kernels get the allocation itself. */
static uint64_t make_served_handle(uint64_t native, uint64_t nbytes, uint64_t capacity) {
    shim_cl_handle *handle = calloc(1, sizeof *handle);
    if (handle == NULL) {
        return 0;
    }
    handle->mem = handle->launch_mem = (cl_mem)(uintptr_t)native;
    handle->native_made = 1;
    handle->nbytes = nbytes;
    handle->capacity = capacity;
    shim_served_mark(&handle->served);
    return (uint64_t)(uintptr_t)handle;
}

static bool claim_served(uint64_t value, uint64_t *native, uint64_t *nbytes, uint64_t *capacity) {
    shim_cl_handle *handle = (shim_cl_handle *)(uintptr_t)value;
    if (!shim_served_take(&handle->served)) {
        return false;
    }
    *native = (uint64_t)(uintptr_t)handle->mem;
    *nbytes = handle->nbytes;
    *capacity = handle->capacity;
    return true;
}

static void release_served_handle(uint64_t handle) {
    shim_opencl_handle_release((shim_cl_handle *)(uintptr_t)handle);
}

static bool served_native(uint64_t value, uint64_t *native, uint64_t *nbytes) {
    const shim_cl_handle *handle = (const shim_cl_handle *)(uintptr_t)value;
    if (!shim_served_marked(&handle->served)) {
        return false;
    }
    *native = (uint64_t)(uintptr_t)handle->mem;
    *nbytes = handle->nbytes;
    return true;
}

/* Complete when they return, on the shim's one in-order queue, as the Python backend's write
 * and read: the bytes are where they go (shim/backends/base.py's contract). Enqueued without
 * blocking, then clFinish, as Halide's runtime copies: PoCL's blocking transfer waits on an
 * event of its own, which costs it tens of microseconds more per copy. */
static int write_allocation(uint64_t native, uint64_t offset, const void *host, uint64_t nbytes) {
    cl_command_queue queue = __atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE);
    cl_int err = cl.enqueue_write_buffer(queue, (cl_mem)(uintptr_t)native, 0, offset, nbytes,
                                         host, 0, NULL, NULL);
    cl_int finished = cl.finish(queue);
    return err != 0 ? err : finished;
}

static int read_allocation(uint64_t native, uint64_t offset, void *host, uint64_t nbytes) {
    cl_command_queue queue = __atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE);
    cl_int err = cl.enqueue_read_buffer(queue, (cl_mem)(uintptr_t)native, 0, offset, nbytes,
                                        host, 0, NULL, NULL);
    cl_int finished = cl.finish(queue);
    return err != 0 ? err : finished;
}

static int copy_allocation(uint64_t src, uint64_t src_offset, uint64_t dst, uint64_t dst_offset,
                           uint64_t nbytes) {
    cl_command_queue queue = __atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE);
    cl_int err = cl.enqueue_copy_buffer(queue, (cl_mem)(uintptr_t)src, (cl_mem)(uintptr_t)dst,
                                        src_offset, dst_offset, nbytes, 0, NULL, NULL);
    cl_int finished = cl.finish(queue);
    return err != 0 ? err : finished;
}

int shim_opencl_transfer(int direction, uint64_t mem, uint64_t offset, void *host, uint64_t to,
                         uint64_t to_offset, uint64_t nbytes) {
    if (!driver_usable()) {
        return CL_INVALID_OPERATION;
    }
    switch (direction) {
    case 0:
        return write_allocation(mem, offset, host, nbytes);
    case 1:
        return read_allocation(mem, offset, host, nbytes);
    case 2:
        return copy_allocation(mem, offset, to, to_offset, nbytes);
    default:
        return CL_INVALID_VALUE;
    }
}

static bool locate_handle(uint64_t value, uint64_t *native, uint64_t *offset, uint64_t *nbytes) {
    const shim_cl_handle *handle = (const shim_cl_handle *)(uintptr_t)value;
    if (handle->image_dims != 0) {
        return false; /* (an image's: the image interface has no allocator) */
    }
    *native = (uint64_t)(uintptr_t)handle->mem;
    *offset = handle->offset;
    *nbytes = handle->nbytes;
    return true;
}

static shim_served_link *served_link(uint64_t handle) {
    return &((shim_cl_handle *)(uintptr_t)handle)->link;
}

static uint64_t alignment; /* the device's base address alignment in bytes; 0 until bound */

void shim_opencl_set_alignment(uint64_t bytes) {
    __atomic_store_n(&alignment, bytes, __ATOMIC_RELEASE);
}

/* A crop's handle as the Python backend's handle() makes it: at offset 0 the kernels get the
 * allocation itself; at a nonzero offset aligned to the device's base address alignment a
 * sub-buffer of the crop's span, which every kernel can take; at a misaligned offset no
 * launch_mem (the kernel's element offset binds it in place, or the launch stages it). */
static uint64_t make_crop_handle(uint64_t native, uint64_t offset, uint64_t nbytes) {
    uint64_t align = __atomic_load_n(&alignment, __ATOMIC_ACQUIRE);
    bool sub = offset != 0 && (align == 0 || offset % align == 0);
    if (sub && (align == 0 || cl.create_sub_buffer == NULL)) {
        return 0; /* (the Python backend, which knows the alignment, makes it) */
    }
    shim_cl_handle *handle = calloc(1, sizeof *handle);
    if (handle == NULL) {
        return 0;
    }
    handle->offset = offset;
    handle->mem = (cl_mem)(uintptr_t)native;
    handle->launch_mem = offset == 0 ? handle->mem : NULL;
    handle->native_made = 1;
    if (sub) {
        struct {
            size_t origin, size;
        } region = {(size_t)offset, (size_t)(nbytes ? nbytes : 1)};
        cl_int error = 0;
        handle->launch_mem = cl.create_sub_buffer(handle->mem, CL_MEM_READ_WRITE,
                                                  CL_BUFFER_CREATE_TYPE_REGION, &region, &error);
        if (error != 0 || handle->launch_mem == NULL) {
            free(handle); /* (out of the allocation's range: the Python core reports it) */
            return 0;
        }
    }
    return (uint64_t)(uintptr_t)handle;
}

static int sync_queue(void) {
    return cl.finish(__atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE));
}

static const shim_allocator allocator = {
    driver_usable, create_allocation, shim_opencl_release, make_served_handle, claim_served,
    release_served_handle, served_native, locate_handle, write_allocation, read_allocation,
    copy_allocation, served_link,
    make_crop_handle, sync_queue,
};

void shim_opencl_serve_allocations(shim_pool *pool) {
    shim_served_register(SHIM_BACKEND_OPENCL, &allocator, pool);
}

/* Copies of a staged crop's elements, only those: at each place the layout's outer dimensions
 * reach, a rectangle of rows (and slices) where OpenCL's pitch rules allow. */
typedef struct {
    cl_command_queue queue;
    cl_mem src, dst;
    size_t src_offset, dst_offset;
    size_t region[3], pitch[2];
    cl_int error;
} rect_copies;

static bool copy_rect(int64_t at, int64_t to, void *context) {
    (void)to; /* (the same layout on both sides) */
    rect_copies *c = context;
    size_t src_origin[3] = {c->src_offset + (size_t)at, 0, 0};
    size_t dst_origin[3] = {c->dst_offset + (size_t)at, 0, 0};
    c->error = cl.enqueue_copy_buffer_rect(c->queue, c->src, c->dst, src_origin, dst_origin,
                                           c->region, c->pitch[0], c->pitch[1], c->pitch[0],
                                           c->pitch[1], 0, NULL, NULL);
    return c->error == 0;
}

/* Copy the elements of a buffer laid out as `l`, only those, from `src` at src_offset to `dst`
 * at dst_offset: each run as one row, the next two dimensions as a rectangle's rows and slices
 * where OpenCL's pitch rules allow, a walk over the rest. */
static cl_int copy_elements(cl_command_queue queue, shim_layout *l, cl_mem src,
                            size_t src_offset, cl_mem dst, size_t dst_offset) {
    const shim_layout_dim *dims = l->dims;
    int n = l->count, d = 0;
    rect_copies c = {queue, src, dst, src_offset, dst_offset, {(size_t)l->run, 1, 1}, {0, 0}, 0};
    if (d < n && (size_t)dims[d].stride >= c.region[0]) {
        c.region[1] = (size_t)dims[d].extent;
        c.pitch[0] = (size_t)dims[d++].stride;
        if (d < n && (size_t)dims[d].stride >= c.region[1] * c.pitch[0] &&
            (size_t)dims[d].stride % c.pitch[0] == 0) {
            c.region[2] = (size_t)dims[d].extent;
            c.pitch[1] = (size_t)dims[d++].stride;
        }
    }
    shim_layout_walk(l, d, copy_rect, &c);
    return c.error;
}

typedef struct {
    shim_cl_handle *handle;
    shim_cl_staging *staging;
    shim_layout layout;
    bool written; /* given as a parameter the kernel may write through */
    /* A crop of an image: its own image, where the crop is in the parent image. */
    cl_mem image;
    size_t origin[3], region[3];
} staged_buffer;

static staged_buffer *staged_for(staged_buffer *staged, int staged_count,
                                 const shim_cl_handle *handle) {
    for (int s = 0; s < staged_count; s++) {
        if (staged[s].handle == handle) {
            return &staged[s];
        }
    }
    return NULL;
}

/* Whether the kernel may write through its parameter `i` of `count` (unless its prototype,
 * with the __local parameter Halide adds, says otherwise). */
static bool may_write(const kernel_entry *entry, int count, int i) {
    const shim_cl_prototype *p = &entry->prototype;
    bool read_only = p->params == count + 1 && i < 64 && (p->read_only >> i & 1);
    return !read_only;
}

/* Whether the kernel takes its parameter `i` of `count` at an element offset that `buf`'s
 * crop can be given as: the rewritten program's (opencl_prototypes.c), of the buffer's own
 * element size, which the crop's offset is a multiple of. */
static bool takes_offset(const kernel_entry *entry, int count, int i, const halide_buffer_t *buf) {
    const shim_cl_prototype *p = &entry->prototype;
    const shim_cl_handle *handle = (const shim_cl_handle *)buf->device;
    size_t element = (size_t)(buf->type.bits + 7) / 8 * buf->type.lanes;
    return p->params == count + 1 && i < SHIM_CL_MASKED_PARAMS && (p->offset >> i & 1) &&
           handle->image_dims == 0 && element == p->element_size[i] &&
           handle->offset % element == 0;
}

/* The first step of a launch that failed: the OpenCL call and its error. */
typedef struct {
    const char *what;
    cl_int code;
} launch_error;

static bool failed(launch_error *error, const char *what, cl_int code) {
    if (code != 0 && error->code == 0) {
        *error = (launch_error){what, code};
    }
    return code != 0;
}

/* --- staging crops of images ---------------------------------------------------------------
 *
 * A kernel reads an image at coordinates relative to the buffer's min, and OpenCL has no
 * sub-images: a crop or slice of an image other than the image itself gets an image of its own
 * extents around each launch, copied from where the crop is in the parent image and, if the
 * kernel may write it, back, on the one in-order queue (only the crop's pixels). Its
 * dimensions must follow the image's axes in order (x, then y, then z: a slice of z, or a crop
 * of any box); Halide's runtime refuses every crop of an image that is not the whole image. */

static bool image_info(cl_mem image, cl_uint what, size_t *value) {
    *value = 0;
    return cl.get_image_info(image, what, sizeof *value, value, NULL) == 0;
}

static bool stage_image_in(cl_command_queue queue, const halide_buffer_t *buf,
                           staged_buffer *staged, launch_error *error) {
    const shim_cl_handle *handle = staged->handle;
    if (cl.create_image == NULL || cl.enqueue_copy_image == NULL || cl.get_image_info == NULL) {
        failed(error, "staging a crop of an image (the OpenCL loader has no clCreateImage)",
               CL_INVALID_OPERATION);
        return false;
    }
    cl_image_format format;
    size_t elem, width, height;
    if (cl.get_image_info(handle->mem, CL_IMAGE_FORMAT, sizeof format, &format, NULL) != 0 ||
        !image_info(handle->mem, CL_IMAGE_ELEMENT_SIZE, &elem) ||
        !image_info(handle->mem, CL_IMAGE_WIDTH, &width) ||
        !image_info(handle->mem, CL_IMAGE_HEIGHT, &height) || elem == 0 || width == 0) {
        failed(error, "clGetImageInfo (staging a crop of an image)", CL_INVALID_VALUE);
        return false;
    }
    height = height ? height : 1;
    uint64_t first = handle->offset / elem;
    staged->origin[0] = first % width;
    staged->origin[1] = first / width % height;
    staged->origin[2] = first / (width * height);
    const int64_t axis_strides[3] = {1, (int64_t)width, (int64_t)(width * height)};
    int dims = buf->dimensions;
    for (int d = 0; d < 3; d++) {
        staged->region[d] = d < dims ? (size_t)buf->dim[d].extent : 1;
    }
    bool in_order = dims >= 1 && dims <= 3 && handle->offset % elem == 0;
    for (int d = 0; in_order && d < dims; d++) {
        in_order = buf->dim[d].extent == 1 || buf->dim[d].stride == axis_strides[d];
    }
    if (!in_order) {
        failed(error, "staging a crop of an image whose dimensions are not the image's x, y, z "
                      "in order", CL_INVALID_VALUE);
        return false;
    }
    static const cl_uint types[] = {0, CL_MEM_OBJECT_IMAGE1D, CL_MEM_OBJECT_IMAGE2D,
                                    CL_MEM_OBJECT_IMAGE3D};
    cl_image_desc desc = {types[dims], staged->region[0], staged->region[1], staged->region[2],
                          1, 0, 0, 0, 0, NULL};
    cl_int code = 0;
    staged->image = cl.create_image(cl.context, CL_MEM_READ_WRITE, &format, &desc, NULL, &code);
    if (staged->image == NULL) {
        failed(error, "clCreateImage (staging a crop of an image)",
               code ? code : CL_OUT_OF_RESOURCES);
        return false;
    }
    const size_t zero[3] = {0, 0, 0};
    code = cl.enqueue_copy_image(queue, handle->mem, staged->image, staged->origin, zero,
                                 staged->region, 0, NULL, NULL);
    return !failed(error, "clEnqueueCopyImage (staging a crop of an image)", code);
}

/* Whether the buffer is laid out as an image is, x then y then z, dense (dimensions of
 * extent 1 aside): at the image's offset 0, with its dimensions, it is the image's own start
 * (a transposed view is not, though it may start there too). */
static bool dense_from_x(const halide_buffer_t *buf) {
    int64_t expected = 1;
    for (int d = 0; d < buf->dimensions; d++) {
        if (buf->dim[d].extent != 1 && buf->dim[d].stride != expected) {
            return false;
        }
        expected *= buf->dim[d].extent;
    }
    return true;
}

/* Whether a launch gives the kernel the buffer's own memory (else it stages it). */
static bool launched_directly(const halide_buffer_t *buf) {
    const shim_cl_handle *handle = (const shim_cl_handle *)buf->device;
    return handle->launch_mem != NULL &&
           (handle->image_dims == 0 ||
            (handle->image_dims == (uint32_t)buf->dimensions && dense_from_x(buf)));
}

/* Stage one misaligned crop: its bytes, gaps included, into a staging buffer. */
static bool stage_in(cl_command_queue queue, const halide_buffer_t *buf, staged_buffer *staged,
                     launch_error *error) {
    if (staged->handle->image_dims) {
        return stage_image_in(queue, buf, staged, error);
    }
    shim_layout_outcome made = shim_layout_of(buf, &staged->layout);
    if (made != SHIM_LAYOUT_MADE) {
        failed(error, made == SHIM_LAYOUT_NEGATIVE ? "staging a crop with a negative stride"
                                                   : "staging a crop (its layout)",
               made == SHIM_LAYOUT_NEGATIVE ? CL_INVALID_VALUE : CL_OUT_OF_HOST_MEMORY);
        return false;
    }
    size_t span = (size_t)staged->layout.span;
    cl_int code = 0;
    staged->staging = staging_take(staged->handle, span ? span : 1, &code);
    if (staged->staging == NULL) {
        failed(error, "clCreateBuffer (staging a misaligned crop)", code);
        return false;
    }
    if (span > 0) {
        code = cl.enqueue_copy_buffer(queue, staged->handle->mem, staged->staging->mem,
                                      staged->handle->offset, 0, span, 0, NULL, NULL);
    }
    return !failed(error, "clEnqueueCopyBuffer (staging a misaligned crop)", code);
}

/* Stage every crop among the arguments that a parameter can take neither directly nor at an
 * offset, each once: a crop given twice must be one buffer to the kernel, so every parameter
 * given a staged crop gets its staging buffer. */
static bool stage_all(cl_command_queue queue, const kernel_entry *entry, int count, void *args[],
                      int8_t arg_is_buffer[], staged_buffer *staged, int *staged_count,
                      launch_error *error) {
    for (int i = 0; i < count; i++) {
        const halide_buffer_t *buf = args[i];
        shim_cl_handle *handle = arg_is_buffer[i] ? (shim_cl_handle *)buf->device : NULL;
        if (handle == NULL || launched_directly(buf) || takes_offset(entry, count, i, buf) ||
            staged_for(staged, *staged_count, handle) != NULL) {
            continue;
        }
        staged_buffer *b = &staged[(*staged_count)++];
        *b = (staged_buffer){.handle = handle};
        if (!stage_in(queue, buf, b, error)) {
            if (b->staging == NULL && b->image == NULL) { /* nothing to give back */
                shim_layout_free(&b->layout);
                (*staged_count)--;
            }
            return false;
        }
    }
    for (int i = 0; i < count; i++) {
        const halide_buffer_t *buf = args[i];
        staged_buffer *b = arg_is_buffer[i] ? staged_for(staged, *staged_count,
                                                         (shim_cl_handle *)buf->device)
                                            : NULL;
        if (b != NULL) {
            b->written |= may_write(entry, count, i);
        }
    }
    return true;
}

/* After the kernel (`ran`: it was enqueued): the elements of each staged crop it may have
 * written back into the crop, and each staging buffer back into its handle. */
static void unstage_all(cl_command_queue queue, staged_buffer *staged, int staged_count, bool ran,
                        launch_error *error) {
    for (int s = 0; s < staged_count; s++) {
        staged_buffer *b = &staged[s];
        if (b->image != NULL) {
            if (ran && b->written) {
                const size_t zero[3] = {0, 0, 0};
                cl_int code = cl.enqueue_copy_image(queue, b->image, b->handle->mem, zero,
                                                    b->origin, b->region, 0, NULL, NULL);
                failed(error, "clEnqueueCopyImage (a staged crop of an image's results)", code);
            }
            cl.release_mem_object(b->image); /* OpenCL keeps it until the queued copies ran */
            continue;
        }
        if (ran && b->written && b->layout.span > 0) {
            cl_int code = copy_elements(queue, &b->layout, b->staging->mem, 0, b->handle->mem,
                                        b->handle->offset);
            failed(error, "clEnqueueCopyBufferRect (a staged crop's results)", code);
        }
        shim_layout_free(&b->layout);
        staging_give(b->handle, b->staging);
    }
}

/* What the kernel gets for a buffer: its staging buffer or image where it is staged, else its
 * launch_mem, else its allocation, with *offset its offset in elements (else 0). */
static cl_mem kernel_mem(const halide_buffer_t *buf, staged_buffer *staged, int staged_count,
                         uint64_t *offset) {
    const shim_cl_handle *handle = (const shim_cl_handle *)buf->device;
    const staged_buffer *b = staged_for(staged, staged_count, handle);
    *offset = 0;
    if (b != NULL) {
        return b->image != NULL ? b->image : b->staging->mem;
    }
    if (launched_directly(buf)) {
        return handle->launch_mem;
    }
    *offset = handle->offset / ((size_t)(buf->type.bits + 7) / 8 * buf->type.lanes);
    return handle->mem;
}

/* The rewritten program's offset parameters (after the original ones and Halide's __local
 * one, in the order of the buffers), each the element offset of its buffer's argument. */
static cl_int set_offsets(cl_kernel kernel, const kernel_entry *entry, int count, void *args[],
                          int8_t arg_is_buffer[], staged_buffer *staged, int staged_count) {
    const shim_cl_prototype *p = &entry->prototype;
    if (p->offset == 0) {
        return 0;
    }
    if (p->params != count + 1) {
        return CL_INVALID_VALUE; /* (the prototype does not say which argument is which) */
    }
    cl_uint index = (cl_uint)p->params;
    for (int i = 0; i < SHIM_CL_MASKED_PARAMS; i++) {
        if (!(p->offset >> i & 1)) {
            continue;
        }
        if (i >= count || !arg_is_buffer[i]) {
            return CL_INVALID_VALUE;
        }
        uint64_t offset;
        kernel_mem(args[i], staged, staged_count, &offset);
        cl_int code = cl.set_kernel_arg(kernel, index++, sizeof offset, &offset);
        if (code != 0) {
            return code;
        }
    }
    return 0;
}

/* Set the kernel's arguments and enqueue it, with a pooled kernel object. */
static bool enqueue_kernel(shim_cl_module *module, kernel_entry *entry, cl_command_queue queue,
                           const size_t global[3], const size_t local[3], int shared_mem_bytes,
                           int count, size_t arg_sizes[], void *args[], int8_t arg_is_buffer[],
                           staged_buffer *staged, int staged_count, launch_error *error) {
    cl_int code;
    cl_kernel kernel = take_kernel(module, entry, &code);
    if (kernel == NULL) {
        return !failed(error, "clCreateKernel", code ? code : CL_OUT_OF_RESOURCES);
    }
    for (int i = 0; i < count && code == 0; i++) {
        if (arg_is_buffer[i]) {
            uint64_t offset;
            cl_mem mem = kernel_mem(args[i], staged, staged_count, &offset);
            code = cl.set_kernel_arg(kernel, i, sizeof mem, &mem);
        } else {
            code = cl.set_kernel_arg(kernel, i, arg_sizes[i], args[i]);
        }
    }
    if (code == 0) {
        /* Halide's OpenCL kernels end with a __local argument for shared memory. */
        size_t local_bytes = shared_mem_bytes > 0 ? (size_t)shared_mem_bytes : 1;
        code = cl.set_kernel_arg(kernel, count, local_bytes, NULL);
    }
    if (code == 0) {
        code = set_offsets(kernel, entry, count, args, arg_is_buffer, staged, staged_count);
    }
    if (failed(error, "clSetKernelArg", code)) {
        give_kernel(entry, kernel);
        return false;
    }
    code = cl.enqueue_nd_range_kernel(queue, kernel, 3, NULL, global, local, 0, NULL, NULL);
    /* Arguments are captured at enqueue: the kernel object is free for the next launch. */
    give_kernel(entry, kernel);
    return !failed(error, "clEnqueueNDRangeKernel", code);
}

/* The number of buffer arguments a launch may stage (those not launched directly), or -1 (after halide_error) if one is not on the
 * OpenCL device (as a buffer or as an image). */
static int misaligned_buffers(void *user_context, int count, void *args[],
                              int8_t arg_is_buffer[]) {
    const struct halide_device_interface_t *opencl = halide_opencl_device_interface();
    const struct halide_device_interface_t *image = halide_opencl_image_device_interface();
    int misaligned = 0;
    for (int i = 0; i < count; i++) {
        const halide_buffer_t *buf = args[i];
        if (!arg_is_buffer[i]) {
            continue;
        }
        if (buf->device == 0 || (buf->device_interface != opencl && buf->device_interface != image)) {
            halide_error(user_context, "OpenCL: a kernel argument is not on the OpenCL device\n");
            return -1;
        }
        misaligned += !launched_directly(buf);
    }
    return misaligned;
}

static int launch(SHIM_RUN_PARAMS) {
    shim_cl_module *module = state_ptr;
    cl_command_queue queue = __atomic_load_n(&cl.queue, __ATOMIC_ACQUIRE);
    if (module == NULL || queue == NULL) {
        halide_error(user_context, "OpenCL: kernel launched before its module was initialized\n");
        return halide_error_code_gpu_device_error;
    }
    int count = 0;
    while (arg_sizes[count] != 0) {
        count++;
    }
    int misaligned = misaligned_buffers(user_context, count, args, arg_is_buffer);
    if (misaligned < 0) {
        return halide_error_code_gpu_device_error;
    }
    kernel_entry *entry = entry_for(module, entry_name);
    if (entry == NULL) {
        return halide_error_out_of_memory(user_context);
    }
    size_t global[3] = {(size_t)blocksX * threadsX, (size_t)blocksY * threadsY,
                        (size_t)blocksZ * threadsZ};
    size_t local[3] = {(size_t)threadsX, (size_t)threadsY, (size_t)threadsZ};
    staged_buffer staged[misaligned + 1];
    int staged_count = 0;
    launch_error error = {NULL, 0};
    bool ran = stage_all(queue, entry, count, args, arg_is_buffer, staged, &staged_count, &error) &&
               enqueue_kernel(module, entry, queue, global, local, shared_mem_bytes, count,
                              arg_sizes, args, arg_is_buffer, staged, staged_count, &error);
    unstage_all(queue, staged, staged_count, ran, &error);
    if (shim_profile_on()) {
        shim_profile_launch_staged(staged_count);
    }
    if (error.code != 0) {
        return launch_failed(user_context, error.what, entry_name, error.code);
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

/* A shim OpenCL handle, of a buffer or of an image, or NULL (after halide_error where the
 * buffer is another interface's). */
static const shim_cl_handle *handle_of(void *user_context, struct halide_buffer_t *buf,
                                       const char *routine) {
    int backend = buf != NULL && __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) ==
                                     halide_opencl_image_device_interface()
                      ? SHIM_BACKEND_OPENCL_IMAGE
                      : SHIM_BACKEND_OPENCL;
    int result = shim_check_native_handle(user_context, buf, backend, routine);
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
 * is the shim's, released by Python at exit (shim/core/shutdown.py), so there is nothing to do. */

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
        int result = shim_py_device_start(user_context, shim_backend_interface(SHIM_BACKEND_OPENCL));
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
