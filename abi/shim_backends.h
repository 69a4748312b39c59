/* The native library's own API for the device backends: which interfaces are the shim's, and
 * what the OpenCL and CUDA launch paths (native_stubs/backends/opencl.c, cuda.c) need from Python. See
 * abi/shim_calls.h for what every abi/shim_*.h header is.
 */

/* The backends whose halide_device_interface_t the shim provides: one interface per backend
 * in the process, whichever pipeline asks for it. */
enum shim_backend {
    SHIM_BACKEND_HOST = 0,   /* a simulated device in host memory, for tests */
    SHIM_BACKEND_OPENCL = 1,
    SHIM_BACKEND_CUDA = 2,
    /* Not a device: the interface a crop carries while its parent has no device allocation.
     * It stands for "the parent's allocation, not yet made"; the crop's first device use
     * allocates the parent on the device asked for and makes the crop alias it. */
    SHIM_BACKEND_PROXY = 3,
    /* OpenCL image memory (Halide's MemoryType::GPUTexture), on the OpenCL backend's device. */
    SHIM_BACKEND_OPENCL_IMAGE = 4,
    SHIM_BACKEND_COUNT = 5
};

const struct halide_device_interface_t *shim_backend_interface(int backend);
/* The backend whose interface this is, or -1 if the shim does not own it. */
int shim_backend_of(const struct halide_device_interface_t *device_interface);

/* OpenCL (native_stubs/backends/opencl.c). A device handle points to one of these; the first two
 * fields are Halide's own handle layout. */
typedef struct shim_cl_staging shim_cl_staging;
typedef struct shim_cl_handle {
    uint64_t offset;   /* bytes from the start of mem to the buffer's min element */
    void *mem;         /* cl_mem of the allocation */
    void *launch_mem;  /* what kernels get: mem or a sub-buffer; NULL if offset is misaligned */
    shim_cl_staging *staging;  /* launches' copy of a misaligned crop, kept for the next one */
    /* 1 while the allocation behind the handle is one the native layer serves
     * (native_stubs/devices/served.c); 0 for the Python core's, and once claimed. */
    uint32_t served;
    uint32_t native_made;  /* made by the native layer: shim_opencl_handle_release frees it */
    uint64_t nbytes, capacity;  /* a served allocation's: asked for, and held */
    /* A handle of the image interface: the image's dimensions (1-3), and launch_mem is the
     * image where the buffer is the image's own (offset 0, as many dimensions); any other crop
     * or slice is staged into an image of its own around each launch. 0 for a buffer. */
    uint32_t image_dims;
} shim_cl_handle;

typedef struct shim_cl_module shim_cl_module;
/* Bind launches to the ICD loader pyopencl uses and to the backend's context and queue. */
int shim_opencl_bind(const char *loader, void *context, void *queue);
/* `source`: the program's (size bytes), for what its kernels' prototypes say. */
shim_cl_module *shim_opencl_module_new(void *program, const char *source, size_t size);
/* Free what launches keep in a handle (its staging buffer), before the handle goes, and the
 * handle itself if the native layer made it. */
void shim_opencl_handle_release(shim_cl_handle *handle);
/* Serve the pipelines' own allocations in C (native_stubs/devices/served.c), from `pool`,
 * which must live as long as the process. */
void shim_opencl_serve_allocations(shim_pool *pool);
/* A reference of the caller's own to a cl_mem (clRetainMemObject): what the pool holds. */
void shim_opencl_retain(uint64_t mem);
/* Give one reference back (clReleaseMemObject). */
void shim_opencl_release(uint64_t mem);
/* Halide's OpenCL preferences (halide_opencl_set_*), NULL if unset. */
const char *halide_opencl_get_platform_name(void *user_context);
const char *halide_opencl_get_device_type(void *user_context);
const char *halide_opencl_get_build_options(void *user_context);

/* CUDA (native_stubs/backends/cuda.c). */
typedef struct shim_cuda_module shim_cuda_module;
int shim_cuda_bind(const char *driver, void *context);
shim_cuda_module *shim_cuda_module_new(void *module, void *context);
/* Acquire the CUDA context (halide_cuda_acquire_context) and push it; leave pops and releases
 * it. Every driver call the Python backend makes is between the two. */
int shim_cuda_enter(void *user_context, void **ctx);
void shim_cuda_leave(void *user_context);
