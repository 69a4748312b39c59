/* The counts of shim_device_store's stores begun and ended, over every buffer
 * (devices/device_store.h). */
#include "devices/device_store.h"

uint64_t shim_device_stores_begun, shim_device_stores_ended;
