/* Thread-pool entry points that carry the caller's call context into the pool's threads.
 *
 * A pipeline's parallel loops and async producers run on the thread pool, so an error, a print
 * or a device call can come from a thread that Python never saw. Generated code enters the
 * pool only through halide_do_par_for and halide_do_parallel_tasks, which hand the work to the
 * thread pool an application installed (halide_set_custom_do_par_for,
 * halide_set_custom_parallel_runtime), by default the shim's own (calls/thread_pool.c). The
 * shim's own runs each job in its caller's context itself (a thread enters it once for all the
 * iterations it runs in a row); an application's knows nothing of contexts, so it is handed
 * each task wrapped to run under the context of the call that spawned it.
 */
#include <stdlib.h>

#include "shim_native.h"
#include "calls/call_context.h"
#include "calls/thread_pool.h"

typedef struct {
    halide_task_t fn;
    uint8_t *closure;
    shim_call *call;
} wrapped_task;

typedef struct {
    halide_loop_task_t fn;
    uint8_t *closure;
    shim_call *call;
} wrapped_loop_task;

static int run_task(void *user_context, int index, uint8_t *closure) {
    const wrapped_task *task = (const wrapped_task *)closure;
    shim_call *previous = shim_call_enter(task->call);
    int result = task->fn(user_context, index, task->closure);
    shim_call_leave(previous);
    return result;
}

static int run_loop_task(void *user_context, int min, int extent, uint8_t *closure,
                         void *task_parent) {
    const wrapped_loop_task *task = (const wrapped_loop_task *)closure;
    shim_call *previous = shim_call_enter(task->call);
    int result = task->fn(user_context, min, extent, task->closure, task_parent);
    shim_call_leave(previous);
    return result;
}

int halide_do_par_for(void *user_context, halide_task_t fn, int min, int size,
                      uint8_t *closure) {
    halide_do_par_for_t pool = shim_pool_do_par_for();
    shim_call *call = shim_current_call();
    if (call == NULL || pool == halide_default_do_par_for) {
        return pool(user_context, fn, min, size, closure);
    }
    /* A do_par_for returns only after every task has run, so the wrapper can live on this
     * stack frame. */
    wrapped_task task = {fn, closure, call};
    return pool(user_context, run_task, min, size, (uint8_t *)&task);
}

int halide_do_parallel_tasks(void *user_context, int num_tasks,
                             struct halide_parallel_task_t *tasks, void *task_parent) {
    halide_do_parallel_tasks_t pool = shim_pool_do_parallel_tasks();
    shim_call *call = shim_current_call();
    if (call == NULL || num_tasks <= 0 || pool == halide_default_do_parallel_tasks) {
        return pool(user_context, num_tasks, tasks, task_parent);
    }
    struct halide_parallel_task_t *copies = malloc(num_tasks * sizeof(*copies));
    wrapped_loop_task *wrappers = malloc(num_tasks * sizeof(*wrappers));
    if (copies == NULL || wrappers == NULL) {
        free(copies);
        free(wrappers);
        return halide_error_out_of_memory(user_context);
    }
    for (int i = 0; i < num_tasks; i++) {
        wrappers[i] = (wrapped_loop_task){tasks[i].fn, tasks[i].closure, call};
        copies[i] = tasks[i];
        copies[i].fn = run_loop_task;
        copies[i].closure = (uint8_t *)&wrappers[i];
    }
    int result = pool(user_context, num_tasks, copies, task_parent);
    free(copies);
    free(wrappers);
    return result;
}
