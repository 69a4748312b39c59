/* The native library's own API for DLPack (native_stubs/dlpack.c, shim/dlpack_capsules.py). See
 * abi/shim_calls.h for what every abi/shim_*.h header is.
 */

/* DLPack capsules: the destructor a capsule gets, which calls the managed tensor's deleter if
 * no consumer took the capsule, and the capsule names, which must outlive every capsule. */
void shim_dlpack_capsule_destructor(void *capsule);
const char *shim_dlpack_capsule_name(int versioned, int used);
/* The deleters exported tensors get: the Python ones (shim/dlpack_capsules.py), called with
 * signal handlers deferred from before the first bytecode to after the last. Inside (on the
 * calling thread), shim_interrupts_in_deleter() is nonzero and shim/interrupts.py only notes a
 * signal with shim_interrupts_note(signum); the deleter delivers it again (shim_signal_again) on
 * its way out. shim_signal_again(signum): Python's PyErr_SetInterruptEx, the signal's handler
 * runs at Python's next check for signals. */
void shim_dlpack_delete(DLManagedTensor *self);
void shim_dlpack_delete_versioned(DLManagedTensorVersioned *self);
int shim_interrupts_in_deleter(void);
void shim_interrupts_note(int signum);
void shim_signal_again(int signum);
