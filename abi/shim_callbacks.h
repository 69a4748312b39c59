/* The Python runtime core, as C sees it: one callback per device-interface operation,
 * implemented in shim/core/runtime.py and registered from the table in shim/core/callbacks.py.
 *
 * Plain prototypes, so that this is their one declaration: the native library's C files
 * include them (through native_stubs/shim_native.h) and call them, and native_stubs/build.py
 * feeds them to cffi inside extern "Python+C" { }, which makes cffi define each one as a C
 * function that calls the Python function registered for it.
 *
 * Each takes the interface of the backend it acts for, so one set of callbacks serves every
 * backend. They return Halide error codes, the ones Halide's generic layer would return.
 */

int shim_py_device_malloc(void *user_context, struct halide_buffer_t *buf,
                          const struct halide_device_interface_t *device_interface);
int shim_py_device_free(void *user_context, struct halide_buffer_t *buf,
                        const struct halide_device_interface_t *device_interface);
int shim_py_device_sync(void *user_context, struct halide_buffer_t *buf,
                        const struct halide_device_interface_t *device_interface);
int shim_py_device_release(void *user_context,
                           const struct halide_device_interface_t *device_interface);
int shim_py_copy_to_host(void *user_context, struct halide_buffer_t *buf,
                         const struct halide_device_interface_t *device_interface);
int shim_py_copy_to_device(void *user_context, struct halide_buffer_t *buf,
                           const struct halide_device_interface_t *device_interface);
int shim_py_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                   const struct halide_device_interface_t *device_interface);
int shim_py_device_and_host_free(void *user_context, struct halide_buffer_t *buf,
                                 const struct halide_device_interface_t *device_interface);
int shim_py_buffer_copy(void *user_context, struct halide_buffer_t *src,
                        const struct halide_device_interface_t *dst_device_interface,
                        struct halide_buffer_t *dst);
int shim_py_device_crop(void *user_context, const struct halide_buffer_t *src,
                        struct halide_buffer_t *dst,
                        const struct halide_device_interface_t *device_interface);
int shim_py_device_slice(void *user_context, const struct halide_buffer_t *src,
                         int slice_dim, int slice_pos, struct halide_buffer_t *dst,
                         const struct halide_device_interface_t *device_interface);
int shim_py_device_release_crop(void *user_context, struct halide_buffer_t *buf,
                                const struct halide_device_interface_t *device_interface);
int shim_py_wrap_native(void *user_context, struct halide_buffer_t *buf, uint64_t handle,
                        const struct halide_device_interface_t *device_interface);
int shim_py_detach_native(void *user_context, struct halide_buffer_t *buf,
                          const struct halide_device_interface_t *device_interface);
int shim_py_compute_capability(void *user_context, int *major, int *minor,
                               const struct halide_device_interface_t *device_interface);
/* Give the idle allocations the shim keeps for reuse back to the driver: those of
 * `backend` (enum shim_backend), or of every backend made so far for SHIM_BACKEND_COUNT
 * (shim/core/allocation_reuse.py). */
int shim_py_release_unused_allocations(void *user_context, int backend);

/* GPU backends, the one of `device_interface`: compile a module's kernels (once per source;
 * `size` counts the terminating NUL) into `*state_ptr`, and create the backend's context on
 * first use. */
int shim_py_initialize_kernels(void *user_context, void **state_ptr, const char *src, int size,
                               const struct halide_device_interface_t *device_interface);
int shim_py_device_start(void *user_context,
                         const struct halide_device_interface_t *device_interface);

/* Kernel launches while profiling: begin returns a token for end (0: not recorded). */
int shim_py_profile_launch_begin(void *user_context, const shim_launch *launch);
void shim_py_profile_launch_end(int token, int result, int staged);

/* The deleters of the tensors the shim exports through DLPack. */
void shim_py_dlpack_delete(DLManagedTensor *self);
void shim_py_dlpack_delete_versioned(DLManagedTensorVersioned *self);
