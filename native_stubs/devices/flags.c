/* Flag helpers for Python (see abi/shim_buffers.h). */
#include "shim_native.h"

uint64_t shim_flags_get(const struct halide_buffer_t *buf) {
    return shim_flags_load(buf);
}

void shim_flags_assign(struct halide_buffer_t *buf, uint64_t bits, bool value) {
    if (value) {
        shim_flags_set(buf, bits);
    } else {
        shim_flags_clear(buf, bits);
    }
}
