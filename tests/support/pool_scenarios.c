/* Scenarios of Halide's thread-pool API, called as generated code and applications call it:
 * built once against the shim (its halide_* are the shim's, loaded first) and once linked with
 * Halide's standalone runtime, so that tests/test_thread_pool.py runs each under both and
 * compares (tests/support/pool_scenarios.py). Each scenario writes what it saw into `out` and
 * returns how many values it wrote. Waits that the pool must end (a task waiting for its
 * siblings to arrive) have no time limit: the test's watchdog ends a process that hangs. */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "HalideRuntime.h"

static int errors_reported;

static void count_error(void *user_context, const char *message) {
    __atomic_add_fetch(&errors_reported, 1, __ATOMIC_SEQ_CST);
}

/* Halide's default handler aborts: every scenario counts instead. */
__attribute__((constructor)) static void handle_errors(void) {
    halide_set_error_handler(count_error);
}

/* ---- tasks ------------------------------------------------------------------------------- */

enum { SPAN = 1100 };
static int hits[SPAN];
static int hits_outside, hits_base;

static void hit(int index) {
    int k = index - hits_base;
    __atomic_add_fetch(k >= 0 && k < SPAN ? &hits[k] : &hits_outside, 1, __ATOMIC_SEQ_CST);
}

/* 1 if indices [hits_base, hits_base + count) were each hit once and no other was. */
static int64_t each_once(int count) {
    for (int k = 0; k < SPAN; k++) {
        if (hits[k] != (k < count ? 1 : 0)) {
            return 0;
        }
    }
    return hits_outside == 0;
}

static void clear_hits(int base) {
    memset(hits, 0, sizeof hits);
    hits_outside = 0;
    hits_base = base;
}

static int hit_task(void *user_context, int index, uint8_t *closure) {
    hit(index);
    return 0;
}

static int hit_loop_task(void *user_context, int min, int extent, uint8_t *closure,
                         void *task_parent) {
    for (int i = min; i < min + extent; i++) {
        hit(i);
    }
    return 0;
}

/* A meeting of `meeting_size` tasks: each waits until all have arrived, so it ends only once
 * that many threads run them at once. The threads that came are recorded. */
static int meeting_size, arrived;
static pthread_t attendees[64];

static void meet(void) {
    int me = __atomic_fetch_add(&arrived, 1, __ATOMIC_SEQ_CST);
    attendees[me % 64] = pthread_self();
    while (__atomic_load_n(&arrived, __ATOMIC_SEQ_CST) < meeting_size) {
        sched_yield();
    }
}

static int meet_task(void *user_context, int index, uint8_t *closure) {
    meet();
    return 0;
}

static int meet_loop_task(void *user_context, int min, int extent, uint8_t *closure,
                          void *task_parent) {
    meet();
    return 0;
}

static int64_t distinct_attendees(void) {
    int distinct = 0;
    for (int i = 0; i < meeting_size && i < 64; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) {
            seen |= pthread_equal(attendees[i], attendees[j]);
        }
        distinct += !seen;
    }
    return distinct;
}

static void new_meeting(int size) {
    meeting_size = size;
    arrived = 0;
}

static struct halide_parallel_task_t task(halide_loop_task_t fn, int min, int extent) {
    struct halide_parallel_task_t t;
    memset(&t, 0, sizeof t);
    t.fn = fn;
    t.min = min;
    t.extent = extent;
    return t;
}

/* ---- do_par_for -------------------------------------------------------------------------- */

/* Every index of the range once, for ranges of every kind, the empty ones without a call. */
int pool_scenario_par_for_covers(int64_t *out) {
    static const int ranges[][2] = {{0, 1000}, {-7, 33}, {5, 1}, {3, 0}, {3, -2}};
    int n = 0;
    for (int i = 0; i < 5; i++) {
        clear_hits(ranges[i][0]);
        out[n++] = halide_do_par_for(NULL, hit_task, ranges[i][0], ranges[i][1], NULL);
        out[n++] = each_once(ranges[i][1] > 0 ? ranges[i][1] : 0);
    }
    return n;
}

/* A loop of as many tasks as the pool's threads runs them all at once, on that many threads. */
int pool_scenario_threads_at_once(int64_t *out) {
    clear_hits(0);
    halide_do_par_for(NULL, hit_task, 0, 1, NULL); /* (the pool reads its size at first use) */
    int threads = halide_get_num_threads();
    new_meeting(threads);
    out[0] = threads;
    out[1] = halide_do_par_for(NULL, meet_task, 0, threads, NULL);
    out[2] = distinct_attendees();
    return 3;
}

static int fail_every_tenth(void *user_context, int index, uint8_t *closure) {
    return index % 10 == 3 ? -(100 + index) : 0;
}

/* A failing iteration's code comes back (one of them: which one is unspecified). */
int pool_scenario_par_for_errors(int64_t *out) {
    int result = halide_do_par_for(NULL, fail_every_tenth, 0, 100, NULL);
    out[0] = result < 0 && (-result - 100) % 10 == 3 && -result - 100 < 100;
    out[1] = errors_reported; /* (the pool reports nothing itself) */
    return 2;
}

/* ---- do_parallel_tasks ------------------------------------------------------------------- */

static int slow_iterations;

static int fail_now(void *user_context, int min, int extent, uint8_t *closure, void *task_parent) {
    return -7;
}

static int fail_later(void *user_context, int min, int extent, uint8_t *closure,
                      void *task_parent) {
    usleep(20000);
    return -9;
}

/* (The slow jobs take seconds to run whole on a few threads: stopped, they run for as long as
 * their failing sibling took to fail, milliseconds.) */
enum { SLOW_SIBLING = 10000, SLOW_NESTED = 20000 };

static int slow(void *user_context, int min, int extent, uint8_t *closure, void *task_parent) {
    __atomic_add_fetch(&slow_iterations, extent, __ATOMIC_SEQ_CST);
    usleep(100);
    return 0;
}

static int nest_slow(void *user_context, int min, int extent, uint8_t *closure,
                     void *task_parent) {
    struct halide_parallel_task_t nested = task(slow, 0, SLOW_NESTED);
    return halide_do_parallel_tasks(user_context, 1, &nested, task_parent);
}

/* A failing task stops its siblings, and the jobs nested in them. */
int pool_scenario_sibling_errors(int64_t *out) {
    slow_iterations = 0;
    struct halide_parallel_task_t tasks[2] = {task(fail_now, 0, 1), task(slow, 0, SLOW_SIBLING)};
    out[0] = halide_do_parallel_tasks(NULL, 2, tasks, NULL);
    out[1] = slow_iterations < SLOW_SIBLING;
    slow_iterations = 0;
    struct halide_parallel_task_t nesting[2] = {task(fail_later, 0, 1), task(nest_slow, 0, 1)};
    nesting[1].min_threads = 1; /* (it waits for its nested job: as the compiler counts it) */
    out[2] = halide_do_parallel_tasks(NULL, 2, nesting, NULL);
    out[3] = slow_iterations < SLOW_NESTED;
    return 4;
}

static struct halide_semaphore_t gate;
static int serial_inside, serial_overlaps, serial_disorder, serial_next, serial_total;

static int serial_body(void *user_context, int min, int extent, uint8_t *closure,
                       void *task_parent) {
    if (__atomic_exchange_n(&serial_inside, 1, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&serial_overlaps, 1, __ATOMIC_SEQ_CST);
    }
    serial_disorder += min != serial_next;
    serial_next = min + extent;
    serial_total += extent;
    for (volatile int spin = 0; spin < 2000; spin++) {
    }
    __atomic_store_n(&serial_inside, 0, __ATOMIC_SEQ_CST);
    return 0;
}

static int open_gate(void *user_context, int min, int extent, uint8_t *closure,
                     void *task_parent) {
    halide_semaphore_release(&gate, extent);
    return 0;
}

/* A serial task, gated by a semaphore its sibling releases an iteration at a time: its
 * iterations in order, never two at once. */
int pool_scenario_serial(int64_t *out) {
    halide_semaphore_init(&gate, 0);
    serial_inside = serial_overlaps = serial_disorder = serial_next = serial_total = 0;
    struct halide_semaphore_acquire_t acquire = {&gate, 1};
    struct halide_parallel_task_t tasks[2] = {task(serial_body, 0, 500), task(open_gate, 0, 500)};
    tasks[0].serial = true;
    tasks[0].semaphores = &acquire;
    tasks[0].num_semaphores = 1;
    tasks[0].min_threads = 1;
    out[0] = halide_do_parallel_tasks(NULL, 2, tasks, NULL);
    out[1] = serial_overlaps;
    out[2] = serial_disorder;
    out[3] = serial_total;
    return 4;
}

enum { PRODUCED = 600 };
static int produced[PRODUCED];
static struct halide_semaphore_t ready;
static int gate_violations, consumed;

static int produce(void *user_context, int min, int extent, uint8_t *closure, void *task_parent) {
    for (int i = min; i < min + extent; i++) {
        __atomic_store_n(&produced[i], 3 * i + 1, __ATOMIC_SEQ_CST);
        halide_semaphore_release(&ready, 1);
    }
    return 0;
}

/* Iteration i of a consumer acquiring `per` counts needs produced[0 .. per * (i + 1)). */
static int consume(void *user_context, int min, int extent, uint8_t *closure, void *task_parent) {
    int per = *(int *)closure;
    for (int i = per * min; i < per * (min + extent); i++) {
        if (__atomic_load_n(&produced[i], __ATOMIC_SEQ_CST) != 3 * i + 1) {
            __atomic_add_fetch(&gate_violations, 1, __ATOMIC_SEQ_CST);
        }
    }
    __atomic_add_fetch(&consumed, extent, __ATOMIC_SEQ_CST);
    return 0;
}

/* A consumer's iteration runs only once the semaphores it lists are acquired: with counts of
 * 1, and of 2 built up by releases of 1. */
int pool_scenario_semaphores_gate(int64_t *out) {
    int n = 0;
    for (int per = 1; per <= 2; per++) {
        memset(produced, 0, sizeof produced);
        halide_semaphore_init(&ready, 0);
        gate_violations = consumed = 0;
        struct halide_semaphore_acquire_t acquire = {&ready, per};
        struct halide_parallel_task_t tasks[2] = {task(produce, 0, PRODUCED),
                                                  task(consume, 0, PRODUCED / per)};
        tasks[0].serial = true;
        tasks[1].closure = (uint8_t *)&per;
        tasks[1].semaphores = &acquire;
        tasks[1].num_semaphores = 1;
        tasks[1].min_threads = 1;
        out[n++] = halide_do_parallel_tasks(NULL, 2, tasks, NULL);
        out[n++] = gate_violations;
        out[n++] = consumed;
    }
    return n;
}

/* Tasks that may block (min_threads) run at once even where the pool was asked for one thread:
 * it grows rather than leave them waiting for each other. */
int pool_scenario_min_threads(int64_t *out) {
    halide_set_num_threads(1);
    new_meeting(3);
    struct halide_parallel_task_t tasks[3] = {task(meet_loop_task, 0, 1),
                                              task(meet_loop_task, 0, 1),
                                              task(meet_loop_task, 0, 1)};
    for (int i = 0; i < 3; i++) {
        tasks[i].min_threads = 1;
    }
    out[0] = halide_do_parallel_tasks(NULL, 3, tasks, NULL);
    out[1] = distinct_attendees();
    out[2] = halide_get_num_threads();
    return 3;
}

static int nested_par_for(void *user_context, int index, uint8_t *closure) {
    return halide_do_par_for(user_context, hit_task, index * 50, 50, NULL);
}

static int nested_tasks(void *user_context, int min, int extent, uint8_t *closure,
                        void *task_parent) {
    struct halide_parallel_task_t inner[2] = {task(hit_loop_task, min * 40, 25),
                                              task(hit_loop_task, min * 40 + 25, 15)};
    inner[1].serial = true;
    return halide_do_parallel_tasks(user_context, 2, inner, task_parent);
}

/* Loops inside loops' tasks, both entry points: every inner index once. */
int pool_scenario_nested(int64_t *out) {
    clear_hits(0);
    out[0] = halide_do_par_for(NULL, nested_par_for, 0, 20, NULL);
    out[1] = each_once(1000);
    clear_hits(0);
    struct halide_parallel_task_t outer = task(nested_tasks, 0, 25);
    out[2] = halide_do_parallel_tasks(NULL, 1, &outer, NULL);
    out[3] = each_once(1000);
    return 4;
}

/* ---- the thread count -------------------------------------------------------------------- */

/* What halide_set_num_threads returns and halide_get_num_threads reads, from a fresh process. */
int pool_scenario_num_threads(int64_t *out) {
    int n = 0;
    out[n++] = halide_get_num_threads();
    out[n++] = halide_set_num_threads(3);
    out[n++] = halide_get_num_threads();
    out[n++] = halide_set_num_threads(0);
    out[n++] = halide_get_num_threads();
    out[n++] = halide_set_num_threads(1000);
    out[n++] = halide_get_num_threads();
    out[n++] = halide_set_num_threads(-1);
    out[n++] = halide_get_num_threads();
    out[n++] = errors_reported;
    return n;
}

/* The count a fresh process's pool starts with, read at its first loop. */
int pool_scenario_first_use(int64_t *out) {
    out[0] = halide_get_num_threads();
    clear_hits(0);
    out[1] = halide_do_par_for(NULL, hit_task, 0, 10, NULL);
    out[2] = halide_get_num_threads();
    return 3;
}

/* ---- hooks ------------------------------------------------------------------------------- */

static int hooked_tasks, hooked_loop_tasks, hooked_loops, hooked_inits;

static int counting_do_task(void *user_context, halide_task_t f, int index, uint8_t *closure) {
    __atomic_add_fetch(&hooked_tasks, 1, __ATOMIC_SEQ_CST);
    return f(user_context, index, closure);
}

static int counting_do_loop_task(void *user_context, halide_loop_task_t f, int min, int extent,
                                 uint8_t *closure, void *task_parent) {
    __atomic_add_fetch(&hooked_loop_tasks, 1, __ATOMIC_SEQ_CST);
    return f(user_context, min, extent, closure, task_parent);
}

/* An application's own pool: every iteration in turn on the calling thread. */
static int serial_do_par_for(void *user_context, halide_task_t f, int min, int size,
                             uint8_t *closure) {
    hooked_loops++;
    for (int i = min; i < min + size; i++) {
        int result = f(user_context, i, closure);
        if (result != 0) {
            return result;
        }
    }
    return 0;
}

static int counting_semaphore_init(struct halide_semaphore_t *s, int n) {
    hooked_inits++;
    return halide_default_semaphore_init(s, n);
}

/* The hooks an application sets replace the entry points; the setters return the previous. */
int pool_scenario_hooks(int64_t *out) {
    int n = 0;
    halide_do_task_t default_task = halide_set_custom_do_task(counting_do_task);
    halide_do_loop_task_t default_loop = halide_set_custom_do_loop_task(counting_do_loop_task);
    out[n++] = default_task == halide_default_do_task;
    out[n++] = default_loop == halide_default_do_loop_task;
    clear_hits(0);
    out[n++] = halide_do_par_for(NULL, hit_task, 0, 20, NULL);
    struct halide_parallel_task_t loop = task(hit_loop_task, 20, 10);
    out[n++] = halide_do_parallel_tasks(NULL, 1, &loop, NULL);
    out[n++] = each_once(30);
    out[n++] = hooked_tasks;
    out[n++] = hooked_loop_tasks;
    out[n++] = halide_set_custom_do_task(default_task) == counting_do_task;
    out[n++] = halide_set_custom_do_loop_task(default_loop) == counting_do_loop_task;

    halide_do_par_for_t default_par_for = halide_set_custom_do_par_for(serial_do_par_for);
    out[n++] = default_par_for == halide_default_do_par_for;
    clear_hits(0);
    out[n++] = halide_do_par_for(NULL, hit_task, 0, 7, NULL);
    out[n++] = each_once(7);
    out[n++] = hooked_loops;
    out[n++] = halide_set_custom_do_par_for(default_par_for) == serial_do_par_for;

    halide_set_custom_parallel_runtime(
        halide_default_do_par_for, halide_default_do_task, halide_default_do_loop_task,
        halide_default_do_parallel_tasks, counting_semaphore_init,
        halide_default_semaphore_try_acquire, halide_default_semaphore_release);
    struct halide_semaphore_t s;
    out[n++] = halide_semaphore_init(&s, 4);
    out[n++] = hooked_inits;
    halide_set_custom_parallel_runtime(
        halide_default_do_par_for, halide_default_do_task, halide_default_do_loop_task,
        halide_default_do_parallel_tasks, halide_default_semaphore_init,
        halide_default_semaphore_try_acquire, halide_default_semaphore_release);
    out[n++] = halide_semaphore_init(&s, 1);
    out[n++] = hooked_inits;
    return n;
}

/* ---- semaphores, shutdown ---------------------------------------------------------------- */

int pool_scenario_semaphores(int64_t *out) {
    struct halide_semaphore_t s;
    int n = 0;
    out[n++] = halide_semaphore_init(&s, 2);
    out[n++] = halide_semaphore_release(&s, 3);
    out[n++] = halide_semaphore_try_acquire(&s, 6);
    out[n++] = halide_semaphore_try_acquire(&s, 5);
    out[n++] = halide_semaphore_try_acquire(&s, 0);
    out[n++] = halide_semaphore_try_acquire(&s, 1);
    out[n++] = halide_semaphore_release(&s, 0);
    out[n++] = halide_semaphore_release(&s, 1);
    return n;
}

static int64_t threads_in_process(void) {
    int64_t count = 0;
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    while (status != NULL && fgets(line, sizeof line, status) != NULL) {
        if (strncmp(line, "Threads:", 8) == 0) {
            count = strtol(line + 8, NULL, 10);
        }
    }
    if (status != NULL) {
        fclose(status);
    }
    return count;
}

/* Shutting the pool down joins its workers; the next loop starts new ones. */
int pool_scenario_shutdown(int64_t *out) {
    int64_t before = threads_in_process();
    halide_set_num_threads(4);
    new_meeting(4);
    out[0] = halide_do_par_for(NULL, meet_task, 0, 4, NULL);
    out[1] = threads_in_process() - before;
    halide_shutdown_thread_pool();
    out[2] = threads_in_process() - before;
    out[3] = halide_get_num_threads();
    new_meeting(4);
    out[4] = halide_do_par_for(NULL, meet_task, 0, 4, NULL);
    out[5] = threads_in_process() - before;
    halide_shutdown_thread_pool();
    halide_shutdown_thread_pool(); /* (again: nothing to do) */
    out[6] = threads_in_process() - before;
    return 7;
}

/* ---- for the exit tests ------------------------------------------------------------------ */

static pthread_t blocking_caller;
static int blocked, blocking;

/* The caller's iteration waits for the others, which workers run, and which never end.
 * (min_threads 1: the pool counts each as a thread that may block, and starts others for other
 * work.) */
static int never_ends_on_workers(void *user_context, int min, int extent, uint8_t *closure,
                                 void *task_parent) {
    if (pthread_equal(pthread_self(), blocking_caller)) {
        while (__atomic_load_n(&blocked, __ATOMIC_SEQ_CST) < blocking) {
            sched_yield();
        }
        return 0;
    }
    __atomic_add_fetch(&blocked, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        pause();
    }
}

/* A job of `iterations` that never returns, `iterations - 1` of them blocking workers for good:
 * run it on a thread of its own. */
void pool_block_forever(int iterations) {
    blocking_caller = pthread_self();
    blocking = iterations - 1;
    struct halide_parallel_task_t t = task(never_ends_on_workers, 0, iterations);
    t.min_threads = 1;
    halide_do_parallel_tasks(NULL, 1, &t, NULL);
}

/* How many workers pool_block_forever blocked so far. */
int pool_blocked_workers(void) {
    return __atomic_load_n(&blocked, __ATOMIC_SEQ_CST);
}
