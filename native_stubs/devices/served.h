/* Allocations the native layer serves itself (served.c): what a backend's native side
 * registers, and what the generic entry points (device_generic.c) ask. */
#ifndef SHIM_DEVICES_SERVED_H
#define SHIM_DEVICES_SERVED_H

#include "shim_native.h"

/* A backend's allocator, for the served paths. Every function is called without any lock
 * held, and may be called from any thread. */
typedef struct {
    /* Whether the driver may be called now: bound, and in the process that bound it. */
    bool (*usable)(void);
    /* A new allocation of `size` bytes from the driver; 0 if it failed. */
    uint64_t (*create)(uint64_t size);
    /* Give an allocation back to the driver. */
    void (*release)(uint64_t native);
    /* The device handle for a buffer whose min element is at the start of `native`, marked as
     * served, remembering `nbytes` and `capacity`; 0 if it could not be made. */
    uint64_t (*make_handle)(uint64_t native, uint64_t nbytes, uint64_t capacity);
    /* If `handle` is a served one not yet claimed (any handle of this backend's interface may
     * be asked about), claim it, atomically: true, with what make_handle was given. The handle
     * stays valid. */
    bool (*claim)(uint64_t handle, uint64_t *native, uint64_t *nbytes, uint64_t *capacity);
    /* Free a claimed handle made by make_handle. */
    void (*release_handle)(uint64_t handle);
    /* Whether `handle` is a served one not yet claimed, and its native value and the bytes
     * make_handle was given (a look, not a claim: the caller is the struct's user, whom
     * generated code orders with its free). */
    bool (*served)(uint64_t handle, uint64_t *native, uint64_t *nbytes);
    /* Any handle of this backend's interface: the native value of its allocation, the byte
     * offset of its min element there and the bytes it spans from it (the Python core's
     * handles say them too); false where it cannot say. */
    bool (*locate)(uint64_t handle, uint64_t *native, uint64_t *offset, uint64_t *nbytes);
    /* Blocking copies between host memory and the `nbytes` of an allocation from byte
     * `offset`: 0 once the bytes are there, else the driver's code. */
    int (*write)(uint64_t native, uint64_t offset, const void *host, uint64_t nbytes);
    int (*read)(uint64_t native, uint64_t offset, void *host, uint64_t nbytes);
    /* A blocking copy of `nbytes` between two allocations, at byte offsets in each. */
    int (*copy)(uint64_t src, uint64_t src_offset, uint64_t dst, uint64_t dst_offset,
                uint64_t nbytes);
    /* The served.c link inside a handle of this backend (any handle of its interface). */
    shim_served_link *(*link)(uint64_t handle);
    /* A handle whose min element is `offset` bytes into `native` and whose elements span
     * `nbytes`, as the Python backend's handle() makes one for a crop (never marked served); 0
     * where only the Python backend can make it, the driver refused, or out of memory. Freed
     * with release_handle. */
    uint64_t (*make_crop)(uint64_t native, uint64_t offset, uint64_t nbytes);
    /* halide_device_sync: wait for all the device's queued work, as the Python backend's
     * sync(); 0 once done, else the driver's code (the Python core then tries, and reports). */
    int (*sync)(void);
} shim_allocator;

/* A served handle's mark (a backend handle's `served` field, abi/shim_backends.h), which every
 * backend's make_handle, claim and served keep the same way: set once the handle is whole,
 * taken at most once, looked at without taking it. */
static inline void shim_served_mark(uint32_t *served) {
    __atomic_store_n(served, 1, __ATOMIC_RELEASE); /* (after the handle's other fields) */
}

static inline bool shim_served_take(uint32_t *served) {
    uint32_t expected = 1;
    return __atomic_compare_exchange_n(served, &expected, 0, false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

static inline bool shim_served_marked(const uint32_t *served) {
    return __atomic_load_n(served, __ATOMIC_ACQUIRE) != 0;
}

/* The backend's native side, once bound: its allocator, and the pool its Python side uses.
 * Only a backend whose work runs in one order registers one (OpenCL's one queue): Python's
 * ordering across streams (Backend.ran_on) never sees the calls a served allocation was used
 * in. */
void shim_served_register(int backend, const shim_allocator *allocator, shim_pool *pool);

/* What the generic entry points ask first, for a backend of the shim's own (`interface` is
 * its interface), after validating: SHIM_NOT_SERVED leaves the call to the Python core;
 * anything else is the call's result. */
enum { SHIM_NOT_SERVED = -1000000 };
int shim_served_malloc(void *user_context, struct halide_buffer_t *buf, int backend,
                       const struct halide_device_interface_t *interface);
int shim_served_free(void *user_context, struct halide_buffer_t *buf, int backend,
                     const struct halide_device_interface_t *interface);
int shim_served_copy_to_device(void *user_context, struct halide_buffer_t *buf, int backend,
                               const struct halide_device_interface_t *interface);
int shim_served_copy_to_host(void *user_context, struct halide_buffer_t *buf, int backend);
/* halide_buffer_copy where a served allocation is the source or the destination, as the Python
 * core's buffer_copy copies (see served.c); `src_interface` is src's (NULL: none) and each
 * backend that of its interface (-1: none). */
int shim_served_buffer_copy(void *user_context, struct halide_buffer_t *src,
                            const struct halide_device_interface_t *src_interface, int src_backend,
                            const struct halide_device_interface_t *dst_interface, int dst_backend,
                            struct halide_buffer_t *dst);
/* halide_device_crop (slice_dim -1) and halide_device_slice (slice_dim a dimension of `src`)
 * of a served allocation, or of a crop of one made here, into `dst` (checked by the caller: no
 * device memory, dimensions that fit); halide_device_release_crop of such a crop; halide_device_sync. */
int shim_served_crop(const struct halide_buffer_t *src, struct halide_buffer_t *dst, int slice_dim,
                     int slice_pos, int backend, const struct halide_device_interface_t *interface);
int shim_served_release_crop(struct halide_buffer_t *buf, int backend);
int shim_served_sync(int backend);
/* halide_device_and_host_malloc and _free of a struct with no shim.Buffer (its host side from
 * halide_malloc, as the Python core's). */
int shim_served_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                       int backend,
                                       const struct halide_device_interface_t *interface);
int shim_served_device_and_host_free(void *user_context, struct halide_buffer_t *buf, int backend,
                                     const struct halide_device_interface_t *interface);
/* Buffer.device_malloc and device_free of a shim.Buffer's struct (device_generic.c's
 * shim_buffer_device_malloc and shim_buffer_device_free). */
int shim_served_buffer_malloc(struct halide_buffer_t *buf, int backend,
                              const struct halide_device_interface_t *interface);
int shim_served_buffer_free(struct halide_buffer_t *buf, int backend,
                            const struct halide_device_interface_t *interface);

/* A served malloc or free of a shim.Buffer's struct (SHIM_BUFFER_FLAG_PYTHON), whose family
 * lives in Python, is run (`step(context)`) by the family server that fast/buffer_families.c
 * registers, where the family's lock stands taken; it returns SHIM_NOT_SERVED, with nothing
 * run, where the family is not one the native layer may serve now (and none is registered
 * until Python shows where the families live). What `operation` needs of the family: */
enum {
    SHIM_FAMILY_MALLOC, /* halide_device_malloc: nobody is changing it */
    SHIM_FAMILY_FREE,   /* halide_device_free: and no other thread's call is using it */
    SHIM_FAMILY_IDLE,   /* a Buffer's own method: and no call at all is using it */
    SHIM_FAMILY_COPY,   /* a copy: as a free; its step runs with the family's lock taken and
                         * the GIL released, since a driver copy may take long */
};
typedef int (*shim_served_step)(void *context);
typedef int (*shim_family_server)(const struct halide_buffer_t *buf, int operation,
                                  shim_served_step step, void *context);
void shim_served_register_family_server(shim_family_server server);

#endif
