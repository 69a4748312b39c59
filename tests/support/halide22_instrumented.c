/* Pipelines as Halide 22's generated code makes them with its profiler (-profile) and its
 * tracing (-trace_all) built in, written by hand on the shim's declarations of Halide 22's ABI
 * (abi/halide22_runtime.h), as tests/support/halide22_pipelines.c writes Halide 22's plain
 * pipelines. Built at test time into a no_runtime library (tests/support/releases.py:
 * build_c_library) that shim.load registers as Halide 22's (0 in its metadata types' third
 * field); every runtime function it calls is the shim's. What each does with the runtime is
 * what Halide 22's src/Profiling.cpp and src/Tracing.cpp at abbf7ff983 make a pipeline do, in
 * that order (and src/runtime/profiler_inlined.cpp, inlined into the pipeline, below), so that
 * the tests know every figure the shim should report from the numbers here.
 *
 * - h22_prof(input: uint8 2-D, work: int32, fail_at: int32, hold: int32, output: uint8 2-D),
 *   built with the profiler. output(x, y) = 2 * input(x, y) + 4 (mod 256), through two stages:
 *   stage_a (uint16, compute_root, on the heap: W * H * 2 bytes) = 2 * input; and, per row of
 *   the output, in a parallel loop over the rows (one task a row, halide_do_par_for),
 *   stage_b (uint16, computed in chunks of CHUNK into a stack buffer of CHUNK * 2 bytes) =
 *   stage_a + 4, spinning `work` iterations a row so that the sampler sees it. Its entries:
 *   0 overhead, 1 thread idle, 2 malloc, 3 free, 4 stage_a (root), 5 out (root), 6 stage_b
 *   (inside out; its gathers marked approximate). Its counters per call (W x H):
 *     stage_a: memory_total W*H*2, num_allocs 1, points_required_at_root = points_computed =
 *       W*H, scalar_loads W*H, bytes_loaded W*H, vector_stores (W*H)/VECTOR and scalar_stores
 *       (W*H)%VECTOR, bytes_stored W*H*2;
 *     out: parallel_loops 1, parallel_tasks H, points_required_at_root = points_computed =
 *       W*H, vector_loads H*(W/VECTOR) and scalar_loads H*(W%VECTOR) of stage_b, bytes_loaded
 *       W*H*2, vector_stores H*(W/VECTOR), scalar_stores H*(W%VECTOR), bytes_stored W*H;
 *     stage_b: points_required_at_root = points_computed = W*H, gathers W*H (approximate),
 *       bytes_loaded W*H*2, scalar_stores W*H, bytes_stored W*H*2; stack peak CHUNK * 2.
 *   fail_at 1: fails (halide_error, then -1) once stage_a is computed; 2: the task of the
 *   middle row fails. hold != 0: the task of row 0 waits until h22_release() (h22_held() says
 *   it is waiting).
 * - h22_trace(input: uint8 2-D, output: uint8 2-D), built with -trace_all: Funcs out22 (the
 *   output) and row22, the ImageParam in22. A parallel loop over the rows of the output
 *   (out22.s0.y, one task a row), each task realizing row22, the input's row plus 1, with
 *   vector stores of VECTOR_TRACE lanes (its loads of the input as vectors too), then
 *   output(x, y) = 2 * row22(x), a scalar load of row22 and a scalar store a point. Each
 *   event's parent is the innermost scope around it (the task for what it emits), each task
 *   passes halide_current_thread_id() with its begin. The task of the loop's first row waits
 *   (a few seconds at most) for another task to begin, so that tasks run on two threads where
 *   the pool has them. Its width must be a multiple of VECTOR_TRACE.
 * - h22_install_trace_handler(chain) / h22_uninstall_trace_handler(): a handler this library's
 *   own code installs with halide_set_custom_trace, which therefore takes Halide 22's events;
 *   it keeps the first MAX_SEEN (h22_seen_count(), h22_seen()), and where `chain` passes each
 *   on to halide_default_trace.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "HalideRuntime.h"
#include "halide22_runtime.h"
#include "halide22_generated.h"

/* The runtime functions Halide 22's generated code calls, as it calls them. */
int halide_profiler_instance_start(void *user_context, const char *pipeline_name, int num_funcs,
                                   const char *const *func_names, const int *func_parents,
                                   const int *func_canonical_ids, const int *func_kinds,
                                   const int *func_buffer_func_ids,
                                   const uint32_t *func_counters_approximated,
                                   uint64_t native_vector_bytes,
                                   struct halide_profiler_instance_state *instance);
int halide_profiler_instance_end(void *user_context, struct halide_profiler_instance_state *instance);
void halide_profiler_memory_allocate(void *user_context,
                                     struct halide_profiler_instance_state *instance, int func_id,
                                     uint64_t incr);
void halide_profiler_memory_free(void *user_context, struct halide_profiler_instance_state *instance,
                                 int func_id, uint64_t decr);
void halide_profiler_stack_peak_update(void *user_context,
                                       struct halide_profiler_instance_state *instance,
                                       uint64_t *f_values);
int halide_trace_helper(void *user_context, const char *func, void *value, int *coords,
                        int type_code, int type_bits, int type_lanes, int code, int parent_id,
                        int thread_id, int value_index, int dimensions, const char *trace_tag);

static uint8_t *at(const halide_buffer_t *buf, int x, int y) {
    return buf->host + (int64_t)(x - buf->dim[0].min) * buf->dim[0].stride +
           (int64_t)(y - buf->dim[1].min) * buf->dim[1].stride;
}

/* ==== the profiler =========================================================================
 * Halide 22's src/runtime/profiler_inlined.cpp: compiled into every pipeline, inlined. */

typedef struct halide_profiler_instance_state instance_t;
typedef struct halide22_profiler_func_stats func_stats;

static inline void set_current_func(instance_t *instance, int func, int *sampling_token) {
    if (sampling_token == NULL || *sampling_token == 0) {
        volatile int *ptr = &instance->current_func;
        __asm__ volatile("" ::: "memory");
        *ptr = func;
        __asm__ volatile("" ::: "memory");
    }
}

static inline void enable_instance(instance_t *instance) {
    instance->should_collect_statistics = 1;
}

static inline void acquire_sampling_token(int32_t *shared, int32_t *local) {
    *local = __atomic_exchange_n(shared, 1, __ATOMIC_ACQUIRE);
}

static inline void release_sampling_token(int32_t *shared, int32_t *local) {
    if (*local == 0) {
        __atomic_store_n(shared, 0, __ATOMIC_RELEASE);
        *local = 1;
    }
}

static inline void incr_active_threads(instance_t *instance) {
    __atomic_fetch_add(&instance->active_threads, 1, __ATOMIC_SEQ_CST);
}

static inline void decr_active_threads(instance_t *instance) {
    __atomic_fetch_sub(&instance->active_threads, 1, __ATOMIC_SEQ_CST);
}

/* Counters in update_counters' order. */
enum {
    C_MEMORY_TOTAL, C_NUM_ALLOCS, C_PARALLEL_LOOPS, C_PARALLEL_TASKS, C_POINTS_REQUIRED_AT_ROOT,
    C_POINTS_COMPUTED, C_SCALAR_LOADS, C_VECTOR_LOADS, C_GATHERS, C_BYTES_LOADED,
    C_SCALAR_STORES, C_VECTOR_STORES, C_SCATTERS, C_BYTES_STORED, C_COUNT
};

static inline void update_counters(instance_t *instance, int id, const uint64_t c[C_COUNT]) {
    func_stats *f = (func_stats *)instance->funcs + id;
    uint64_t *fields[C_COUNT] = {
        &f->memory_total, &f->num_allocs, &f->parallel_loops, &f->parallel_tasks,
        &f->points_required_at_root, &f->points_computed, &f->scalar_loads, &f->vector_loads,
        &f->gathers, &f->bytes_loaded, &f->scalar_stores, &f->vector_stores, &f->scatters,
        &f->bytes_stored};
    for (int i = 0; i < C_COUNT; i++) {
        if (c[i]) {
            __atomic_fetch_add(fields[i], c[i], __ATOMIC_SEQ_CST);
        }
    }
    if (c[C_MEMORY_TOTAL]) {
        __atomic_add_fetch(&instance->memory_total, c[C_MEMORY_TOTAL], __ATOMIC_SEQ_CST);
    }
    if (c[C_NUM_ALLOCS]) {
        __atomic_add_fetch(&instance->num_allocs, (int)c[C_NUM_ALLOCS], __ATOMIC_SEQ_CST);
    }
}

enum { OVERHEAD, THREAD_IDLE, MALLOC, FREE, STAGE_A, OUT, STAGE_B, ENTRIES };
enum { CHUNK = 64, VECTOR = 16 };

static const char *const entry_names[ENTRIES] = {"overhead", "thread idle", "malloc", "free",
                                                 "stage_a", "out", "stage_b"};

/* The block the generated code puts on its stack: the instance, then its entries. */
typedef union {
    uint64_t words[(sizeof(instance_t) + ENTRIES * sizeof(func_stats) + 7) / 8];
    instance_t instance;
} instance_block;

/* h22_release() lets the held task go on; h22_held(): how many tasks are waiting. */
static int held_count, released;

int h22_held(void) {
    return __atomic_load_n(&held_count, __ATOMIC_SEQ_CST);
}

void h22_release(void) {
    __atomic_store_n(&released, 1, __ATOMIC_SEQ_CST);
}

/* Waits for h22_release(); -1 after two minutes, rather than hang a test. */
static int wait_for_release(void) {
    __atomic_add_fetch(&held_count, 1, __ATOMIC_SEQ_CST);
    struct timespec pause = {0, 200000};
    for (int i = 0; i < 600000 && !__atomic_load_n(&released, __ATOMIC_SEQ_CST); i++) {
        nanosleep(&pause, NULL);
    }
    __atomic_sub_fetch(&held_count, 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&released, __ATOMIC_SEQ_CST) ? 0 : -1;
}

typedef struct {
    instance_t *instance;
    int32_t *shared_token;
    const uint16_t *stage_a;
    int width, x0, y0;
    halide_buffer_t *output;
    int32_t work, fail_at, hold, height;
} prof_closure;

/* One row of the output: a task of the parallel loop, as Halide 22 instruments it. */
static int prof_row(void *uc, int y, uint8_t *closure_) {
    prof_closure *c = (prof_closure *)closure_;
    instance_t *instance = c->instance;
    incr_active_threads(instance);
    set_current_func(instance, OUT, NULL);
    int32_t token;
    acquire_sampling_token(c->shared_token, &token);
    /* Counters of a parallel task: on its stack, flushed once at its end. */
    uint64_t out_counters[C_COUNT] = {0}, b_counters[C_COUNT] = {0};
    int result = 0;
    if (c->hold && y == c->y0) {
        result = wait_for_release();
    }
    if (c->fail_at == 2 && y == c->y0 + c->height / 2) {
        halide_error(uc, "h22_prof: a task failed on purpose\n");
        result = -1;
    }
    for (int x = c->x0; result == 0 && x < c->x0 + c->width; x += CHUNK) {
        int n = c->x0 + c->width - x < CHUNK ? c->x0 + c->width - x : CHUNK;
        uint16_t stage_b[CHUNK]; /* on the stack: its peak was given at the start */
        set_current_func(instance, STAGE_B, &token);
        volatile uint32_t spin = 0;
        for (int32_t i = 0; i < c->work / ((c->width + CHUNK - 1) / CHUNK); i++) {
            spin += (uint32_t)i;
        }
        for (int i = 0; i < n; i++) {
            stage_b[i] = (uint16_t)(c->stage_a[(int64_t)(y - c->y0) * c->width + (x - c->x0) + i] + 4);
        }
        b_counters[C_POINTS_COMPUTED] += (uint64_t)n;
        b_counters[C_GATHERS] += (uint64_t)n;
        b_counters[C_BYTES_LOADED] += 2 * (uint64_t)n;
        b_counters[C_SCALAR_STORES] += (uint64_t)n;
        b_counters[C_BYTES_STORED] += 2 * (uint64_t)n;
        set_current_func(instance, OUT, &token);
        for (int i = 0; i < n; i++) {
            *at(c->output, x + i, y) = (uint8_t)stage_b[i];
        }
        out_counters[C_POINTS_COMPUTED] += (uint64_t)n;
        out_counters[C_VECTOR_LOADS] += (uint64_t)(n / VECTOR);
        out_counters[C_SCALAR_LOADS] += (uint64_t)(n % VECTOR);
        out_counters[C_BYTES_LOADED] += 2 * (uint64_t)n;
        out_counters[C_VECTOR_STORES] += (uint64_t)(n / VECTOR);
        out_counters[C_SCALAR_STORES] += (uint64_t)(n % VECTOR);
        out_counters[C_BYTES_STORED] += (uint64_t)n;
    }
    update_counters(instance, OUT, out_counters);
    update_counters(instance, STAGE_B, b_counters);
    release_sampling_token(c->shared_token, &token);
    decr_active_threads(instance);
    set_current_func(instance, THREAD_IDLE, NULL);
    return result;
}

static int prof_body(void *uc, instance_t *instance, halide_buffer_t *input, int32_t work,
                     int32_t fail_at, int32_t hold, halide_buffer_t *output) {
    static const int parents[ENTRIES] = {-1, -1, -1, -1, -1, -1, OUT};
    static const int canonical[ENTRIES] = {0, 1, 2, 3, 4, 5, 6};
    static const int kinds[ENTRIES] = {
        halide22_profiler_func_kind_overhead, halide22_profiler_func_kind_thread_idle,
        halide22_profiler_func_kind_malloc,   halide22_profiler_func_kind_free,
        halide22_profiler_func_kind_func,     halide22_profiler_func_kind_func,
        halide22_profiler_func_kind_func};
    static const int buffer_func_ids[ENTRIES] = {-1, -1, -1, -1, -1, -1, -1};
    static const uint32_t approximated[ENTRIES] = {0, 0, 0, 0, 0, 0, 1u << C_GATHERS};
    int err = halide_profiler_instance_start(uc, "h22_prof", ENTRIES, entry_names, parents,
                                             canonical, kinds, buffer_func_ids, approximated,
                                             32, instance);
    if (err != 0) {
        return err;
    }
    int32_t shared_token = 0;
    incr_active_threads(instance);
    set_current_func(instance, OVERHEAD, NULL);
    uint64_t stack_peaks[ENTRIES] = {0, 0, 0, 0, 0, 0, CHUNK * sizeof(uint16_t)};
    halide_profiler_stack_peak_update(uc, instance, stack_peaks);
    err = check_elementwise(uc, input, output, TYPE22(halide_type_uint, 8));
    if (err != 0) {
        decr_active_threads(instance);
        return err == H22_QUERIED ? 0 : err;
    }
    int width = output->dim[0].extent, height = output->dim[1].extent;
    int x0 = output->dim[0].min, y0 = output->dim[1].min;
    uint64_t points = (uint64_t)width * (uint64_t)height, bytes_a = points * sizeof(uint16_t);
    /* The counters that hoist out of every loop, before the marker. */
    uint64_t root[ENTRIES][C_COUNT] = {{0}};
    root[STAGE_A][C_POINTS_REQUIRED_AT_ROOT] = points;
    root[OUT][C_POINTS_REQUIRED_AT_ROOT] = points;
    root[STAGE_B][C_POINTS_REQUIRED_AT_ROOT] = points;
    root[STAGE_A][C_MEMORY_TOTAL] = bytes_a;
    root[STAGE_A][C_NUM_ALLOCS] = 1;
    for (int id = 0; id < ENTRIES; id++) {
        update_counters(instance, id, root[id]);
    }
    enable_instance(instance);

    /* stage_a, compute_root, on the heap */
    set_current_func(instance, MALLOC, NULL);
    halide_profiler_memory_allocate(uc, instance, STAGE_A, bytes_a);
    uint16_t *stage_a = halide_malloc(uc, bytes_a);
    if (stage_a == NULL) {
        decr_active_threads(instance);
        return halide_error_out_of_memory(uc);
    }
    set_current_func(instance, STAGE_A, NULL);
    for (int y = 0; y < height; y++) {
        for (int x = 0; x < width; x++) {
            stage_a[(int64_t)y * width + x] = (uint16_t)(2 * *at(input, x0 + x, y0 + y));
        }
    }
    uint64_t a_counters[C_COUNT] = {0};
    a_counters[C_POINTS_COMPUTED] = points;
    a_counters[C_SCALAR_LOADS] = points;
    a_counters[C_BYTES_LOADED] = points;
    a_counters[C_VECTOR_STORES] = points / VECTOR;
    a_counters[C_SCALAR_STORES] = points % VECTOR;
    a_counters[C_BYTES_STORED] = bytes_a;
    update_counters(instance, STAGE_A, a_counters);
    if (fail_at == 1) {
        halide_error(uc, "h22_prof: failed on purpose once stage_a was computed\n");
        err = -1;
    }

    /* out: a parallel loop over its rows */
    if (err == 0) {
        set_current_func(instance, OUT, NULL);
        uint64_t loop[C_COUNT] = {0};
        loop[C_PARALLEL_LOOPS] = 1;
        loop[C_PARALLEL_TASKS] = (uint64_t)height;
        update_counters(instance, OUT, loop);
        prof_closure closure = {instance, &shared_token, stage_a, width, x0, y0, output,
                                work, fail_at, hold, height};
        decr_active_threads(instance);
        set_current_func(instance, THREAD_IDLE, NULL);
        err = halide_do_par_for(uc, prof_row, y0, height, (uint8_t *)&closure);
        incr_active_threads(instance);
        set_current_func(instance, OUT, NULL);
    }

    /* stage_a's free: on the way out whatever happened (its destructor); counted where the
     * Free is reached */
    if (err == 0) {
        set_current_func(instance, FREE, NULL);
        halide_profiler_memory_free(uc, instance, STAGE_A, bytes_a);
    }
    halide_free(uc, stage_a);
    if (err == 0) {
        set_current_func(instance, OUT, NULL);
    }
    decr_active_threads(instance);
    set_current_func(instance, OVERHEAD, NULL);
    return err;
}

int h22_prof(halide_buffer_t *input, int32_t work, int32_t fail_at, int32_t hold,
             halide_buffer_t *output) {
    void *uc = NULL;
    instance_block block; /* on the stack, as the generated code puts it (under 16 KB) */
    int result = prof_body(uc, &block.instance, input, work, fail_at, hold, output);
    /* registered as a destructor before the instance starts: runs however the call ends */
    halide_profiler_instance_end(uc, &block.instance);
    return result;
}

int h22_prof_argv(void **args) {
    return h22_prof((halide_buffer_t *)args[0], *(int32_t *)args[1], *(int32_t *)args[2],
                    *(int32_t *)args[3], (halide_buffer_t *)args[4]);
}

static const struct halide_filter_argument_t prof_arguments[] = {
    {"input", halide_argument_kind_input_buffer, 2, {halide_type_uint, 8, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"work", halide_argument_kind_input_scalar, 0, {halide_type_int, 32, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"fail_at", halide_argument_kind_input_scalar, 0, {halide_type_int, 32, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"hold", halide_argument_kind_input_scalar, 0, {halide_type_int, 32, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"output", halide_argument_kind_output_buffer, 2, {halide_type_uint, 8, 0}, NULL, NULL,
     NULL, NULL, NULL},
};
static const struct halide_filter_metadata_t prof_metadata = {
    1, 5, prof_arguments, "x86-64-linux-profile-no_runtime", "h22_prof"};

const struct halide_filter_metadata_t *h22_prof_metadata(void) {
    return &prof_metadata;
}

/* ==== tracing ============================================================================== */

enum { VECTOR_TRACE = 4 };

/* An event without a value: the default type (a handle of 0 bits), no lanes. */
static int trace(void *uc, const char *func, int *coords, int dimensions, int code,
                 int parent_id, int thread_id) {
    return halide_trace_helper(uc, func, NULL, coords, halide_type_handle, 0, 0, code, parent_id,
                               thread_id, 0, dimensions, "");
}

typedef struct {
    halide_buffer_t *input, *output;
    int produce_id;
    int loop[2]; /* the parallel loop's min and extent: each task's coordinates */
    int begun;   /* tasks begun */
} trace_closure;

static int trace_row(void *uc, int y, uint8_t *closure_) {
    trace_closure *c = (trace_closure *)closure_;
    int x0 = c->output->dim[0].min, width = c->output->dim[0].extent;
    int task = trace(uc, "out22.s0.y", c->loop, 2, halide22_trace_begin_parallel_task,
                     c->produce_id, halide_current_thread_id());
    __atomic_add_fetch(&c->begun, 1, __ATOMIC_SEQ_CST);
    struct timespec pause = {0, 1000000};
    for (int i = 0; y == c->loop[0] && c->loop[1] > 1 && i < 5000 &&
                    __atomic_load_n(&c->begun, __ATOMIC_SEQ_CST) < 2;
         i++) {
        nanosleep(&pause, NULL);
    }
    int box[2] = {x0, width};
    int realization = trace(uc, "row22", box, 2, halide_trace_begin_realization, task, 0);
    uint8_t row[4096];
    int produce = trace(uc, "row22", box, 2, halide_trace_produce, realization, 0);
    for (int x = x0; x < x0 + width; x += VECTOR_TRACE) {
        uint8_t in[VECTOR_TRACE];
        int in_coords[2 * VECTOR_TRACE], row_coords[VECTOR_TRACE];
        for (int i = 0; i < VECTOR_TRACE; i++) {
            in[i] = *at(c->input, x + i, y);
            in_coords[i] = x + i;
            in_coords[VECTOR_TRACE + i] = y;
            row_coords[i] = x + i;
        }
        halide_trace_helper(uc, "in22", in, in_coords, halide_type_uint, 8, VECTOR_TRACE,
                            halide_trace_load, produce, 0, 0, 2 * VECTOR_TRACE, "");
        uint8_t stored[VECTOR_TRACE];
        for (int i = 0; i < VECTOR_TRACE; i++) {
            stored[i] = row[x - x0 + i] = (uint8_t)(in[i] + 1);
        }
        halide_trace_helper(uc, "row22", stored, row_coords, halide_type_uint, 8, VECTOR_TRACE,
                            halide_trace_store, produce, 0, 0, VECTOR_TRACE, "");
    }
    trace(uc, "row22", box, 2, halide_trace_end_produce, produce, 0);
    int consume = trace(uc, "row22", box, 2, halide_trace_consume, realization, 0);
    for (int x = x0; x < x0 + width; x++) {
        int row_coords[1] = {x}, out_coords[2] = {x, y};
        uint8_t loaded = row[x - x0], value = (uint8_t)(2 * loaded);
        halide_trace_helper(uc, "row22", &loaded, row_coords, halide_type_uint, 8, 1,
                            halide_trace_load, consume, 0, 0, 1, "");
        halide_trace_helper(uc, "out22", &value, out_coords, halide_type_uint, 8, 1,
                            halide_trace_store, consume, 0, 0, 2, "");
        *at(c->output, x, y) = value;
    }
    trace(uc, "row22", box, 2, halide_trace_end_consume, consume, 0);
    trace(uc, "row22", box, 2, halide_trace_end_realization, realization, 0);
    trace(uc, "out22.s0.y", c->loop, 2, halide22_trace_end_parallel_task, task, 0);
    return 0;
}

int h22_trace(halide_buffer_t *input, halide_buffer_t *output) {
    void *uc = NULL;
    int err = check_elementwise(uc, input, output, TYPE22(halide_type_uint, 8));
    if (err != 0) {
        return err == H22_QUERIED ? 0 : err;
    }
    if (output->dim[0].extent % VECTOR_TRACE != 0 || output->dim[0].extent > 4096) {
        return halide_error_bad_dimensions(uc, "output (a width of a multiple of 4, at most 4096)",
                                           VECTOR_TRACE, output->dim[0].extent);
    }
    int pipeline = trace(uc, "h22_trace", NULL, 0, halide_trace_begin_pipeline, 0, 0);
    halide_trace_helper(uc, "out22", NULL, NULL, halide_type_handle, 0, 0, halide_trace_tag,
                        pipeline, 0, 0, 0, "func_type_and_dim: 1 1 8 1 2 0 16 0 16");
    int box[4] = {output->dim[0].min, output->dim[0].extent, output->dim[1].min,
                  output->dim[1].extent};
    int realization = trace(uc, "out22", box, 4, halide_trace_begin_realization, pipeline, 0);
    int produce = trace(uc, "out22", box, 4, halide_trace_produce, realization, 0);
    trace_closure closure = {input, output, produce, {box[2], box[3]}, 0};
    err = halide_do_par_for(uc, trace_row, box[2], box[3], (uint8_t *)&closure);
    trace(uc, "out22", box, 4, halide_trace_end_produce, produce, 0);
    trace(uc, "out22", box, 4, halide_trace_end_realization, realization, 0);
    trace(uc, "h22_trace", NULL, 0, halide_trace_end_pipeline, pipeline, 0);
    return err;
}

int h22_trace_argv(void **args) {
    return h22_trace((halide_buffer_t *)args[0], (halide_buffer_t *)args[1]);
}

static const struct halide_filter_argument_t trace_arguments[] = {
    {"input", halide_argument_kind_input_buffer, 2, {halide_type_uint, 8, 0}, NULL, NULL, NULL,
     NULL, NULL},
    {"output", halide_argument_kind_output_buffer, 2, {halide_type_uint, 8, 0}, NULL, NULL,
     NULL, NULL, NULL},
};
static const struct halide_filter_metadata_t trace_metadata = {
    1, 2, trace_arguments, "x86-64-linux-trace_all-no_runtime", "h22_trace"};

const struct halide_filter_metadata_t *h22_trace_metadata(void) {
    return &trace_metadata;
}

/* ==== a handler this library installs ====================================================== */

enum { MAX_SEEN = 1 << 16 };

/* What the handler keeps of an event, as it read it (Halide 22's layout). */
typedef struct {
    int32_t id, event, parent_id, thread_id, lanes, dimensions, value_index;
    uint32_t type_word;
    int32_t coordinates[2];
    char func[32];
} seen_event;

static seen_event seen[MAX_SEEN];
static int seen_count, next_id, chaining;
static halide_trace_t replaced;

static int32_t keep(void *uc, const struct halide_trace_event_t *event21) {
    const struct halide22_trace_event_t *e = (const struct halide22_trace_event_t *)event21;
    if (__atomic_load_n(&chaining, __ATOMIC_SEQ_CST)) {
        (void)halide_default_trace(uc, event21);
    }
    int32_t id = __atomic_add_fetch(&next_id, 1, __ATOMIC_SEQ_CST);
    int slot = __atomic_fetch_add(&seen_count, 1, __ATOMIC_SEQ_CST);
    if (slot < MAX_SEEN) {
        seen_event *s = &seen[slot];
        s->id = id;
        s->event = e->event;
        s->parent_id = e->parent_id;
        s->thread_id = e->thread_id;
        s->lanes = e->lanes;
        s->dimensions = e->dimensions;
        s->value_index = e->value_index;
        memcpy(&s->type_word, &e->type, sizeof s->type_word);
        s->coordinates[0] = e->dimensions > 0 && e->coordinates ? e->coordinates[0] : 0;
        s->coordinates[1] = e->dimensions > 1 && e->coordinates ? e->coordinates[1] : 0;
        strncpy(s->func, e->func != NULL ? e->func : "", sizeof s->func - 1);
    }
    return id;
}

void h22_install_trace_handler(int chain) {
    __atomic_store_n(&seen_count, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&chaining, chain, __ATOMIC_SEQ_CST);
    replaced = halide_set_custom_trace(keep);
}

void h22_uninstall_trace_handler(void) {
    halide_set_custom_trace(replaced);
}

int h22_seen_count(void) {
    int n = __atomic_load_n(&seen_count, __ATOMIC_SEQ_CST);
    return n < MAX_SEEN ? n : MAX_SEEN;
}

const seen_event *h22_seen(void) {
    return seen;
}
