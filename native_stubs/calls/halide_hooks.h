/* The hooks an application installs with Halide's halide_set_* functions, as Halide's own
 * runtime keeps them: the standalone runtime linked into this library (native_stubs/build.py)
 * defines the setters, and each stores into a variable of Halide::Runtime::Internal, named here
 * by its mangled name (Halide 21's src/runtime: posix_error_handler.cpp, posix_print.cpp,
 * thread_pool_common.h, can_use_target.cpp). The shim's own halide_error, halide_print,
 * halide_do_par_for, halide_do_parallel_tasks and halide_can_use_target_features read them, so
 * that a handler an application set is called with Halide's semantics; the link fails if a Halide release renames one. halide_malloc,
 * halide_free, halide_do_task, the semaphores and the tracer are Halide's own functions here,
 * which read their hooks themselves. */
#ifndef SHIM_CALLS_HALIDE_HOOKS_H
#define SHIM_CALLS_HALIDE_HOOKS_H

#include "shim_native.h"

typedef int (*shim_do_par_for_t)(void *, halide_task_t, int, int, uint8_t *);
typedef int (*shim_do_parallel_tasks_t)(void *, int, struct halide_parallel_task_t *, void *);

extern halide_error_handler_t shim_halide_error_handler
    __asm__("_ZN6Halide7Runtime8Internal13error_handlerE");
extern halide_print_t shim_halide_custom_print __asm__("_ZN6Halide7Runtime8Internal12custom_printE");
extern shim_do_par_for_t shim_halide_custom_do_par_for
    __asm__("_ZN6Halide7Runtime8Internal17custom_do_par_forE");
extern shim_do_parallel_tasks_t shim_halide_custom_do_parallel_tasks
    __asm__("_ZN6Halide7Runtime8Internal24custom_do_parallel_tasksE");
extern halide_can_use_target_features_t shim_halide_custom_can_use_target_features
    __asm__("_ZN6Halide7Runtime8Internal30custom_can_use_target_featuresE");

/* (Until an application sets its own, they hold Halide's defaults: halide_default_error,
 * halide_default_print, halide_default_do_par_for, halide_default_do_parallel_tasks.) */

#endif
