/* Where Halide's trace events go when no profile records them (tracing.c decides that): the
 * handler an application installed with halide_set_custom_trace, else Halide's default, which
 * prints each event or writes it to HL_TRACE_FILE. Libraries of two releases emit events in two
 * layouts (abi/halide22_runtime.h: Halide 22's are 64 bytes where 21's are 56, and it adds
 * events 11 and 12 around each parallel task), and each handler takes one:
 *
 * - An application's handler takes the layout of the release whose code installed it
 *   (halide_set_custom_trace serves its caller by its release): it was written against that
 *   release's header. The application's own code (its executable, Python through cffi or
 *   ctypes) is no library shim.load registered, so it installs for the default release,
 *   Halide 21; code in a Halide 22 library installs for 22. Each event is converted to the
 *   handler's layout. A Halide 21 handler never gets events 11 and 12, which its release has
 *   no names for (Halide 21's own handler would read its table of names past the end): a
 *   parallel task is transparent to it, its begin answered with the task's parent id, so that
 *   what the task's body emits names the scope around the task as its parent, as a Halide 21
 *   library's events would.
 * - Halide's default is Halide 21's implementation (the runtime linked into the shim, its
 *   symbol renamed at build time: native_stubs/build.py), which prints each line as Halide 22
 *   prints it too once a 22 event is converted. Events 11 and 12 it cannot take: their lines
 *   are printed here in Halide 22's words ("Begin parallel task f.s0.y.0(0, 8) thread_id =
 *   1234"). The binary file (HL_TRACE_FILE) is one stream in one format, Halide 21's, that
 *   libraries of every release write into: a 22 library's events are written converted, and
 *   its parallel tasks are transparent there.
 *
 * halide_default_trace, which a handler may call to pass an event on, takes the layout of its
 * caller's release too. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "calls/releases.h"
#include "profiling/trace_handlers.h"

const struct halide22_trace_event_t *shim_traced_read(const shim_traced *traced,
                                                      struct halide22_trace_event_t *scratch) {
    if (traced->abi != 0) {
        return traced->event;
    }
    const struct halide_trace_event_t *e = traced->event;
    *scratch = (struct halide22_trace_event_t){
        e->func, e->value, e->coordinates, e->trace_tag,
        {e->type.code, e->type.bits, HALIDE22_TYPE_RESERVED}, e->type.lanes, e->event,
        e->parent_id, 0, e->value_index, e->dimensions};
    return scratch;
}

/* Events 0 to 10, the ones Halide 21 has, in its layout. */
static void to21(struct halide_trace_event_t *to, const struct halide22_trace_event_t *e) {
    to->func = e->func;
    to->value = e->value;
    to->coordinates = e->coordinates;
    to->trace_tag = e->trace_tag;
    to->type.code = e->type.code;
    to->type.bits = e->type.bits;
    to->type.lanes = (uint16_t)e->lanes;
    to->event = (enum halide_trace_event_code_t)e->event;
    to->parent_id = e->parent_id;
    to->value_index = e->value_index;
    to->dimensions = e->dimensions;
}

static bool halide21_has(const shim_traced *traced) {
    return traced->code >= halide_trace_load && traced->code <= halide_trace_tag;
}

/* A parallel task given to a handler of a release without them: nothing emitted; the scope
 * around it stands in for it. */
static int32_t transparent(const shim_traced *traced) {
    return traced->code == halide22_trace_begin_parallel_task ? traced->parent_id : 0;
}

enum { LINE_BYTES = 4096 }; /* (Halide's printer's too: a longer line is cut) */

static void append(char *line, size_t *n, const char *format, ...) {
    va_list args;
    va_start(args, format);
    int written = vsnprintf(line + *n, LINE_BYTES - *n, format, args);
    va_end(args);
    if (written > 0) {
        *n = *n + (size_t)written < LINE_BYTES ? *n + (size_t)written : LINE_BYTES - 1;
    }
}

/* An event 11 or 12 as Halide 22's default handler prints it. */
static void print_task(void *user_context, const struct halide22_trace_event_t *e) {
    char line[LINE_BYTES];
    size_t n = 0;
    line[0] = 0;
    append(line, &n, "%s %s.%d(",
           e->event == halide22_trace_begin_parallel_task ? "Begin parallel task"
                                                          : "End parallel task",
           e->func != NULL ? e->func : "", e->value_index);
    for (int i = 0; e->coordinates != NULL && i < e->dimensions; i++) {
        append(line, &n, "%s%d", i ? ", " : "", e->coordinates[i]);
    }
    append(line, &n, ")");
    if (e->trace_tag != NULL && e->trace_tag[0] != 0) {
        append(line, &n, " tag = \"%s\"", e->trace_tag);
    }
    if (e->thread_id != 0) {
        append(line, &n, " thread_id = %d", e->thread_id);
    }
    append(line, &n, "\n");
    halide_print(user_context, line);
}

/* Halide's default handler, for an event of either layout. */
static int32_t halide_default(void *user_context, const shim_traced *traced) {
    if (!halide21_has(traced)) {
        if (traced->code != halide22_trace_begin_parallel_task &&
            traced->code != halide22_trace_end_parallel_task) {
            return 0; /* (no release has it: nothing to print it as) */
        }
        if (halide_get_trace_file(user_context) <= 0) {
            print_task(user_context, traced->event);
        }
        return transparent(traced);
    }
    if (traced->abi == 0) {
        return halide21_default_trace(user_context, traced->event);
    }
    struct halide_trace_event_t converted;
    to21(&converted, traced->event);
    return halide21_default_trace(user_context, &converted);
}

/* --- the application's handler -------------------------------------------------------------
 * A handler and the layout it takes are published together, as one pointer to a record of
 * both: one atomic load reads them, and nothing a thread can be stopped inside (by a fork) is
 * ever half done. Records are kept, one per handler and layout ever installed, so that a
 * handler swapped in and out at every call takes no more memory. */

typedef struct installation {
    halide_trace_t handler;
    int abi;
    struct installation *next;
} installation;

static installation *installations; /* every record made, pushed lock-free */
static installation *installed;     /* the current one; NULL: Halide's default */

static installation *record_of(halide_trace_t handler, int abi) {
    installation *head = __atomic_load_n(&installations, __ATOMIC_ACQUIRE);
    for (installation *i = head; i != NULL; i = i->next) {
        if (i->handler == handler && i->abi == abi) {
            return i;
        }
    }
    installation *made = malloc(sizeof *made);
    if (made == NULL) {
        return NULL;
    }
    made->handler = handler;
    made->abi = abi;
    made->next = head;
    while (!__atomic_compare_exchange_n(&installations, &made->next, made, true,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return made;
}

/* Halide's: installs `handler` and returns the one it replaces (Halide's default at first;
 * installing it, or NULL, brings the default back). Where no memory is left to note the
 * handler's layout, nothing changes and `handler` is returned, as a sign. */
__attribute__((noinline)) halide_trace_t halide_set_custom_trace(halide_trace_t handler) {
    int abi = SHIM_CALLER_RELEASE()->trace_abi;
    installation *record = NULL;
    if (handler != NULL && handler != halide_default_trace) {
        record = record_of(handler, abi);
        if (record == NULL) {
            return handler;
        }
    }
    installation *previous = __atomic_exchange_n(&installed, record, __ATOMIC_ACQ_REL);
    return previous != NULL ? previous->handler : halide_default_trace;
}

__attribute__((noinline)) int32_t halide_default_trace(void *user_context,
                                                       const struct halide_trace_event_t *e) {
    if (SHIM_CALLER_RELEASE()->trace_abi == 0) {
        return halide21_default_trace(user_context, e);
    }
    shim_traced traced = shim_traced_of(e, 1);
    return halide_default(user_context, &traced);
}

int32_t shim_trace_deliver(void *user_context, const shim_traced *traced) {
    const installation *to = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);
    if (to == NULL) {
        return halide_default(user_context, traced);
    }
    if (to->abi != 0) {
        struct halide22_trace_event_t scratch;
        return to->handler(user_context, (const struct halide_trace_event_t *)shim_traced_read(
                                             traced, &scratch));
    }
    if (!halide21_has(traced)) {
        return transparent(traced);
    }
    if (traced->abi == 0) {
        return to->handler(user_context, traced->event);
    }
    struct halide_trace_event_t converted;
    to21(&converted, traced->event);
    return to->handler(user_context, &converted);
}
