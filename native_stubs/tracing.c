/* Halide's trace events while a profile records (abi/shim_trace.h; read by
 * shim/halide_trace.py).
 *
 * The handler runs on whatever thread Halide traces from, the pool's workers included, for
 * every event: with -trace_all, for every load and store a pipeline makes. So it never enters
 * Python: begin/end events are written into a preallocated buffer (a slot taken with one
 * atomic add), loads and stores are counted per Func in a fixed table, and Python reads both
 * once recording has stopped.
 *
 * Nesting survives a full buffer: a begin event is recorded only if there is room for it and
 * for its end (two slots are reserved at once), and its id carries SHIM_TRACE_RECORDED and a
 * count of the begins kept, so that its end, which Halide passes that id as parent_id, is
 * recorded exactly when its begin was kept by this recording (an end whose begin an earlier
 * recording kept takes no room: it would take its slot from a begin of this one).
 *
 * A span belongs to whoever saw its begin: the end of a span Halide's own handler printed (or
 * wrote to HL_TRACE_FILE) goes to that handler even while a profile records, and the end of a
 * span a profile recorded (or left out: its id is 0) never does, so that what Halide prints of
 * a call a profile started or stopped in the middle of stays whole.
 *
 * Stopping waits for the handlers that saw recording on (in_flight) before anyone reads or
 * frees the buffer: a handler increments in_flight before it checks `recording`, and the stop
 * clears `recording` before it checks in_flight (both sequentially consistent), so either the
 * handler sees the stop or the stop sees the handler. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim_native.h"

typedef int32_t (*trace_fn)(void *, const struct halide_trace_event_t *);

static trace_fn previous_handler; /* the handler ours replaced: Halide's own */
static int recording;
static int in_flight;

static shim_trace_event *events;
static int32_t capacity;
static int64_t reserved; /* slots promised: a begin takes two, for itself and its end */
static int32_t written;  /* slots taken */
static uint64_t dropped;
static uint64_t sample_every, accesses_seen;
/* Begins kept, ever (an id is SHIM_TRACE_RECORDED | the count masked); first_id: the count
 * when this recording started. Loads, stores, tags and left-out begins get id 0: nothing
 * descends from a load or store, and Halide's own handler never hands out 0. */
static uint32_t next_id, first_id;

/* Funcs by the address of the name Halide passes (a constant in the pipeline's library); the
 * name is copied when a slot is claimed, so it outlives the library. */
static const char *func_keys[SHIM_TRACE_FUNCS];
static shim_trace_func funcs[SHIM_TRACE_FUNCS];

static __thread int64_t own_thread_id;

static int64_t thread_id(void) {
    if (own_thread_id == 0) {
        own_thread_id = (int64_t)syscall(SYS_gettid);
    }
    return own_thread_id;
}

static int32_t func_slot(const char *name) {
    uintptr_t h = ((uintptr_t)name >> 3) * (uintptr_t)0x9E3779B97F4A7C15ull;
    for (int probe = 0; probe < 64; probe++) {
        int32_t slot = 1 + (int32_t)((h + (uintptr_t)probe) % (SHIM_TRACE_FUNCS - 1));
        const char *key = __atomic_load_n(&func_keys[slot], __ATOMIC_ACQUIRE);
        if (key == name) {
            return slot;
        }
        if (key == NULL) {
            const char *expected = NULL;
            if (__atomic_compare_exchange_n(&func_keys[slot], &expected, name, false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                __atomic_store_n(&funcs[slot].name, strdup(name), __ATOMIC_RELEASE);
                return slot;
            }
            if (expected == name) {
                return slot;
            }
        }
    }
    return 0; /* the table is crowded: counted among "other Funcs" */
}

/* Takes `slots` of the buffer's room, or none where fewer are left (a refused begin leaves
 * the last slot to a sample). */
static bool reserve(int64_t slots) {
    int64_t taken = __atomic_load_n(&reserved, __ATOMIC_RELAXED);
    do {
        if (taken + slots > capacity) {
            return false;
        }
    } while (!__atomic_compare_exchange_n(&reserved, &taken, taken + slots, true,
                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return true;
}

/* Whether `id` (an end event's parent_id) is that of a begin this recording kept. Its begin
 * happened before its end, so next_id already counts it here. */
static bool kept_by_this_recording(int32_t id) {
    if (!(id & SHIM_TRACE_RECORDED)) {
        return false;
    }
    uint32_t kept = __atomic_load_n(&next_id, __ATOMIC_RELAXED) - first_id;
    uint32_t age = ((uint32_t)id - first_id - 1) & SHIM_TRACE_ID_MASK;
    return age < kept;
}

/* Whether the begin of an end event went to Halide's own handler: its ids count from 1 and
 * never carry SHIM_TRACE_RECORDED (not within 2**30 events); ours are 0 or carry it. */
static bool halides_own(int32_t parent_id) {
    return parent_id != 0 && !(parent_id & SHIM_TRACE_RECORDED);
}

static bool is_end(int32_t event) {
    return event == halide_trace_end_realization || event == halide_trace_end_produce ||
           event == halide_trace_end_consume || event == halide_trace_end_pipeline;
}

static void write_event(const struct halide_trace_event_t *e, int32_t id, int32_t func) {
    int32_t slot = __atomic_fetch_add(&written, 1, __ATOMIC_RELAXED);
    if (slot >= capacity) { /* (not reached: every write was reserved) */
        return;
    }
    shim_trace_event *out = &events[slot];
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    out->time_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    shim_call *call = shim_current_call();
    out->call = call == NULL ? 0 : shim_call_id(call);
    out->thread = thread_id();
    out->func = func;
    out->event = e->event;
    out->id = id;
    out->parent_id = e->parent_id;
    out->value_index = e->value_index;
    out->dimensions = e->dimensions;
    /* A vector load or store passes each dimension's coordinates for every lane in turn
     * (x of each lane, then y of each lane...): its first lane's are kept, one a dimension. */
    int lanes = (e->event == halide_trace_load || e->event == halide_trace_store) &&
                        e->type.lanes > 1 ? e->type.lanes : 1;
    int count = e->dimensions / lanes;
    int kept = count < SHIM_TRACE_COORDINATES ? count : SHIM_TRACE_COORDINATES;
    if (e->coordinates != NULL) {
        for (int d = 0; d < kept; d++) {
            out->coordinates[d] = e->coordinates[d * lanes];
        }
    }
    out->type_code = e->type.code;
    out->type_bits = e->type.bits;
    out->type_lanes = e->type.lanes;
    memset(out->value, 0, sizeof out->value);
    size_t value_bytes = ((size_t)e->type.bits + 7) / 8;
    if (e->value != NULL && value_bytes <= sizeof out->value) {
        memcpy(out->value, e->value, value_bytes);
    }
}

static void count_access(const struct halide_trace_event_t *e, int32_t func) {
    uint64_t lanes = e->type.lanes > 0 ? e->type.lanes : 1;
    if (e->event == halide_trace_load) {
        __atomic_fetch_add(&funcs[func].loads, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&funcs[func].loaded_values, lanes, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_add(&funcs[func].stores, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&funcs[func].stored_values, lanes, __ATOMIC_RELAXED);
    }
    if (sample_every != 0 &&
        __atomic_fetch_add(&accesses_seen, 1, __ATOMIC_RELAXED) % sample_every == 0) {
        if (reserve(1)) {
            write_event(e, 0, func);
        } else {
            __atomic_fetch_add(&dropped, 1, __ATOMIC_RELAXED);
        }
    }
}

/* What the handler does with an event while recording: the id for Halide; *forward is set
 * where Halide's own handler is to have the event too (the end of a span it began). */
static int32_t record(const struct halide_trace_event_t *e, bool *forward) {
    switch (e->event) {
    case halide_trace_load:
    case halide_trace_store:
        count_access(e, func_slot(e->func != NULL ? e->func : ""));
        return 0;
    case halide_trace_begin_realization:
    case halide_trace_produce:
    case halide_trace_consume:
    case halide_trace_begin_pipeline: {
        if (!reserve(2)) {
            __atomic_fetch_add(&dropped, 1, __ATOMIC_RELAXED);
            return 0;
        }
        uint32_t n = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
        int32_t id = (int32_t)(n & SHIM_TRACE_ID_MASK) | SHIM_TRACE_RECORDED;
        write_event(e, id, func_slot(e->func != NULL ? e->func : ""));
        return id;
    }
    case halide_trace_end_realization:
    case halide_trace_end_produce:
    case halide_trace_end_consume:
    case halide_trace_end_pipeline:
        if (kept_by_this_recording(e->parent_id)) {
            write_event(e, 0, func_slot(e->func != NULL ? e->func : ""));
        } else {
            *forward = halides_own(e->parent_id);
        }
        return 0;
    default: /* tags: Halide's hints for its visualizer */
        return 0;
    }
}

static int32_t shim_trace_handler(void *user_context, const struct halide_trace_event_t *e) {
    if (__atomic_load_n(&recording, __ATOMIC_ACQUIRE)) {
        __atomic_fetch_add(&in_flight, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&recording, __ATOMIC_SEQ_CST)) {
            bool forward = false;
            int32_t id = record(e, &forward);
            __atomic_fetch_sub(&in_flight, 1, __ATOMIC_RELEASE);
            return forward ? previous_handler(user_context, e) : id;
        }
        __atomic_fetch_sub(&in_flight, 1, __ATOMIC_SEQ_CST);
    }
    if (is_end(e->event) && !halides_own(e->parent_id)) {
        return 0; /* its begin was recorded (or left out) by a profile: Halide never saw it */
    }
    return previous_handler(user_context, e);
}

/* A child of fork has only the forking thread: handlers other threads were in do not exist
 * there, and a stop must not wait for them; and that thread has a new kernel thread id. */
static void forget_other_threads(void) {
    __atomic_store_n(&in_flight, 0, __ATOMIC_SEQ_CST);
    own_thread_id = 0;
}

__attribute__((constructor)) static void install_handler(void) {
    previous_handler = halide_set_custom_trace(shim_trace_handler);
    pthread_atfork(NULL, NULL, forget_other_threads);
}

int shim_trace_start(int32_t new_capacity, uint64_t every) {
    if (new_capacity < 0) {
        new_capacity = 0;
    }
    shim_trace_event *buffer = NULL;
    if (new_capacity > 0) {
        buffer = malloc((size_t)new_capacity * sizeof *buffer);
        if (buffer == NULL) {
            return -1;
        }
    }
    free(events);
    events = buffer;
    capacity = new_capacity;
    reserved = 0;
    written = 0;
    first_id = __atomic_load_n(&next_id, __ATOMIC_RELAXED);
    dropped = 0;
    sample_every = every;
    accesses_seen = 0;
    for (int i = 0; i < SHIM_TRACE_FUNCS; i++) {
        free((void *)funcs[i].name);
        memset(&funcs[i], 0, sizeof funcs[i]);
        func_keys[i] = NULL;
    }
    funcs[0].name = strdup("(other Funcs)");
    __atomic_store_n(&recording, 1, __ATOMIC_SEQ_CST);
    return 0;
}

void shim_trace_stop(void) {
    __atomic_store_n(&recording, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&in_flight, __ATOMIC_SEQ_CST) != 0) {
        sched_yield();
    }
}

int32_t shim_trace_count(void) {
    int32_t n = __atomic_load_n(&written, __ATOMIC_ACQUIRE);
    return n < capacity ? n : capacity;
}

const shim_trace_event *shim_trace_events(void) {
    return events;
}

const shim_trace_func *shim_trace_func_table(void) {
    return funcs;
}

uint64_t shim_trace_dropped(void) {
    return __atomic_load_n(&dropped, __ATOMIC_RELAXED);
}
