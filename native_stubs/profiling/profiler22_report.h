/* What the other C files use of the Halide 22 profiler's report (profiler22_report.c). */
#ifndef SHIM_PROFILING_PROFILER22_REPORT_H
#define SHIM_PROFILING_PROFILER22_REPORT_H

#include "shim_native.h"

/* Print the report of `state` (whose pipelines are struct halide22_profiler_pipeline_stats)
 * through halide_print. The caller holds the state's lock. */
void shim_profiler22_print(void *user_context, const struct halide_profiler_state *state);

#endif
