/* Linked only into a library run with Halide's stock runtime (bundled, whose definitions are
 * weak): halide_device_malloc and halide_device_free of the application's own, counting the
 * allocations a pipeline makes and frees, as an application can do under that runtime. (The
 * shim's runtime replaces such definitions, and says so as it loads the library: the
 * shim's side is counted from its own records instead.)
 */
#include "HalideRuntime.h"

/* The start of Halide 21's halide_device_interface_impl_t (src/runtime/device_interface.h). */
struct impl_start {
    void (*use_module)(void);
    void (*release_module)(void);
    int (*device_malloc)(void *user_context, struct halide_buffer_t *buf);
    int (*device_free)(void *user_context, struct halide_buffer_t *buf);
};

static int mallocs, frees;

int halide_device_malloc(void *user_context, struct halide_buffer_t *buf,
                         const struct halide_device_interface_t *interface) {
    if (buf->device == 0) {
        mallocs++;
    }
    const struct impl_start *impl = (const struct impl_start *)interface->impl;
    return impl->device_malloc(user_context, buf);
}

int halide_device_free(void *user_context, struct halide_buffer_t *buf) {
    if (buf->device == 0 || buf->device_interface == NULL) {
        return 0;
    }
    frees++;
    const struct impl_start *impl = (const struct impl_start *)buf->device_interface->impl;
    return impl->device_free(user_context, buf);
}

void flv_device_counts(int *malloc_count, int *free_count) {
    *malloc_count = mallocs;
    *free_count = frees;
}
