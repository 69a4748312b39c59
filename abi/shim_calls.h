/* The native library's own API, called from Python (cffi) and from the other C files: call
 * contexts, the calls that run in them and their streams.
 *
 * Like every abi/shim_*.h header: plain C that cffi's cdef parses too (no guards, no macros but
 * integer constants), included by the native library once, through native_stubs/shim_native.h.
 */

/* A call context: what one Python-initiated call into Halide code (a pipeline, or a runtime
 * function on a buffer) has to report back. halide_error and halide_print write into the context
 * of the calling thread; Halide's worker threads inherit the context of the call whose tasks
 * they run. Opaque to Python. */
typedef struct shim_call shim_call;

shim_call *shim_call_new(uint64_t id);
void shim_call_free(shim_call *call);
/* Make a finished context ready for the next call: new id, no text, default stream. */
void shim_call_reset(shim_call *call, uint64_t id);
uint64_t shim_call_id(const shim_call *call);

/* Make `call` the calling thread's context; returns the one it replaces, to hand back to
 * shim_call_leave. */
shim_call *shim_call_enter(shim_call *call);
void shim_call_leave(shim_call *previous);

/* Runs a pipeline's NAME_argv entry point with `call` as the calling thread's context. */
int shim_call_argv(shim_call *call, int (*argv_fn)(void **), void **argv);

/* The calling thread's device stream (shim.stream; NULL: the default), which pipeline calls
 * started from Python run on. */
void shim_thread_stream_set(void *stream);
void *shim_thread_stream(void);

/* A new call id (unique in the process). */
uint64_t shim_next_call_id(void);
/* Refuse the fast path's new calls (the interpreter is exiting); how many are still running.
 * shim_calls_running answers the same later. */
int shim_calls_close(void);
int shim_calls_running(void);

/* What shim_call_run returns instead of running the pipeline: one of `buffers` lives on a
 * device of the shim's that is not in `backends` (a bit mask of enum shim_backend), and the
 * pipeline cannot take it as it is (it runs on a GPU, or the data is only on the device). */
#define SHIM_CALL_NEEDS_PREPARATION 1
/* shim_call_reset(call, id), shim_call_set_stream(call, stream), then shim_call_argv, after
 * checking that every buffer in
 * `buffers` is on the host, on an interface the shim does not own, or on a backend in
 * `backends`: a prepared call's whole per-run bookkeeping in one C call. */
int shim_call_run(shim_call *call, uint64_t id, void *stream, int (*argv_fn)(void **),
                  void **argv, struct halide_buffer_t **buffers, int count, unsigned backends);

/* Text reported through halide_error / halide_print during the call ("" if none). */
const char *shim_call_errors(const shim_call *call);
const char *shim_call_prints(const shim_call *call);
/* Bytes of print output dropped because the context's print buffer was full. */
size_t shim_call_prints_dropped(const shim_call *call);

/* The calling thread's context (NULL outside any shim call). */
shim_call *shim_current_call(void);
/* Whether a pipeline's code is running in `call` now (shim_call_argv, on any of its threads). */
bool shim_call_in_pipeline(const shim_call *call);

/* The structs a call writes without reading (a fast call's numpy outputs, which have no
 * family in Python): `buffers` must outlive the call's run; NULL, 0 for none. A copy to the
 * device that has to allocate one leaves it clean, as the Python core leaves a running
 * call's outputs (runtime.allocate_behind_host): uploading what the call replaces is wasted. */
void shim_call_set_replaced(shim_call *call, struct halide_buffer_t *const *buffers, int count);
bool shim_call_replaces(const shim_call *call, const struct halide_buffer_t *buf);

/* The stream a call's CUDA work runs on (NULL: the backend's default stream). */
void shim_call_set_stream(shim_call *call, void *stream);
void *shim_call_stream(const shim_call *call);

/* A library was loaded (shim.load): MemorySanitizer's hooks look again for a library's own
 * definitions, which the shim's runtime calls for the messages it prints
 * (native_stubs/calls/msan.c). */
void shim_msan_libraries_changed(void);
