/* The native library's own API, called from Python (cffi) and from the other C files.
 * Plain C without guards or macros so cffi's cdef parser reads it too.
 */

/* A call context: what one Python-initiated call into Halide code (a pipeline, or a runtime
 * function on a buffer) has to report back. halide_error and halide_print write into the context
 * of the calling thread; Halide's worker threads inherit the context of the call whose tasks
 * they run. Opaque to Python. */
typedef struct shim_call shim_call;

shim_call *shim_call_new(uint64_t id);
void shim_call_free(shim_call *call);
uint64_t shim_call_id(const shim_call *call);

/* Make `call` the calling thread's context; returns the one it replaces, to hand back to
 * shim_call_leave. */
shim_call *shim_call_enter(shim_call *call);
void shim_call_leave(shim_call *previous);

/* Runs a pipeline's NAME_argv entry point with `call` as the calling thread's context. */
int shim_call_argv(shim_call *call, int (*argv_fn)(void **), void **argv);

/* Text reported through halide_error / halide_print during the call ("" if none). */
const char *shim_call_errors(const shim_call *call);
const char *shim_call_prints(const shim_call *call);
/* Bytes of print output dropped because the context's print buffer was full. */
size_t shim_call_prints_dropped(const shim_call *call);

/* Atomic reads and updates of halide_buffer_t::flags for Python, which must never read-modify-
 * write the word itself: generated code and other threads change it concurrently. */
uint64_t shim_flags_get(const struct halide_buffer_t *buf);
void shim_flags_assign(struct halide_buffer_t *buf, uint64_t bits, bool value);
