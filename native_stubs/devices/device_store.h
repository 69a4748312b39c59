/* A buffer's device handle and interface, stored together (device_store.c counts the stores):
 * what the allocating and freeing device entry points use, and what validate() reads. */
#ifndef SHIM_DEVICES_DEVICE_STORE_H
#define SHIM_DEVICES_DEVICE_STORE_H

#include "shim_native.h"

/* The stores of shim_device_store begun and ended, over every buffer (device_store.c;
 * devices/device_generic.c's validate() reads them): a handle and interface read while
 * one was in progress may be half of each, which a buffer made that way cannot be told from
 * otherwise. */
extern uint64_t shim_device_stores_begun, shim_device_stores_ended;

/* Give a buffer a device handle and interface, or take them away (device 0). Interface before
 * handle: whoever sees the handle (acquire) sees the interface. When the handle is cleared, it
 * goes first, for the same reason. */
static inline void shim_device_store(halide_buffer_t *buf, uint64_t device,
                                     const struct halide_device_interface_t *device_interface) {
    __atomic_fetch_add(&shim_device_stores_begun, 1, __ATOMIC_SEQ_CST);
    if (device != 0) {
        __atomic_store_n(&buf->device_interface, device_interface, __ATOMIC_RELEASE);
        __atomic_store_n(&buf->device, device, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&buf->device, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&buf->device_interface, device_interface, __ATOMIC_RELEASE);
    }
    __atomic_fetch_add(&shim_device_stores_ended, 1, __ATOMIC_SEQ_CST);
}

#endif
