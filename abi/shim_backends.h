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
    SHIM_BACKEND_VULKAN = 5,
    SHIM_BACKEND_COUNT = 6
};

const struct halide_device_interface_t *shim_backend_interface(int backend);
/* The backend whose interface this is, or -1 if the shim does not own it. */
int shim_backend_of(const struct halide_device_interface_t *device_interface);

/* What native_stubs/devices/served.c keeps in every handle of a served allocation, for the
 * crops and slices of it made in C: the allocation's own handle (`root`) holds the lock and the
 * list of its live crops; a crop names its root, its byte offset, and its neighbours. */
typedef struct shim_served_link {
    uint32_t lock;
    uint64_t root;            /* a crop's: the allocation's own handle; 0 in the root */
    uint64_t offset;          /* a crop's: bytes from the allocation's start to its min element */
    uint64_t prev, next;      /* the root's live crops, a list through them (the root's next:
                               * the first) */
} shim_served_link;

/* OpenCL (native_stubs/backends/opencl.c). A device handle points to one of these; the first two
 * fields are Halide's own handle layout. */
typedef struct shim_cl_staging shim_cl_staging;
typedef struct shim_cl_handle {
    uint64_t offset;   /* bytes from the start of mem to the buffer's min element */
    void *mem;         /* cl_mem of the allocation */
    void *launch_mem;  /* what kernels get: mem or a sub-buffer; NULL if offset is misaligned
                        * (then mem and an element offset, or staging) */
    shim_cl_staging *staging;  /* launches' copy of a staged crop, kept for the next one */
    /* 1 while the allocation behind the handle is one the native layer serves
     * (native_stubs/devices/served.c); 0 for the Python core's, and once claimed. */
    uint32_t served;
    uint32_t native_made;  /* made by the native layer: shim_opencl_handle_release frees it */
    /* The bytes the buffer spans from its min element (a served allocation's: asked for), and
     * a served allocation's capacity. */
    uint64_t nbytes, capacity;
    /* A handle of the image interface: the image's dimensions (1-3), and launch_mem is the
     * image where the buffer is the image's own (offset 0, as many dimensions); any other crop
     * or slice is staged into an image of its own around each launch. 0 for a buffer. */
    uint32_t image_dims;
    shim_served_link link;
} shim_cl_handle;

typedef struct shim_cl_module shim_cl_module;
/* Bind launches to the ICD loader pyopencl uses and to the backend's context and queue. */
int shim_opencl_bind(const char *loader, void *context, void *queue);
/* `source`: the program's (size bytes), for what its kernels' prototypes say. */
shim_cl_module *shim_opencl_module_new(void *program, const char *source, size_t size);
/* The source a program is built from for Halide's `source` (size bytes): its kernels' buffers
 * take element offsets where they can (native_stubs/backends/opencl_prototypes.c). NULL if out
 * of memory; else *out_size bytes and a NUL, freed with shim_opencl_free_source. */
char *shim_opencl_program_source(const char *source, size_t size, size_t *out_size);
void shim_opencl_free_source(char *source);
/* Free what launches keep in a handle (its staging buffer), before the handle goes, and the
 * handle itself if the native layer made it. */
void shim_opencl_handle_release(shim_cl_handle *handle);
/* Serve the pipelines' own allocations in C (native_stubs/devices/served.c), from `pool`,
 * which must live as long as the process. */
void shim_opencl_serve_allocations(shim_pool *pool);
/* The device's base address alignment in bytes (CL_DEVICE_MEM_BASE_ADDR_ALIGN / 8): a crop at
 * a nonzero multiple of it gets a sub-buffer. */
void shim_opencl_set_alignment(uint64_t alignment);
/* A reference of the caller's own to a cl_mem (clRetainMemObject): what the pool holds. */
void shim_opencl_retain(uint64_t mem);
/* Give one reference back (clReleaseMemObject). */
void shim_opencl_release(uint64_t mem);
/* One contiguous copy on the backend's queue, complete when it returns (enqueued without
 * blocking, then clFinish, as Halide's runtime copies): `direction` 0 writes `nbytes` from
 * `host` into `mem` at `offset`, 1 reads them into `host`, 2 copies them from `mem` at `offset`
 * into `to` at `to_offset`. 0, or the OpenCL error (CL_INVALID_OPERATION in a forked child). */
int shim_opencl_transfer(int direction, uint64_t mem, uint64_t offset, void *host, uint64_t to,
                         uint64_t to_offset, uint64_t nbytes);
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

/* Vulkan (native_stubs/backends/vulkan.c, vulkan_memory.c, vulkan_kernels.c): the driver is
 * reached in C only, through libvulkan.so.1 opened at first use. A device handle points to a shim_vk_handle:
 * Halide 21's own handle is a pointer to its allocator's private MemoryRegion, which nothing
 * outside its runtime can read, so the shim's says what a kernel binds instead. */
typedef struct shim_vk_memory shim_vk_memory;
typedef struct shim_vk_module shim_vk_module;
typedef struct shim_vk_handle {
    uint64_t buffer;  /* the VkBuffer of the allocation */
    uint64_t offset;  /* bytes from its start to the buffer's min element */
    shim_vk_memory *memory;
    /* 1 while the allocation behind the handle is one the native layer serves
     * (native_stubs/devices/served.c); 0 for the Python core's, and once claimed. */
    uint32_t served;
    uint32_t native_made;  /* made by the native layer: shim_vk_handle_release frees it */
    /* The bytes the buffer spans from its min element (a served allocation's: asked for), and
     * a served allocation's capacity. */
    uint64_t nbytes, capacity;
    shim_served_link link;
} shim_vk_handle;
/* Names of the machine's Vulkan devices, each ending in a newline, into `names` (a probe that
 * makes an instance and no device); the number of devices, or -1 with the reason in `names`. */
int shim_vk_probe(char *names, size_t size);
/* Make the instance, device and queue (Halide's HL_VK_DEVICE_TYPE, HL_VK_LAYERS and
 * HL_VK_EXTENSIONS, or what halide_vulkan_set_* set); 0, or a Halide error code with the
 * reason in `message`. Once per process. */
int shim_vk_start(char *message, size_t size);
const char *shim_vk_device_name(void);
/* [min storage buffer offset alignment, device-local heap bytes, API major, API minor,
 * max storage buffer range, whether timestamps work, whether a Buffer's memory is mapped
 * where the device allows (copies by memcpy; else every copy is staged), whether launches
 * are left running (timeline semaphores) rather than waited for] */
void shim_vk_device_facts(uint64_t facts[8]);
shim_vk_memory *shim_vk_allocate(uint64_t size, char *message, size_t message_size);
void shim_vk_free(shim_vk_memory *memory);
/* An application's VkBuffer on the shim's device (halide_vulkan_wrap_vk_buffer): never freed
 * by the shim (shim_vk_free forgets it). */
shim_vk_memory *shim_vk_wrap(uint64_t buffer);
uint64_t shim_vk_buffer_of(const shim_vk_memory *memory);
/* A copy plan (shim/native/regions.py's CopyPlan: `outer` outer extents then the chunk in
 * bytes, strides per outer dimension): direction 0 host -> `dst`, 1 `src` -> host, 2 `src` ->
 * `dst`. Returns once complete: 0, or a Vulkan error code with the reason in `message`. */
int shim_vk_transfer(int direction, shim_vk_memory *src, shim_vk_memory *dst, void *host,
                     const int64_t *shape, const int64_t *src_strides, const int64_t *dst_strides,
                     int outer, int64_t src_offset, int64_t dst_offset, char *message,
                     size_t message_size);
/* The device's clock (ns) when it reaches a mark submitted now, for profiles; 0 or a Vulkan
 * error code (VK_ERROR_FEATURE_NOT_PRESENT: the queue has no timestamps). */
int shim_vk_timestamp(uint64_t *ns);
/* Wait until the device is idle; 0 or a Vulkan error code. */
int shim_vk_sync(void);
/* Serve the pipelines' own allocations in C (native_stubs/devices/served.c), from `pool`,
 * whose native values are shim_vk_memory pointers, and which must live as long as the
 * process. */
void shim_vk_serve_allocations(shim_pool *pool);
/* Forget a handle: free it if the native layer made it (a served allocation's). */
void shim_vk_handle_release(shim_vk_handle *handle);
/* Halide's Vulkan module (`size` bytes): its shader modules made, its entry points read; NULL
 * with the reason in `message`. */
shim_vk_module *shim_vk_module_new(const void *source, size_t size, char *message,
                                   size_t message_size);
