/* The thread pool (thread_pool.c): what the other C files use of it beyond Halide's API. */
#ifndef SHIM_CALLS_THREAD_POOL_H
#define SHIM_CALLS_THREAD_POOL_H

#include "shim_native.h"

/* The pool halide_do_par_for and halide_do_parallel_tasks hand their work to
 * (calls/parallel.c): the one an application installed (halide_set_custom_do_par_for,
 * halide_set_custom_parallel_runtime), else the shim's own, halide_default_*. */
halide_do_par_for_t shim_pool_do_par_for(void);
halide_do_parallel_tasks_t shim_pool_do_parallel_tasks(void);

/* In a forked child (forks/fork.c), which has only the forking thread: the pool as a fresh
 * process has it, but for the number of threads asked for. */
void shim_pool_after_fork_in_child(void);

#endif
