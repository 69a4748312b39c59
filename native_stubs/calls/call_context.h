/* What the other C files use of the call contexts (call_context.c) beyond the API Python has
 * too (abi/shim_calls.h). */
#ifndef SHIM_CALLS_CALL_CONTEXT_H
#define SHIM_CALLS_CALL_CONTEXT_H

#include "shim_native.h"

/* The fast paths' calls (fast/run.c): begin returns false once calls are closed at exit. */
bool shim_calls_begin(void);
void shim_calls_end(void);
bool shim_calls_closed(void);

/* In a forked child (forks/fork.c), which has only the forking thread: its calls alone are
 * running. */
void shim_calls_keep_own(void);

#endif
