/* Halide 22's runtime ABI where it differs from Halide 21's, as the shim's own declarations:
 * written from Halide's src/runtime/HalideRuntime.h at abbf7ff983 (main on 2026-08-22, which
 * will be Halide 22; nothing later), checked against no compiler of Halide 22's, since none is
 * released. Every name carries `halide22_` where Halide's is the same as a Halide 21 one with
 * another meaning, so that the native library, which includes Halide 21's header, can hold both.
 * shim/base/releases.py says which release a library was built by; what is the same in both
 * (halide_buffer_t, the device interface, halide_profiler_instance_state, halide_profiler_state,
 * the filter metadata) is Halide 21's header's. cffi reads this file too (native_stubs/build.py).
 * Like the other abi/ headers: plain C, no guards, no macros but integer constants.
 */

/* halide_type_t's third field is `reserved` and 0 (PR 9205): a buffer of scalar elements,
 * whatever its type, holds 0 there; generated code compares all 32 bits of a buffer's type. */
enum {
    HALIDE22_TYPE_RESERVED = 0
};

/* The error code Halide 22 adds (PR 9126), which Halide 21's enum lacks, and the error function
 * its Arm SME2 code calls (the shim defines it for every library, as Halide 22's runtime does). */
enum halide22_error_code_t {
    halide_error_code_streaming_vscale_invalid = -49
};
int halide_error_streaming_vscale_invalid(void *user_context, const char *func_name,
                                          int runtime_vscale, int compiletime_vscale);

/* halide_can_use_target_features' answers (PR 9320): a dispatcher reads bit 0 as "usable",
 * bit 1 as "ask again next time". */
enum {
    halide22_can_use_target_never = 0,
    halide22_can_use_target_always = 1,
    halide22_can_use_target_not_right_now = 2,
    halide22_can_use_target_for_the_moment = 3
};

/* --- the profiler (PRs 9157, 9164, 9344) ------------------------------------------------ */

/* What an entry of a pipeline's profile is. */
enum halide22_profiler_func_kind {
    halide22_profiler_func_kind_func = 0,
    halide22_profiler_func_kind_overhead = 1,
    halide22_profiler_func_kind_thread_idle = 2,
    halide22_profiler_func_kind_malloc = 3,
    halide22_profiler_func_kind_free = 4,
    halide22_profiler_func_kind_copy_to_host = 5,
    halide22_profiler_func_kind_copy_to_device = 6,
    halide22_profiler_func_kind_allocation = 7
};

/* One entry of a pipeline's profile: 192 bytes, 8-aligned. Generated code adds to the fields
 * from memory_total on (halide_profiler_update_counters, inlined into it); the runtime adds a
 * finished call's to its pipeline's, all of them from memory_total to the end. */
struct halide22_profiler_func_stats {
    const char *name;
    int parent;              /* the entry of the enclosing producer, -1 at the root */
    int canonical_id;        /* the first entry of the same Func */
    int kind;                /* enum halide22_profiler_func_kind */
    int buffer_func_id;      /* copies: the canonical entry of the Func copied, else -1 */
    uint32_t counters_approximated; /* bit i: counter i (memory_total...) is an upper bound */
    uint32_t padding_;
    uint64_t time;           /* ns, sampled, scaled to the call's measured duration */
    uint64_t memory_current;
    uint64_t memory_peak;
    uint64_t stack_peak;
    uint64_t memory_total;
    uint64_t active_threads_numerator, active_threads_denominator;
    uint64_t num_allocs;
    uint64_t parallel_loops;
    uint64_t parallel_tasks;
    uint64_t points_required_at_root;
    uint64_t points_computed;
    uint64_t scalar_loads;
    uint64_t vector_loads;
    uint64_t gathers;
    uint64_t bytes_loaded;
    uint64_t scalar_stores;
    uint64_t vector_stores;
    uint64_t scatters;
    uint64_t bytes_stored;
};

/* A pipeline's totals: 104 bytes. */
struct halide22_profiler_pipeline_stats {
    uint64_t time;
    uint64_t memory_current;
    uint64_t memory_peak;
    uint64_t memory_total;
    uint64_t active_threads_numerator, active_threads_denominator;
    uint64_t native_vector_bytes;
    const char *name;
    struct halide22_profiler_func_stats *funcs;
    void *next;
    int num_funcs;
    int runs;
    int billed_runs;         /* runs that got a sample: what time per run divides by */
    int samples;
    int num_allocs;
};

/* The start of a call of a profiled pipeline: 11 arguments where Halide 21's takes 5. The
 * instance state (struct halide_profiler_instance_state) is laid out as Halide 21's; its
 * `funcs` are halide22_profiler_func_stats. */
typedef int (*halide22_profiler_instance_start_t)(
    void *user_context, const char *pipeline_name, int num_funcs, const char *const *func_names,
    const int *func_parents, const int *func_canonical_ids, const int *func_kinds,
    const int *func_buffer_func_ids, const uint32_t *func_counters_approximated,
    uint64_t native_vector_bytes, struct halide_profiler_instance_state *instance);

/* --- tracing (PRs 9192, 9205) ------------------------------------------------------------ */

/* Event codes 0 to 10 are Halide 21's; Halide 22 brackets each iteration of a traced parallel
 * loop: */
enum {
    halide22_trace_begin_parallel_task = 11,
    halide22_trace_end_parallel_task = 12
};

/* A trace event: 64 bytes. `type` is the scalar element's (reserved 0), `lanes` the width of a
 * vector load or store; `thread_id` is set on begin_parallel_task events (0 on the others). */
struct halide22_trace_event_t {
    const char *func;
    void *value;
    int32_t *coordinates;
    const char *trace_tag;
    struct halide_type_t type;
    int32_t lanes;
    int32_t event;
    int32_t parent_id;
    int32_t thread_id;
    int32_t value_index;
    int32_t dimensions;
};

/* What generated code calls for every event: 13 arguments, `thread_id` after `parent_id`
 * (Halide 21's halide_trace_helper takes 12). */
typedef int (*halide22_trace_helper_t)(void *user_context, const char *func, void *value,
                                       int *coords, int type_code, int type_bits, int type_lanes,
                                       int code, int parent_id, int thread_id, int value_index,
                                       int dimensions, const char *trace_tag);

/* The calling thread's id (the OS's; never 0), which generated code passes with
 * begin_parallel_task events. New in Halide 22; the shim defines it for every library. */
int32_t halide_current_thread_id(void);
