/* The hooks an application installs with Halide's halide_set_error_handler,
 * halide_set_custom_print and halide_set_custom_can_use_target_features, as Halide's own runtime
 * keeps them: the standalone runtime linked into this library (native_stubs/build.py) defines
 * the setters, and each stores into a variable of Halide::Runtime::Internal, named here by its
 * mangled name (Halide 21's src/runtime: posix_error_handler.cpp, posix_print.cpp,
 * can_use_target.cpp). The shim's own halide_error, halide_print and
 * halide_can_use_target_features read them, so that a handler an application set is called
 * with Halide's semantics; the link fails if a Halide release renames one. halide_malloc and
 * halide_free are Halide's own functions here, which read their hooks themselves; the thread
 * pool's hooks are the shim's pool's own (calls/thread_pool.c), the tracer's the shim's tracer's
 * (profiling/trace_handlers.c). */
#ifndef SHIM_CALLS_HALIDE_HOOKS_H
#define SHIM_CALLS_HALIDE_HOOKS_H

#include "shim_native.h"

extern halide_error_handler_t shim_halide_error_handler
    __asm__("_ZN6Halide7Runtime8Internal13error_handlerE");
extern halide_print_t shim_halide_custom_print __asm__("_ZN6Halide7Runtime8Internal12custom_printE");
extern halide_can_use_target_features_t shim_halide_custom_can_use_target_features
    __asm__("_ZN6Halide7Runtime8Internal30custom_can_use_target_featuresE");

/* (Until an application sets its own, they hold Halide's defaults: halide_default_error,
 * halide_default_print, halide_default_can_use_target_features.) */

#endif
