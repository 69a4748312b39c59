/* The generic halide_* device entry points.
 *
 * Generated code and Halide's buffer helpers call these; every device interface's public
 * members point here too, as in Halide, and the backend is reached through the interface's
 * impl table. Each entry point validates the buffer as Halide 21 does (same checks, same order,
 * same error codes), decides no-ops from atomic loads of flags and device, and only then
 * dispatches.
 *
 * Unlike Halide's src/runtime/device_interface.cpp there is no process-wide device_copy_mutex:
 * nothing here takes a lock.
 */
#include <stdio.h>

#include "shim_native.h"

enum {
    HOST_DIRTY = halide_buffer_flag_host_dirty,
    DEVICE_DIRTY = halide_buffer_flag_device_dirty,
};

static const struct halide_device_interface_t *interface_of(const halide_buffer_t *buf) {
    return __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE);
}

/* Halide's debug_log_and_validate_buf: null buffer, device without interface, interface
 * without device, both dirty. */
static int validate(void *user_context, const halide_buffer_t *buf, const char *routine) {
    if (buf == NULL) {
        return halide_error_buffer_is_null(user_context, routine);
    }
    bool has_device = shim_device_load(buf) != 0;
    bool has_interface = interface_of(buf) != NULL;
    if (has_device && !has_interface) {
        return halide_error_no_device_interface(user_context);
    }
    if (has_interface && !has_device) {
        return halide_error_device_interface_no_device(user_context);
    }
    uint64_t flags = shim_flags_load(buf);
    if ((flags & HOST_DIRTY) && (flags & DEVICE_DIRTY)) {
        return halide_error_host_and_device_dirty(user_context);
    }
    return halide_error_code_success;
}

static int refuse_interface_switch(void *user_context, const char *routine) {
    char msg[128];
    snprintf(msg, sizeof msg, "%s does not support switching device interfaces\n", routine);
    halide_error(user_context, msg);
    return halide_error_code_incompatible_device_interface;
}

int halide_copy_to_host(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_copy_to_host");
    if (result) {
        return result;
    }
    if (!(shim_flags_load(buf) & DEVICE_DIRTY)) {
        return halide_error_code_success;
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface == NULL) {
        return halide_error_code_no_device_interface;
    }
    if (interface->impl->copy_to_host(user_context, buf)) {
        return halide_error_code_copy_to_host_failed;
    }
    shim_flags_clear(buf, DEVICE_DIRTY);
    return halide_error_code_success;
}

int halide_copy_to_device(void *user_context, struct halide_buffer_t *buf,
                          const struct halide_device_interface_t *device_interface) {
    int result = validate(user_context, buf, "halide_copy_to_device");
    if (result) {
        return result;
    }
    const struct halide_device_interface_t *current = interface_of(buf);
    if (device_interface == NULL) {
        if (current == NULL) {
            return halide_error_code_no_device_interface;
        }
        device_interface = current;
    }
    if (shim_device_load(buf) != 0 && current != device_interface) {
        return refuse_interface_switch(user_context, "halide_copy_to_device");
    }
    if (shim_device_load(buf) == 0) {
        result = halide_device_malloc(user_context, buf, device_interface);
        if (result) {
            return result;
        }
    }
    uint64_t flags = shim_flags_load(buf);
    if (!(flags & HOST_DIRTY)) {
        return halide_error_code_success;
    }
    if ((flags & DEVICE_DIRTY) || device_interface->impl->copy_to_device(user_context, buf)) {
        return halide_error_code_copy_to_device_failed;
    }
    shim_flags_clear(buf, HOST_DIRTY);
    return halide_error_code_success;
}

int halide_device_malloc(void *user_context, struct halide_buffer_t *buf,
                         const struct halide_device_interface_t *device_interface) {
    int result = validate(user_context, buf, "halide_device_malloc");
    if (result) {
        return result;
    }
    if (device_interface == NULL) {
        /* Halide dereferences the NULL interface here; we report it instead. */
        return halide_error_no_device_interface(user_context);
    }
    const struct halide_device_interface_t *current = interface_of(buf);
    if (current != NULL && current != device_interface) {
        return refuse_interface_switch(user_context, "halide_device_malloc");
    }
    device_interface->impl->use_module();
    result = device_interface->impl->device_malloc(user_context, buf);
    device_interface->impl->release_module();
    return result ? halide_error_code_device_malloc_failed : halide_error_code_success;
}

int halide_device_free(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_free");
    if (result) {
        return result;
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface != NULL) {
        interface->impl->use_module();
        result = interface->impl->device_free(user_context, buf);
        interface->impl->release_module();
        if (result) {
            return halide_error_code_device_free_failed;
        }
    }
    shim_flags_clear(buf, DEVICE_DIRTY);
    return halide_error_code_success;
}

void halide_device_free_as_destructor(void *user_context, void *obj) {
    (void)halide_device_free(user_context, (struct halide_buffer_t *)obj);
}

int halide_device_sync(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_sync");
    if (result) {
        return result;
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface == NULL) {
        return halide_error_no_device_interface(user_context);
    }
    if (interface->impl->device_sync(user_context, buf)) {
        return halide_error_code_device_sync_failed;
    }
    return halide_error_code_success;
}

int halide_device_sync_global(void *user_context,
                              const struct halide_device_interface_t *device_interface) {
    if (device_interface == NULL) {
        return halide_error_code_no_device_interface;
    }
    return device_interface->impl->device_sync(user_context, NULL);
}

void halide_device_release(void *user_context,
                           const struct halide_device_interface_t *device_interface) {
    if (device_interface != NULL) {
        (void)device_interface->impl->device_release(user_context);
    }
}

int halide_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                  const struct halide_device_interface_t *device_interface) {
    int result = validate(user_context, buf, "halide_device_and_host_malloc");
    if (result) {
        return result;
    }
    if (device_interface == NULL) {
        return halide_error_no_device_interface(user_context);
    }
    const struct halide_device_interface_t *current = interface_of(buf);
    if (current != NULL && current != device_interface) {
        return refuse_interface_switch(user_context, "halide_device_and_host_malloc");
    }
    device_interface->impl->use_module();
    result = device_interface->impl->device_and_host_malloc(user_context, buf);
    device_interface->impl->release_module();
    return result ? halide_error_code_device_malloc_failed : halide_error_code_success;
}

int halide_device_and_host_free(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_and_host_free");
    if (result) {
        return result;
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface != NULL) {
        interface->impl->use_module();
        result = interface->impl->device_and_host_free(user_context, buf);
        interface->impl->release_module();
        if (result) {
            return halide_error_code_device_free_failed;
        }
    } else if (buf->host != NULL) {
        /* The device side is already gone; the host side is still ours to free. */
        halide_free(user_context, buf->host);
        buf->host = NULL;
    }
    shim_flags_clear(buf, DEVICE_DIRTY);
    return halide_error_code_success;
}

void halide_device_and_host_free_as_destructor(void *user_context, void *obj) {
    (void)halide_device_and_host_free(user_context, (struct halide_buffer_t *)obj);
}

void halide_device_host_nop_free(void *user_context, void *obj) {
    (void)user_context;
    (void)obj;
}

int halide_device_wrap_native(void *user_context, struct halide_buffer_t *buf, uint64_t handle,
                              const struct halide_device_interface_t *device_interface) {
    int result = validate(user_context, buf, "halide_device_wrap_native");
    if (result) {
        return result;
    }
    if (device_interface == NULL) {
        return halide_error_no_device_interface(user_context);
    }
    const struct halide_device_interface_t *current = interface_of(buf);
    if (current != NULL && current != device_interface) {
        return refuse_interface_switch(user_context, "halide_device_wrap_native");
    }
    /* As in Halide: the interface is set before the backend sees the buffer, and a failure
     * reports device_malloc_failed. */
    buf->device_interface = device_interface;
    device_interface->impl->use_module();
    result = device_interface->impl->wrap_native(user_context, buf, handle);
    device_interface->impl->release_module();
    return result ? halide_error_code_device_malloc_failed : halide_error_code_success;
}

int halide_device_detach_native(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_detach_native");
    if (result) {
        return result;
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface == NULL) {
        return halide_error_code_success;
    }
    interface->impl->use_module();
    result = interface->impl->detach_native(user_context, buf);
    interface->impl->release_module();
    if (result) {
        return halide_error_code_device_detach_native_failed;
    }
    if (shim_device_load(buf) != 0) {
        halide_error(user_context, "buf->device is not 0 after detach_native\n");
        return halide_error_code_internal_error;
    }
    return halide_error_code_success;
}

static int check_crop_destination(void *user_context, const struct halide_buffer_t *dst,
                                  bool dimensions_ok) {
    if (shim_device_load(dst) != 0) {
        halide_error(user_context, "destination buffer already has a device allocation\n");
        return halide_error_code_device_crop_failed;
    }
    if (!dimensions_ok) {
        halide_error(user_context, "crop or slice with mismatched dimensionality\n");
        return halide_error_code_device_crop_failed;
    }
    return halide_error_code_success;
}

int halide_device_crop(void *user_context, const struct halide_buffer_t *src,
                       struct halide_buffer_t *dst) {
    if (shim_device_load(src) == 0) {
        return halide_error_code_success;
    }
    int result = check_crop_destination(user_context, dst, src->dimensions == dst->dimensions);
    if (result) {
        return result;
    }
    const struct halide_device_interface_t *interface = interface_of(src);
    interface->impl->use_module();
    return interface->impl->device_crop(user_context, src, dst);
}

int halide_device_slice(void *user_context, const struct halide_buffer_t *src, int slice_dim,
                        int slice_pos, struct halide_buffer_t *dst) {
    if (shim_device_load(src) == 0) {
        return halide_error_code_success;
    }
    int result =
        check_crop_destination(user_context, dst, src->dimensions == dst->dimensions + 1);
    if (result) {
        return result;
    }
    const struct halide_device_interface_t *interface = interface_of(src);
    interface->impl->use_module();
    return interface->impl->device_slice(user_context, src, slice_dim, slice_pos, dst);
}

int halide_device_release_crop(void *user_context, struct halide_buffer_t *buf) {
    if (shim_device_load(buf) == 0) {
        return halide_error_code_success;
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    int result = interface->impl->device_release_crop(user_context, buf);
    buf->device = 0;
    interface->impl->release_module();
    buf->device_interface = NULL;
    return result;
}
