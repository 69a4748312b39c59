/* What the other C files use of trace_handlers.c: trace events as the shim routes them, and
 * where one goes when no profile records it. */
#ifndef SHIM_PROFILING_TRACE_HANDLERS_H
#define SHIM_PROFILING_TRACE_HANDLERS_H

#include "shim_native.h"

/* A trace event as it was emitted (`original`, in the layout of trace ABI `abi`:
 * shim/base/releases.py, Release.trace_abi), and read in Halide 22's layout (`event`), which
 * holds all of Halide 21's: the lanes of a load or store apart from its type, a thread id. */
typedef struct {
    struct halide22_trace_event_t event;
    const void *original;
    int abi;
} shim_traced;

void shim_traced_from21(shim_traced *traced, const struct halide_trace_event_t *event);
void shim_traced_from22(shim_traced *traced, const struct halide22_trace_event_t *event);

/* The event given to the handler of the process: the one an application installed
 * (halide_set_custom_trace), in the layout it takes, or else Halide's default. Returns its
 * id, as Halide's handlers do. */
int32_t shim_trace_deliver(void *user_context, const shim_traced *traced);

#endif
