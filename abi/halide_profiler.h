/* Halide 21's profiler state (HalideRuntime.h, src/runtime/profiler_common.cpp), as cffi sees
 * it: what a pipeline built with the `profile` or `profile_by_timer` target feature keeps per
 * pipeline and per Func, read by shim/profiling/halide_profiler.py. The shim links Halide's standalone
 * host runtime, so these functions are Halide's own. Layouts are checked against the real
 * header by tests/test_abi.py.
 */

struct halide_mutex {
    uintptr_t _private[1];
};

struct halide_profiler_func_stats {
    uint64_t time;           /* ns, sampled (scaled to the calls' measured durations) */
    uint64_t memory_current;
    uint64_t memory_peak;
    uint64_t memory_total;
    uint64_t stack_peak;
    uint64_t active_threads_numerator, active_threads_denominator;
    const char *name;
    int num_allocs;
};

struct halide_profiler_pipeline_stats {
    uint64_t time;           /* ns, measured from start to end of each call */
    uint64_t memory_current;
    uint64_t memory_peak;
    uint64_t memory_total;
    uint64_t active_threads_numerator, active_threads_denominator;
    const char *name;
    struct halide_profiler_func_stats *funcs;
    void *next;
    int num_funcs;
    int runs;
    int samples;
    int num_allocs;
};

/* One running call of a pipeline, on the stack of the calling thread; listed in the state's
 * `instances` from the call's start to its end, when its figures are added to its pipeline's
 * stats (read by shim/profiling/halide_profiler.py: which pipelines have calls in flight). */
struct halide_profiler_instance_state {
    uint64_t billed_time;
    uint64_t start_time;
    uint64_t memory_current;
    uint64_t memory_peak;
    uint64_t memory_total;
    uint64_t active_threads_numerator, active_threads_denominator;
    struct halide_profiler_instance_state *next;
    struct halide_profiler_instance_state **prev_next;
    struct halide_profiler_pipeline_stats *pipeline_stats;
    struct halide_profiler_func_stats *funcs;
    int current_func;
    int active_threads;
    int samples;
    int num_allocs;
    int should_collect_statistics;
};

struct halide_profiler_state {
    struct halide_mutex lock;
    struct halide_profiler_pipeline_stats *pipelines;
    struct halide_thread *sampling_thread;
    struct halide_profiler_instance_state *instances;
    void (*get_remote_profiler_state)(int *func, int *active_workers);
    int sleep_time;
    int shutdown;
};

struct halide_profiler_state *halide_profiler_get_state(void);
struct halide_profiler_pipeline_stats *halide_profiler_get_pipeline_state(const char *pipeline_name);
void halide_profiler_reset(void);
void halide_profiler_report(void *user_context);
void halide_profiler_lock(struct halide_profiler_state *);
void halide_profiler_unlock(struct halide_profiler_state *);
