/* The native library's own API for DLPack (native_stubs/dlpack.c, shim/dlpack_capsules.py). See
 * abi/shim_calls.h for what every abi/shim_*.h header is.
 */

/* DLPack capsules: the destructor a capsule gets, which calls the managed tensor's deleter if
 * no consumer took the capsule, and the capsule names, which must outlive every capsule. */
void shim_dlpack_capsule_destructor(void *capsule);
const char *shim_dlpack_capsule_name(int versioned, int used);
/* The deleters exported tensors get: the Python ones (shim/dlpack_capsules.py), called with Ctrl-C
 * deferred from before the first bytecode to after the last. Inside (on the calling thread),
 * shim_interrupts_in_deleter() is nonzero and shim/interrupts.py only notes a SIGINT with
 * shim_interrupts_note(); the deleter raises it again (PyErr_SetInterrupt) on its way out. */
void shim_dlpack_delete(DLManagedTensor *self);
void shim_dlpack_delete_versioned(DLManagedTensorVersioned *self);
int shim_interrupts_in_deleter(void);
void shim_interrupts_note(void);
