/* Halide 21's GPU runtime entry points (HalideRuntimeOpenCL.h, HalideRuntimeCuda.h,
 * HalideRuntimeVulkan.h, whose Vulkan handle types are left out here) that
 * Python calls directly, plus the OpenCL context hook that opencl.cpp defines. cffi cdef. */

const struct halide_device_interface_t *halide_opencl_device_interface(void);
const struct halide_device_interface_t *halide_opencl_image_device_interface(void);
int halide_opencl_initialize_kernels(void *user_context, void **state_ptr, const char *src, int size);
int halide_opencl_run(void *user_context, void *state_ptr, const char *entry_name,
                      int blocksX, int blocksY, int blocksZ, int threadsX, int threadsY, int threadsZ,
                      int shared_mem_bytes, size_t arg_sizes[], void *args[], int8_t arg_is_buffer[]);
int halide_opencl_wrap_cl_mem(void *user_context, struct halide_buffer_t *buf, uint64_t device_ptr);
int halide_opencl_detach_cl_mem(void *user_context, struct halide_buffer_t *buf);
uintptr_t halide_opencl_get_cl_mem(void *user_context, struct halide_buffer_t *buf);
uint64_t halide_opencl_get_crop_offset(void *user_context, struct halide_buffer_t *buf);
int halide_acquire_cl_context(void *user_context, void **ctx, void **queue, bool create);

const struct halide_device_interface_t *halide_cuda_device_interface(void);
int halide_cuda_wrap_device_ptr(void *user_context, struct halide_buffer_t *buf, uint64_t device_ptr);
int halide_cuda_detach_device_ptr(void *user_context, struct halide_buffer_t *buf);
uintptr_t halide_cuda_get_device_ptr(void *user_context, struct halide_buffer_t *buf);
int halide_cuda_release_unused_device_allocations(void *user_context);
typedef int (*halide_cuda_acquire_context_t)(void *, void **, bool);
typedef int (*halide_cuda_release_context_t)(void *);
typedef int (*halide_cuda_get_stream_t)(void *, void *, void **);
halide_cuda_acquire_context_t halide_set_cuda_acquire_context(halide_cuda_acquire_context_t handler);
halide_cuda_release_context_t halide_set_cuda_release_context(halide_cuda_release_context_t handler);
halide_cuda_get_stream_t halide_set_cuda_get_stream(halide_cuda_get_stream_t handler);
/* Defined by cuda.cpp, not declared by its header; the hooks above replace them. */
int halide_cuda_acquire_context(void *user_context, void **ctx, bool create);
int halide_cuda_release_context(void *user_context);
int halide_cuda_get_stream(void *user_context, void *ctx, void **stream);

const struct halide_device_interface_t *halide_vulkan_device_interface(void);
int halide_vulkan_initialize_kernels(void *user_context, void **state_ptr, const char *src, int size);
int halide_vulkan_run(void *user_context, void *state_ptr, const char *entry_name,
                      int blocksX, int blocksY, int blocksZ, int threadsX, int threadsY, int threadsZ,
                      int shared_mem_bytes, size_t arg_sizes[], void *args[], int8_t arg_is_buffer[]);
int halide_vulkan_wrap_vk_buffer(void *user_context, struct halide_buffer_t *buf, uint64_t vk_buffer);
int halide_vulkan_detach_vk_buffer(void *user_context, struct halide_buffer_t *buf);
uintptr_t halide_vulkan_get_vk_buffer(void *user_context, struct halide_buffer_t *buf);
int halide_vulkan_release_unused_device_allocations(void *user_context);
bool halide_vulkan_is_initialized(void);
void halide_vulkan_set_device_type(const char *n);
const char *halide_vulkan_get_device_type(void *user_context);
void halide_vulkan_set_layer_names(const char *n);
const char *halide_vulkan_get_layer_names(void *user_context);
void halide_vulkan_set_extension_names(const char *n);
const char *halide_vulkan_get_extension_names(void *user_context);
