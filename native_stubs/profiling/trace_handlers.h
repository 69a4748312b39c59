/* What the other C files use of trace_handlers.c: trace events as the shim routes them, and
 * where one goes when no profile records it. */
#ifndef SHIM_PROFILING_TRACE_HANDLERS_H
#define SHIM_PROFILING_TRACE_HANDLERS_H

#include "shim_native.h"

/* A trace event as it was emitted (`event`, in the layout of trace ABI `abi`:
 * shim/base/releases.py, Release.trace_abi): Halide 21's struct halide_trace_event_t or Halide
 * 22's struct halide22_trace_event_t, whose fields hold all of Halide 21's (the lanes of a load
 * or store apart from its type, a thread id). Its code and parent, which decide where it goes,
 * are read at once; the rest where it is kept or converted (shim_traced_read). */
typedef struct {
    const void *event;
    int abi;
    int32_t code;
    int32_t parent_id;
} shim_traced;

static inline shim_traced shim_traced_of(const void *event, int abi) {
    if (abi == 0) {
        const struct halide_trace_event_t *e = event;
        return (shim_traced){event, 0, e->event, e->parent_id};
    }
    const struct halide22_trace_event_t *e = event;
    return (shim_traced){event, abi, e->event, e->parent_id};
}
/* The event in Halide 22's layout: itself, or Halide 21's read into `scratch`. */
const struct halide22_trace_event_t *shim_traced_read(const shim_traced *traced,
                                                      struct halide22_trace_event_t *scratch);

/* The event given to the handler of the process: the one an application installed
 * (halide_set_custom_trace), in the layout it takes, or else Halide's default. Returns its
 * id, as Halide's handlers do. */
int32_t shim_trace_deliver(void *user_context, const shim_traced *traced);

#endif
