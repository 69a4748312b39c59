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

/* The fast paths' types, PyObject *s, borrowed, to be called with the GIL held (not cffi calls:
 * see shim/native.py): a pipeline's call plan (native_stubs/fastcall.c), a prepared call's
 * run (native_stubs/prepared_call.c) and the base of an allocation family
 * (native_stubs/family_state.c) and a Buffer's plans in it (native_stubs/shared_records.c), and the base of objects whose finalizer
 * Ctrl-C must not cut short (native_stubs/finalizers.c). */
void *shim_fastcall_plan_type(void);
void *shim_prepared_run_type(void);
void *shim_family_state_type(void);
void *shim_lock_state_type(void);
void *shim_member_plans_type(void);
void *shim_finalized_type(void);

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

/* Atomic reads and updates of halide_buffer_t::flags for Python, which must never read-modify-
 * write the word itself: generated code and other threads change it concurrently. */
uint64_t shim_flags_get(const struct halide_buffer_t *buf);
void shim_flags_assign(struct halide_buffer_t *buf, uint64_t bits, bool value);

/* A flag bit of the shim's own, above Halide's dirty bits (which generated code and Halide's
 * buffer helpers update without touching other bits): set on every member of a shared family
 * (a Buffer with crops or slices). Such a member's dirty bits are derived from the family's
 * regions, so both can be set at once without a conflict (a parent with one crop newer on the
 * device and a disjoint one newer on the host); the native layer leaves that case to the
 * Python core, which knows the regions (shim/aliasing.py). */
#define SHIM_BUFFER_FLAG_REGIONS 65536

/* The backends whose halide_device_interface_t the shim provides: one interface per backend
 * in the process, whichever pipeline asks for it. */
enum shim_backend {
    SHIM_BACKEND_HOST = 0,   /* a simulated device in host memory, for tests */
    SHIM_BACKEND_OPENCL = 1,
    SHIM_BACKEND_CUDA = 2,
    /* Not a device: the interface a crop carries while its parent has no device allocation.
     * It stands for "the parent's allocation, not yet made"; the crop's first device use
     * allocates the parent on the device asked for and makes the crop alias it. */
    SHIM_BACKEND_PROXY = 3,
    SHIM_BACKEND_COUNT = 4
};

const struct halide_device_interface_t *shim_backend_interface(int backend);
/* The backend whose interface this is, or -1 if the shim does not own it. */
int shim_backend_of(const struct halide_device_interface_t *device_interface);

/* The calling thread's context (NULL outside any shim call). */
shim_call *shim_current_call(void);
/* Whether a pipeline's code is running in `call` now (shim_call_argv, on any of its threads). */
bool shim_call_in_pipeline(const shim_call *call);

/* Atomic stores Python uses for the device fields; release order, so that a fast path that
 * sees a device handle also sees the interface stored before it. */
void shim_buffer_set_device(struct halide_buffer_t *buf, uint64_t device,
                            const struct halide_device_interface_t *device_interface);

/* Halide's host allocator (from the standalone runtime), for device_and_host_malloc. */
void *halide_malloc(void *user_context, size_t size);
void halide_free(void *user_context, void *ptr);

/* The stream a call's CUDA work runs on (NULL: the backend's default stream). */
void shim_call_set_stream(shim_call *call, void *stream);
void *shim_call_stream(const shim_call *call);

/* OpenCL (native_stubs/opencl.c). A device handle points to one of these; the first two
 * fields are Halide's own handle layout. */
typedef struct shim_cl_staging shim_cl_staging;
typedef struct shim_cl_handle {
    uint64_t offset;   /* bytes from the start of mem to the buffer's min element */
    void *mem;         /* cl_mem of the allocation */
    void *launch_mem;  /* what kernels get: mem or a sub-buffer; NULL if offset is misaligned */
    shim_cl_staging *staging;  /* launches' copy of a misaligned crop, kept for the next one */
} shim_cl_handle;

typedef struct shim_cl_module shim_cl_module;
/* Bind launches to the ICD loader pyopencl uses and to the backend's context and queue. */
int shim_opencl_bind(const char *loader, void *context, void *queue);
/* `source`: the program's (size bytes), for what its kernels' prototypes say. */
shim_cl_module *shim_opencl_module_new(void *program, const char *source, size_t size);
/* Free what launches keep in a handle (its staging buffer), before the handle goes. */
void shim_opencl_handle_release(shim_cl_handle *handle);
/* Halide's OpenCL preferences (halide_opencl_set_*), NULL if unset. */
const char *halide_opencl_get_platform_name(void *user_context);
const char *halide_opencl_get_device_type(void *user_context);
const char *halide_opencl_get_build_options(void *user_context);

/* CUDA (native_stubs/cuda.c). */
typedef struct shim_cuda_module shim_cuda_module;
int shim_cuda_bind(const char *driver, void *context);
shim_cuda_module *shim_cuda_module_new(void *module, void *context);
/* Acquire the CUDA context (halide_cuda_acquire_context) and push it; leave pops and releases
 * it. Every driver call the Python backend makes is between the two. */
int shim_cuda_enter(void *user_context, void **ctx);
void shim_cuda_leave(void *user_context);

/* DLPack capsules (native_stubs/dlpack.c): the destructor a capsule gets, which calls the
 * managed tensor's deleter if no consumer took the capsule, and the capsule names, which must
 * outlive every capsule. */
void shim_dlpack_capsule_destructor(void *capsule);
const char *shim_dlpack_capsule_name(int versioned, int used);
/* The deleters exported tensors get: the Python ones (shim/dlpack.py), called with Ctrl-C
 * deferred from before the first bytecode to after the last. Inside (on the calling thread),
 * shim_interrupts_in_deleter() is nonzero and shim/interrupts.py only notes a SIGINT with
 * shim_interrupts_note(); the deleter raises it again (PyErr_SetInterrupt) on its way out. */
void shim_dlpack_delete(DLManagedTensor *self);
void shim_dlpack_delete_versioned(DLManagedTensorVersioned *self);
int shim_interrupts_in_deleter(void);
void shim_interrupts_note(void);

/* Profiling (native_stubs/profile.c, shim/profiler.py). While it is on, the generic entry
 * points count the calls they decide in C, per function and outcome, without entering Python,
 * and kernel launches are reported to Python around the launch. While it is off, each of those
 * places costs one relaxed atomic load. */
enum shim_function {
    SHIM_FN_COPY_TO_HOST = 0,
    SHIM_FN_COPY_TO_DEVICE = 1,
    SHIM_FN_DEVICE_MALLOC = 2,
    SHIM_FN_DEVICE_FREE = 3,
    SHIM_FN_DEVICE_SYNC = 4,
    SHIM_FN_DEVICE_AND_HOST_MALLOC = 5,
    SHIM_FN_DEVICE_AND_HOST_FREE = 6,
    SHIM_FN_WRAP_NATIVE = 7,
    SHIM_FN_DETACH_NATIVE = 8,
    SHIM_FN_DEVICE_CROP = 9,
    SHIM_FN_DEVICE_SLICE = 10,
    SHIM_FN_DEVICE_RELEASE_CROP = 11,
    SHIM_FN_BUFFER_COPY = 12,
    SHIM_FN_COUNT = 13
};

enum shim_outcome {
    SHIM_OUTCOME_NOOP = 0,    /* nothing to do, decided from the buffer's fields */
    SHIM_OUTCOME_FOREIGN = 1, /* dispatched to an interface the shim does not own */
    SHIM_OUTCOME_REFUSED = 2, /* failed validation (the result is Halide's error code) */
    SHIM_OUTCOME_COUNT = 3
};

void shim_profile_enable(bool on);
/* Counts since the last reset; reset while profiling is off. */
uint64_t shim_profile_count(int function, int outcome);
void shim_profile_reset(void);

/* A kernel launch as the profiler sees it. */
typedef struct shim_launch {
    int backend; /* enum shim_backend */
    const char *kernel;
    int blocks[3];
    int threads[3];
    int shared_mem_bytes;
    void *stream; /* the CUDA stream or OpenCL queue it is enqueued on */
} shim_launch;
