/* The shim's device interfaces: one halide_device_interface_t per backend, for the process.
 *
 * As in Halide, the public members point to the generic halide_* entry points
 * (device_generic.c), and each interface's impl table reaches the backend. Here every impl
 * entry calls the Python runtime core (shim/core/runtime.py), which locks the allocation family,
 * re-checks the flags, has the backend move the bytes and updates the flags; the same callbacks
 * serve every backend, told apart by the interface they are passed.
 */
#include "shim_native.h"

static const struct halide_device_interface_impl_t impls[SHIM_BACKEND_COUNT];

static void no_module_refcount(void) {
    /* Halide uses these to reference-count JIT modules; AOT code needs nothing. */
}

static int compute_capability(int backend, void *user_context, int *major, int *minor);

#define INTERFACE(BACKEND, CAPABILITY)                                                          \
    {                                                                                           \
        halide_device_malloc, halide_device_free, halide_device_sync, halide_device_release,   \
            halide_copy_to_host, halide_copy_to_device, halide_device_and_host_malloc,          \
            halide_device_and_host_free, halide_buffer_copy, halide_device_crop,                \
            halide_device_slice, halide_device_release_crop, halide_device_wrap_native,         \
            halide_device_detach_native, CAPABILITY, &impls[BACKEND],                           \
    }

static int host_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_HOST, uc, major, minor);
}
static int opencl_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_OPENCL, uc, major, minor);
}
static int cuda_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_CUDA, uc, major, minor);
}
static int proxy_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_PROXY, uc, major, minor);
}

static const struct halide_device_interface_t interfaces[SHIM_BACKEND_COUNT] = {
    [SHIM_BACKEND_HOST] = INTERFACE(SHIM_BACKEND_HOST, host_compute_capability),
    [SHIM_BACKEND_OPENCL] = INTERFACE(SHIM_BACKEND_OPENCL, opencl_compute_capability),
    [SHIM_BACKEND_CUDA] = INTERFACE(SHIM_BACKEND_CUDA, cuda_compute_capability),
    [SHIM_BACKEND_PROXY] = INTERFACE(SHIM_BACKEND_PROXY, proxy_compute_capability),
};

const struct halide_device_interface_t *shim_backend_interface(int backend) {
    if (backend < 0 || backend >= SHIM_BACKEND_COUNT) {
        return NULL;
    }
    return &interfaces[backend];
}

int shim_backend_of(const struct halide_device_interface_t *device_interface) {
    if (device_interface < &interfaces[0] || device_interface >= &interfaces[SHIM_BACKEND_COUNT]) {
        return -1;
    }
    return (int)(device_interface - &interfaces[0]);
}

static int compute_capability(int backend, void *user_context, int *major, int *minor) {
    return shim_py_compute_capability(user_context, major, minor, &interfaces[backend]);
}

/* The impl entries. Those whose arguments carry no interface (malloc, release, a global sync)
 * need one function per backend; the macro writes them. */
#define IMPL_FUNCTIONS(NAME, BACKEND)                                                            \
    static int NAME##_device_malloc(void *uc, struct halide_buffer_t *buf) {                     \
        return shim_py_device_malloc(uc, buf, &interfaces[BACKEND]);                             \
    }                                                                                            \
    static int NAME##_device_free(void *uc, struct halide_buffer_t *buf) {                       \
        return shim_py_device_free(uc, buf, &interfaces[BACKEND]);                               \
    }                                                                                            \
    static int NAME##_device_sync(void *uc, struct halide_buffer_t *buf) {                       \
        return shim_py_device_sync(uc, buf, &interfaces[BACKEND]);                               \
    }                                                                                            \
    static int NAME##_device_release(void *uc) {                                                 \
        return shim_py_device_release(uc, &interfaces[BACKEND]);                                 \
    }                                                                                            \
    static int NAME##_copy_to_host(void *uc, struct halide_buffer_t *buf) {                      \
        return shim_py_copy_to_host(uc, buf, &interfaces[BACKEND]);                              \
    }                                                                                            \
    static int NAME##_copy_to_device(void *uc, struct halide_buffer_t *buf) {                    \
        return shim_py_copy_to_device(uc, buf, &interfaces[BACKEND]);                            \
    }                                                                                            \
    static int NAME##_device_and_host_malloc(void *uc, struct halide_buffer_t *buf) {            \
        return shim_py_device_and_host_malloc(uc, buf, &interfaces[BACKEND]);                    \
    }                                                                                            \
    static int NAME##_device_and_host_free(void *uc, struct halide_buffer_t *buf) {              \
        return shim_py_device_and_host_free(uc, buf, &interfaces[BACKEND]);                      \
    }                                                                                            \
    static int NAME##_device_crop(void *uc, const struct halide_buffer_t *src,                   \
                                  struct halide_buffer_t *dst) {                                 \
        return shim_py_device_crop(uc, src, dst, &interfaces[BACKEND]);                          \
    }                                                                                            \
    static int NAME##_device_slice(void *uc, const struct halide_buffer_t *src, int dim,         \
                                   int pos, struct halide_buffer_t *dst) {                       \
        return shim_py_device_slice(uc, src, dim, pos, dst, &interfaces[BACKEND]);               \
    }                                                                                            \
    static int NAME##_device_release_crop(void *uc, struct halide_buffer_t *buf) {               \
        return shim_py_device_release_crop(uc, buf, &interfaces[BACKEND]);                       \
    }                                                                                            \
    static int NAME##_wrap_native(void *uc, struct halide_buffer_t *buf, uint64_t handle) {      \
        return shim_py_wrap_native(uc, buf, handle, &interfaces[BACKEND]);                       \
    }                                                                                            \
    static int NAME##_detach_native(void *uc, struct halide_buffer_t *buf) {                     \
        return shim_py_detach_native(uc, buf, &interfaces[BACKEND]);                             \
    }

#define IMPL_TABLE(NAME)                                                                        \
    {                                                                                           \
        no_module_refcount, no_module_refcount, NAME##_device_malloc, NAME##_device_free,       \
            NAME##_device_sync, NAME##_device_release, NAME##_copy_to_host,                     \
            NAME##_copy_to_device, NAME##_device_and_host_malloc, NAME##_device_and_host_free,  \
            shim_py_buffer_copy, NAME##_device_crop, NAME##_device_slice,                       \
            NAME##_device_release_crop, NAME##_wrap_native, NAME##_detach_native,               \
    }

IMPL_FUNCTIONS(host, SHIM_BACKEND_HOST)
IMPL_FUNCTIONS(opencl, SHIM_BACKEND_OPENCL)
IMPL_FUNCTIONS(cuda, SHIM_BACKEND_CUDA)
IMPL_FUNCTIONS(proxy, SHIM_BACKEND_PROXY)

static const struct halide_device_interface_impl_t impls[SHIM_BACKEND_COUNT] = {
    [SHIM_BACKEND_HOST] = IMPL_TABLE(host),
    [SHIM_BACKEND_OPENCL] = IMPL_TABLE(opencl),
    [SHIM_BACKEND_CUDA] = IMPL_TABLE(cuda),
    [SHIM_BACKEND_PROXY] = IMPL_TABLE(proxy),
};

void shim_buffer_set_device(struct halide_buffer_t *buf, uint64_t device,
                            const struct halide_device_interface_t *device_interface) {
    /* Interface before handle: whoever sees the handle (acquire) sees the interface. When the
     * handle is cleared, it goes first, for the same reason. */
    if (device != 0) {
        __atomic_store_n(&buf->device_interface, device_interface, __ATOMIC_RELEASE);
        __atomic_store_n(&buf->device, device, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&buf->device, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&buf->device_interface, device_interface, __ATOMIC_RELEASE);
    }
}
