/* What the other C files use of Halide's profiler entry points (halide_profiler.c) beyond
 * abi/shim_profile.h. */
#ifndef SHIM_PROFILING_HALIDE_PROFILER_H
#define SHIM_PROFILING_HALIDE_PROFILER_H

#include "shim_native.h"

/* In a child of fork (forks/fork.c), before it lists only its own calls in flight in the 22
 * state: that state's lock and the wait of its sampling thread as if new, and no sampling
 * thread (the child's first profiled call of a 22 library starts one). */
void shim_profiler22_reset_in_child(void);

#endif
