/* What the other C files use of the trace handler (tracing.c) beyond abi/shim_trace.h. */
#ifndef SHIM_PROFILING_TRACING_H
#define SHIM_PROFILING_TRACING_H

#include "shim_native.h"

/* In a forked child (forks/fork.c): no other thread is in the handler. */
void shim_trace_forget_other_threads(void);

#endif
