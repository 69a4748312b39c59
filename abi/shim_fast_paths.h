/* The native library's fast paths, as Python gets them. See abi/shim_calls.h for what every
 * abi/shim_*.h header is.
 */

/* The fast paths' types, PyObject *s, borrowed, to be called with the GIL held (not cffi calls:
 * see shim/native/__init__.py): a pipeline's call plan (native_stubs/fast/fastcall.c), a prepared call's
 * run (native_stubs/fast/prepared_call.c) and the base of an allocation family
 * (native_stubs/fast/family_state.c) and a Buffer's plans in it (native_stubs/fast/shared_records.c),
 * the bases of objects whose finalizer, or whose with statement's entering and leaving, a
 * signal handler's exception must not cut short (native_stubs/calls/signals_held.c), and
 * Finalized's subtype that exports a buffer (shim.Buffer's base: native_stubs/calls/host_export.c). */
void *shim_fastcall_plan_type(void);
void *shim_prepared_run_type(void);
void *shim_family_state_type(void);
void *shim_lock_state_type(void);
void *shim_member_plans_type(void);
void *shim_finalized_type(void);
void *shim_held_context_type(void);
void *shim_host_exporter_type(void);

/* Where a shim.Buffer's family lives (shim/memory/families.py: its registry of Buffers' structs,
 * Family and FamilyLock), for the served allocations of Buffers' structs
 * (native_stubs/fast/buffer_families.c): PyObject *s, called once with the GIL held (ctypes, as
 * the types above); 1 if taken. */
int shim_buffer_families_watch(void *owned, void *family_type, void *lock_type);

/* The one subclass of Finalized whose instances have nothing to finalize when nothing else
 * references them and their slot named `slot` holds anything but None
 * (native_stubs/calls/signals_held.c): PyObject *s (the class, the slot's name), as above; 1 if
 * taken. */
int shim_finalized_skip_when_alone(void *type, void *slot);
