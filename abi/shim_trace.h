/* Halide's tracing, recorded while a profile records (native_stubs/profiling/tracing.c, read by
 * shim/profiling/halide_trace.py). See abi/shim_calls.h for what every abi/shim_*.h header is.
 *
 * A pipeline built with -trace_realizations, -trace_pipeline, -trace_loads, -trace_stores or
 * -trace_all calls halide_trace_helper for every event, which the native library defines, as
 * it defines halide_trace, for each library by the release that built it (Halide 22's events
 * are laid out otherwise, and bracket each parallel task: abi/halide22_runtime.h). While no
 * profile records, each event goes to the process's handler: the one an application installed
 * (halide_set_custom_trace), in the layout it takes, or Halide's own, which prints, or writes
 * HL_TRACE_FILE (native_stubs/profiling/trace_handlers.c); while one records, begin/end events
 * go into a buffer of fixed capacity and loads/stores are only counted per Func (every Nth one
 * kept where asked). No Python runs in the handler. */

enum {
    SHIM_TRACE_COORDINATES = 16, /* coordinates kept per event: a box's first ones; a load's or
                                    store's first lane's, one a dimension */
    SHIM_TRACE_FUNCS = 1024,     /* Func table slots; slot 0 counts the Funcs that did not fit */
    SHIM_TRACE_ID_MASK = 0x3FFFFFFF,   /* the handler's ids are counted in these bits */
    SHIM_TRACE_RECORDED = 0x40000000   /* set in the ids of the begin events it recorded */
};

typedef struct shim_trace_event {
    int64_t time_ns;  /* CLOCK_MONOTONIC, the clock of Python's time.perf_counter_ns */
    uint64_t call;    /* shim_call_id of the call it ran under (0: none) */
    int64_t thread;   /* the kernel's thread id, as threading.get_native_id() */
    int32_t func;     /* its Func's slot in the table (shim_trace_func_table) */
    int32_t event;    /* halide_trace_event_code_t */
    int32_t id;       /* a begin event's: the id the handler returned for it (others: 0) */
    int32_t parent_id; /* as Halide passed it: an end event's is its begin's id */
    int32_t value_index;
    int32_t dimensions; /* how many coordinates Halide passed (a vector access: for each lane) */
    int32_t coordinates[SHIM_TRACE_COORDINATES];
    uint8_t type_code, type_bits;
    uint16_t type_lanes; /* a load's or store's lanes */
    int32_t thread_id;   /* Halide 22's begin_parallel_task: the id of the thread it ran on
                            (halide_current_thread_id), as the pipeline passed it; else 0 */
    uint8_t value[8]; /* loads and stores: the first lane's bytes */
} shim_trace_event;

typedef struct shim_trace_func {
    const char *name; /* a copy of the Func's name (NULL: slot unused) */
    uint64_t loads, stores;                /* events */
    uint64_t loaded_values, stored_values; /* elements (vector events count each lane) */
} shim_trace_func;

/* Start recording into a buffer of `capacity` events (begin and end events take one each;
 * every `sample_every`th load or store is kept too where it is not 0). Returns 0, or -1 where
 * the buffer could not be allocated (nothing records then). A recording still on is stopped
 * first (shim_trace_stop), what it recorded lost. */
int shim_trace_start(int32_t capacity, uint64_t sample_every);
/* Stop recording; returns once no handler is still writing. The events, counts and table stay
 * readable until the next start. */
void shim_trace_stop(void);
int32_t shim_trace_count(void);
const shim_trace_event *shim_trace_events(void);
const shim_trace_func *shim_trace_func_table(void);
/* Begin events (and sampled accesses) left out because the buffer was full. */
uint64_t shim_trace_dropped(void);
