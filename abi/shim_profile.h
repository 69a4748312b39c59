/* The native library's own API for profiling. See abi/shim_calls.h for what every abi/shim_*.h
 * header is.
 */

/* Profiling (native_stubs/profiling/profile.c, shim/profiling/profiler.py). While it is on, the generic entry
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
    SHIM_OUTCOME_SERVED = 3,  /* done in C, data moved (halide_buffer_copy between hosts) */
    SHIM_OUTCOME_COUNT = 4
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

/* Halide's profiler states (native_stubs/profiling/halide_profiler.c, read by
 * shim/profiling/halide_profiler.py), one per profiler ABI (shim/base/releases.py:
 * Release.profiler_abi): 0, Halide 21's runtime's (halide_profiler_get_state), serving Halide
 * 19 and 21 libraries; 1, the shim's own serving Halide 22 libraries, laid out as Halide's
 * halide_profiler_state whose pipelines are struct halide22_profiler_pipeline_stats. NULL, or
 * nothing done, for another `abi`. The lock guards the lists of pipelines and of calls in
 * flight, and what calls add to the pipelines' figures as they end. */
struct halide_profiler_state *shim_profiler_state(int abi);
void shim_profiler_lock(int abi);
void shim_profiler_unlock(int abi);
/* The state's report, through halide_print (ABI 0: Halide 21's own report; 1: a subset of
 * Halide 22's, native_stubs/profiling/profiler22_report.c). Takes the lock. */
void shim_profiler_report(int abi, void *user_context);
