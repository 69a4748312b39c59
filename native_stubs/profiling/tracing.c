/* Halide's trace events: the entry points generated code calls (halide_trace_helper, and
 * halide_trace), each serving its caller by the release that built it (calls/releases.h:
 * trace_abi), and the events kept while a profile records (abi/shim_trace.h; read by
 * shim/profiling/halide_trace.py). While none records, each event goes where Halide would send
 * it: to the application's handler or Halide's default, in the layout each takes
 * (trace_handlers.c). Events of both layouts are read in Halide 22's (trace_handlers.h), which
 * holds everything of Halide 21's; a Halide 22 library also brackets each parallel task with
 * events 11 and 12, kept as spans with the thread id it gives.
 *
 * The handler runs on whatever thread Halide traces from, the pool's workers included, for
 * every event: with -trace_all, for every load and store a pipeline makes. So it never enters
 * Python: begin/end events are written into a preallocated buffer (a slot taken with one
 * atomic add), loads and stores are counted per Func in a fixed table, and Python reads both
 * once recording has stopped.
 *
 * Nesting survives a full buffer: a begin event is recorded only if there is room for it and
 * for its end (two slots are reserved at once), and its end is recorded exactly when its begin
 * was kept by this recording (an end whose begin an earlier recording kept takes no room: it
 * would take its slot from a begin of this one). A kept begin's id carries SHIM_TRACE_RECORDED
 * and a count of the begins kept; Halide passes it as its end's parent_id.
 *
 * A span belongs to whoever saw its begin: the end of a span the process's handler printed (or
 * wrote to HL_TRACE_FILE) goes to that handler even while a profile records, and the end of a
 * span a profile recorded (or left out: its id is 0) never does, so that what Halide prints of
 * a call a profile started or stopped in the middle of stays whole. Who saw a begin is not
 * told by its id: Halide's handler takes an id for every event, loads and stores included, so
 * its ids reach SHIM_TRACE_RECORDED after 2**30 events (some 2000 calls of a -trace_all blur);
 * and a parallel task a handler of Halide 21's layout never sees takes its parent's id.
 * Begin and end events come in pairs on one thread, properly nested, so each thread keeps a
 * stack of its open spans and who owns each; an end is routed by the entry of its begin. Only
 * where the stack has lost it (nested deeper than it holds; a begin on another thread, which
 * Halide does not do) does the id decide.
 *
 * Stopping waits for the handlers that saw recording on (in_flight) before anyone reads or
 * frees the buffer: a handler increments in_flight before it checks `recording`, and the stop
 * clears `recording` before it checks in_flight (both sequentially consistent), so either the
 * handler sees the stop or the stop sees the handler. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim_native.h"
#include "calls/releases.h"
#include "profiling/trace_handlers.h"
#include "profiling/tracing.h"

typedef struct halide22_trace_event_t event22;

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
static const char OTHER_FUNCS[] = "(other Funcs)"; /* slot 0's name */

static __thread int64_t own_thread_id;

/* The spans open on this thread, innermost last: a ring that drops its oldest entry when full
 * (that span's end then falls back on its id's bits). Entries above the one an end closes are
 * stale, the begins of a call that failed midway and never emitted their ends: the end pops
 * them too. The id is the one the begin's handler returned, which Halide passes as the end's
 * parent_id; a task transparent to the handler has its parent's, and is found first, above
 * it. */
enum { OPEN_SPANS = 128 };
enum span_owner { OWNER_HANDLER, OWNER_KEPT, OWNER_LEFT_OUT };
typedef struct {
    int32_t id;
    uint8_t owner;       /* enum span_owner */
    uint32_t generation; /* OWNER_KEPT: the recording that kept it */
} open_span;
static __thread open_span open_spans[OPEN_SPANS];
static __thread uint32_t open_top, open_bottom; /* entries open_bottom..open_top-1, mod the size */

/* Recordings started, ever: a kept span is recorded by the one that kept its begin. */
static uint32_t generation;

static void push_span(int32_t id, enum span_owner owner, uint32_t kept_by) {
    if (open_top - open_bottom == OPEN_SPANS) {
        open_bottom++;
    }
    open_spans[open_top % OPEN_SPANS] = (open_span){id, (uint8_t)owner, kept_by};
    open_top++;
}

/* The entry of the begin `id` is the end of, popped with the stale ones above it; false where
 * this thread has none (nothing popped). */
static bool pop_span(int32_t id, open_span *found) {
    for (uint32_t i = open_top; i != open_bottom; i--) {
        open_span *s = &open_spans[(i - 1) % OPEN_SPANS];
        if (s->id == id) {
            *found = *s;
            open_top = i - 1;
            return true;
        }
    }
    return false;
}

static int64_t thread_id(void) {
    if (own_thread_id == 0) {
        own_thread_id = (int64_t)syscall(SYS_gettid);
    }
    return own_thread_id;
}

/* Halide 22's (abi/halide22_runtime.h): the OS's id of the calling thread, never 0, which its
 * generated code passes with begin_parallel_task events. */
int32_t halide_current_thread_id(void) {
    int32_t id = (int32_t)thread_id();
    return id != 0 ? id : 1;
}

/* The Func's slot; 0 ("other Funcs") where the table is crowded or its name cannot be copied
 * (the copy is made before a slot is claimed, so that no claimed slot goes without a name). */
static int32_t func_slot(const char *name) {
    uintptr_t h = ((uintptr_t)name >> 3) * (uintptr_t)0x9E3779B97F4A7C15ull;
    char *copy = NULL;
    int32_t found = 0;
    for (int probe = 0; probe < 64; probe++) {
        int32_t slot = 1 + (int32_t)((h + (uintptr_t)probe) % (SHIM_TRACE_FUNCS - 1));
        const char *key = __atomic_load_n(&func_keys[slot], __ATOMIC_ACQUIRE);
        if (key == name) {
            found = slot;
            break;
        }
        if (key == NULL) {
            if (copy == NULL && (copy = strdup(name)) == NULL) {
                break;
            }
            const char *expected = NULL;
            if (__atomic_compare_exchange_n(&func_keys[slot], &expected, name, false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                __atomic_store_n(&funcs[slot].name, copy, __ATOMIC_RELEASE);
                copy = NULL;
                found = slot;
                break;
            }
            if (expected == name) {
                found = slot;
                break;
            }
        }
    }
    free(copy);
    return found;
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

/* Whether `id` (an end event's parent_id) is that of a begin this recording kept, by the id
 * alone (an end whose begin the thread's stack lost). Its begin happened before its end, so
 * next_id already counts it here. */
static bool kept_by_this_recording(int32_t id) {
    if (!(id & SHIM_TRACE_RECORDED)) {
        return false;
    }
    uint32_t kept = __atomic_load_n(&next_id, __ATOMIC_RELAXED) - first_id;
    uint32_t age = ((uint32_t)id - first_id - 1) & SHIM_TRACE_ID_MASK;
    return age < kept;
}

/* Whether the begin of an end event went to the process's handler, by the id alone: Halide's
 * ids count from 1 and carry no SHIM_TRACE_RECORDED for their first 2**30; ours are 0 or carry
 * it. */
static bool handlers_own(int32_t parent_id) {
    return parent_id != 0 && !(parent_id & SHIM_TRACE_RECORDED);
}

static void write_event(const event22 *e, int32_t id, int32_t func) {
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
                        e->lanes > 1 ? e->lanes : 1;
    int count = e->dimensions / lanes;
    int kept = count < SHIM_TRACE_COORDINATES ? count : SHIM_TRACE_COORDINATES;
    if (e->coordinates != NULL) {
        for (int d = 0; d < kept; d++) {
            out->coordinates[d] = e->coordinates[d * lanes];
        }
    }
    out->type_code = e->type.code;
    out->type_bits = e->type.bits;
    out->type_lanes = (uint16_t)e->lanes;
    out->thread_id = e->thread_id;
    memset(out->value, 0, sizeof out->value);
    size_t value_bytes = ((size_t)e->type.bits + 7) / 8;
    if (e->value != NULL && value_bytes <= sizeof out->value) {
        memcpy(out->value, e->value, value_bytes);
    }
}

static void count_access(const event22 *e, int32_t func) {
    uint64_t lanes = e->lanes > 0 ? (uint64_t)e->lanes : 1;
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

static const char *func_name(const event22 *e) {
    return e->func != NULL ? e->func : "";
}

/* A begin event while recording: the id for Halide (0: left out, the buffer is full). */
static int32_t record_begin(const event22 *e) {
    if (!reserve(2)) {
        __atomic_fetch_add(&dropped, 1, __ATOMIC_RELAXED);
        return 0;
    }
    uint32_t n = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    int32_t id = (int32_t)(n & SHIM_TRACE_ID_MASK) | SHIM_TRACE_RECORDED;
    write_event(e, id, func_slot(func_name(e)));
    return id;
}

/* Whether a recording is on. Where it is, the caller is one of the handlers a stop waits for
 * until it calls leave(): it increments in_flight before it checks `recording` (see the top of
 * the file). */
static bool enter(void) {
    if (!__atomic_load_n(&recording, __ATOMIC_ACQUIRE)) {
        return false;
    }
    __atomic_fetch_add(&in_flight, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&recording, __ATOMIC_SEQ_CST)) {
        return true;
    }
    __atomic_fetch_sub(&in_flight, 1, __ATOMIC_SEQ_CST);
    return false;
}

static void leave(void) {
    __atomic_fetch_sub(&in_flight, 1, __ATOMIC_RELEASE);
}

static int32_t begin_event(void *user_context, const shim_traced *traced) {
    if (enter()) {
        event22 scratch;
        int32_t id = record_begin(shim_traced_read(traced, &scratch));
        uint32_t kept_by = __atomic_load_n(&generation, __ATOMIC_RELAXED);
        leave();
        push_span(id, id != 0 ? OWNER_KEPT : OWNER_LEFT_OUT, kept_by);
        return id;
    }
    int32_t id = shim_trace_deliver(user_context, traced);
    push_span(id, OWNER_HANDLER, 0);
    return id;
}

/* An end event into the recording. */
static void record_end(const shim_traced *traced) {
    event22 scratch;
    const event22 *e = shim_traced_read(traced, &scratch);
    write_event(e, 0, func_slot(func_name(e)));
}

static int32_t end_event(void *user_context, const shim_traced *traced) {
    open_span begin;
    if (!pop_span(traced->parent_id, &begin)) {
        /* Lost by this thread's stack (nested deeper than it holds, or begun on another
         * thread): the id's bits decide. */
        if (enter()) {
            bool kept = kept_by_this_recording(traced->parent_id);
            if (kept) {
                record_end(traced);
            }
            leave();
            if (kept) {
                return 0;
            }
        }
        return handlers_own(traced->parent_id) ? shim_trace_deliver(user_context, traced) : 0;
    }
    switch (begin.owner) {
    case OWNER_HANDLER: /* (even while a profile records: Halide's log stays whole) */
        return shim_trace_deliver(user_context, traced);
    case OWNER_KEPT:
        /* recorded by the recording that kept its begin, if it still records (the begin
         * reserved the end's slot); an older one's is swallowed */
        if (enter()) {
            if (begin.generation == __atomic_load_n(&generation, __ATOMIC_RELAXED)) {
                record_end(traced);
            }
            leave();
        }
        return 0;
    default: /* left out: nobody saw its begin */
        return 0;
    }
}

/* An event of either layout: kept while a profile records, else given to the process's
 * handler. */
static int32_t route(void *user_context, const shim_traced *traced) {
    switch (traced->code) {
    case halide_trace_begin_realization:
    case halide_trace_produce:
    case halide_trace_consume:
    case halide_trace_begin_pipeline:
    case halide22_trace_begin_parallel_task:
        return begin_event(user_context, traced);
    case halide_trace_end_realization:
    case halide_trace_end_produce:
    case halide_trace_end_consume:
    case halide_trace_end_pipeline:
    case halide22_trace_end_parallel_task:
        return end_event(user_context, traced);
    default:
        break;
    }
    if (enter()) {
        if (traced->code == halide_trace_load || traced->code == halide_trace_store) {
            event22 scratch;
            const event22 *e = shim_traced_read(traced, &scratch);
            count_access(e, func_slot(func_name(e)));
        } /* (tags, Halide's hints for its visualizer, are left out) */
        leave();
        return 0;
    }
    return shim_trace_deliver(user_context, traced);
}

/* What generated code calls for every event, with the event's fields: Halide's
 * src/runtime/trace_helper.cpp fills an event and passes it to halide_trace. Halide 22 inserted
 * `thread_id` after `parent_id` (13 parameters where Halide 21 has 12): one definition serves
 * both, its parameters Halide 22's, the caller's release telling how to read them. From the
 * tenth on they lie on the stack (x86-64; AArch64 from the ninth), one 8-byte slot each: a
 * Halide 21 caller's tenth to twelfth are value_index, dimensions and trace_tag, the twelfth a
 * pointer where Halide 22's is an int, hence its type here; its thirteenth, which it did not
 * pass, is never read. As Halide's does, it tells MemorySanitizer the event, the value and the
 * coordinates are initialized (pipelines built with -msan check what they are handed). */
__attribute__((noinline)) int halide_trace_helper(void *user_context, const char *func,
                                                  void *value, int *coords, int type_code,
                                                  int type_bits, int type_lanes, int code,
                                                  int parent_id, int tenth, int eleventh,
                                                  uintptr_t twelfth, const char *thirteenth) {
    shim_traced traced;
    struct halide_trace_event_t e21;
    event22 e22;
    int dimensions;
    int abi = SHIM_CALLER_RELEASE()->trace_abi;
    if (abi == 0) {
        dimensions = eleventh;
        e21 = (struct halide_trace_event_t){
            func, value, coords, (const char *)twelfth,
            {(uint8_t)type_code, (uint8_t)type_bits, (uint16_t)type_lanes},
            (enum halide_trace_event_code_t)code, parent_id, tenth, dimensions};
        (void)halide_msan_annotate_memory_is_initialized(user_context, &e21, sizeof e21);
        traced = shim_traced_of(&e21, abi);
    } else {
        dimensions = (int)twelfth;
        e22 = (event22){func, value, coords, thirteenth,
                        {(uint8_t)type_code, (uint8_t)type_bits, HALIDE22_TYPE_RESERVED},
                        type_lanes, code, parent_id, tenth, eleventh, dimensions};
        (void)halide_msan_annotate_memory_is_initialized(user_context, &e22, sizeof e22);
        traced = shim_traced_of(&e22, abi);
    }
    (void)halide_msan_annotate_memory_is_initialized(user_context, value,
                                                     (uint64_t)type_lanes * ((type_bits + 7) / 8));
    (void)halide_msan_annotate_memory_is_initialized(user_context, coords,
                                                     (uint64_t)dimensions * sizeof(int32_t));
    return route(user_context, &traced);
}

/* Halide's halide_trace, for an event in the layout of its caller's release. */
__attribute__((noinline)) int32_t halide_trace(void *user_context,
                                               const struct halide_trace_event_t *event) {
    shim_traced traced = shim_traced_of(event, SHIM_CALLER_RELEASE()->trace_abi);
    return route(user_context, &traced);
}

/* In a child of fork (forks/fork.c): handlers other threads were in do not exist there, and a stop
 * must not wait for them; and the forking thread has a new kernel thread id. */
void shim_trace_forget_other_threads(void) {
    __atomic_store_n(&in_flight, 0, __ATOMIC_SEQ_CST);
    own_thread_id = 0;
}

void shim_trace_stop(void) {
    __atomic_store_n(&recording, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&in_flight, __ATOMIC_SEQ_CST) != 0) {
        sched_yield();
    }
}

int shim_trace_start(int32_t new_capacity, uint64_t every) {
    /* A recording left on (an exception between the start and the profile becoming active)
     * is stopped first: handlers may still be writing into the buffer freed below. */
    shim_trace_stop();
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
    __atomic_store_n(&generation, generation + 1, __ATOMIC_RELAXED);
    dropped = 0;
    sample_every = every;
    accesses_seen = 0;
    for (int i = 0; i < SHIM_TRACE_FUNCS; i++) {
        if (i != 0) {
            free((void *)funcs[i].name);
        }
        memset(&funcs[i], 0, sizeof funcs[i]);
        func_keys[i] = NULL;
    }
    funcs[0].name = OTHER_FUNCS;
    __atomic_store_n(&recording, 1, __ATOMIC_SEQ_CST);
    return 0;
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
