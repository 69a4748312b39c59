/* The native library's own API for DLPack (native_stubs/devices/dlpack.c, shim/exchange/dlpack_capsules.py). See
 * abi/shim_calls.h for what every abi/shim_*.h header is.
 */

/* DLPack capsules: the destructor a capsule gets, which calls the managed tensor's deleter if
 * no consumer took the capsule, and the capsule names, which must outlive every capsule. */
void shim_dlpack_capsule_destructor(void *capsule);
const char *shim_dlpack_capsule_name(int versioned, int used);
/* The deleters exported tensors get: the Python ones (shim/exchange/dlpack_capsules.py), called with
 * signal handlers held from before the first bytecode to after the last (abi/shim_signals.h). */
void shim_dlpack_delete(DLManagedTensor *self);
void shim_dlpack_delete_versioned(DLManagedTensorVersioned *self);
