/* The thread pool: Halide's parallel runtime (the API of HalideRuntime.h, the same in Halide 19,
 * 21 and 22), implemented here with the semantics of Halide's own pool, which every pipeline's
 * parallel loops and async stages run on.
 *
 * Why the shim's own: Halide's pool before 22 can lose a wakeup. Its idle workers sleep on one
 * of two condition variables (the "A team" and the "B team", picked by bookkeeping that has
 * nothing to do with why a worker sleeps), and a semaphore release wakes only the A team, and
 * only when the count goes from 0: a worker that passed over a job for want of a semaphore and
 * went to sleep on the B team never hears of the release that makes the job runnable, and an
 * async pipeline can hang with every thread asleep. (Halide 21's pool also hangs when an async
 * producer fails: the consumer is marked failed, but the thread waiting as owner of a job
 * nested in it hears of it only from its direct parent, and nothing wakes it.) So here there
 * is one reason to sleep and one way to be woken, and the pool serves libraries of every
 * release alike.
 *
 * The wakeup protocol, which cannot lose a wakeup:
 * - Everything the pool decides on (the queue, each job's counts and status, the thread
 *   counts, the generation) is changed under one lock, with one exception: the semaphores'
 *   counts, which generated code releases without it.
 * - A thread that finds nothing it may run sleeps (sleep_locked): it notes the generation
 *   under the lock it scanned under, and sleeps only while the generation is still that one
 *   (the generation is the futex word it sleeps on: the kernel checks it as it puts the thread
 *   to sleep). A spinning phase before that only watches the generation.
 * - Every change that can make a sleeper's reason to wake true bumps the generation under the
 *   lock and wakes every sleeper (notify_locked): new jobs; a semaphore release; an
 *   iteration that ends with a failure (its job's siblings and nested jobs stop), that ends a
 *   job (its owner waits for it), that puts a serial job back on the queue, or that gives back
 *   threads its job reserved; a thread starting on a job that reserves threads (its nested
 *   jobs have one more worker's share to start in); a failure seen by a thread that stops a
 *   job; the workers' retirement. What else changes (a job claimed, threads reserved, a
 *   semaphore acquired) can only make less runnable. A semaphore release adds to the count
 *   first and then takes the lock to notify, so a scanner either saw the new count or noted
 *   a generation the release then bumps.
 * So a sleeper that missed a change would have to have noted the generation after the change
 * (it scanned after it, then, and saw it) or before it (then the generation it would sleep on
 * has moved: it does not sleep, or it is woken): there is no third place.
 *
 * Halide's semantics, kept (docs/threads.md; tests/test_thread_pool.py runs Halide's API under
 * this pool and Halide's side by side):
 * - halide_do_par_for(min, size) runs task(i) for every i in [min, min + size) once, and
 *   halide_do_parallel_tasks runs each task's loop over its range, one iteration at a time
 *   (a serial task: as many consecutive iterations as its semaphores allow, in one call, and
 *   never on two threads at once), an iteration only once the pool acquired every semaphore
 *   the task lists (semaphores acquired for an iteration that still lacks a later one are
 *   kept for the next try, as Halide does: each has one consumer).
 * - The calling thread owns its jobs and runs them too; while it waits for them it may run
 *   only its own jobs, or jobs that cannot block (min_threads 0). A task's code may call
 *   either entry point again (nested parallelism): its thread then owns those jobs in turn.
 * - min_threads: a job that may block (it waits on semaphores, or runs such jobs) starts only
 *   where enough threads are free for it: among the pool's (its workers plus the caller) less
 *   those running jobs reserved, or for a nested job, among what its parent job reserved. The
 *   pool grows past the number of threads asked for, up to MAX_THREADS, rather than leave a
 *   new job too few threads to finish.
 * - A task returning nonzero fails its job and the jobs of the same call (its siblings), whose
 *   iterations not yet started never start, and the jobs nested in failed ones; the caller
 *   gets the first failure's code. The tasks reported their errors themselves.
 * - The hooks an application sets (halide_set_custom_*) replace the entry points as in
 *   Halide; the pool acquires semaphores with the default try_acquire, as Halide's does.
 * - The number of threads: HL_NUM_THREADS (or HL_NUMTHREADS), else the CPUs online, 1 to 256,
 *   read at first use; workers start as jobs need them and stay until shut down.
 *
 * Shutdown (halide_shutdown_thread_pool, and process exit) retires the pool's workers: each
 * finishes what it is running and leaves, and is joined. Jobs still in flight on other threads
 * go on: workers are started again as they need them (at once, in as many as were retired,
 * if any caller is in the pool). At exit a worker still running a task is not waited for
 * (its task may never end: it may wait for an interpreter that has gone): the exit handler
 * (an atexit handler, which runs before any library's destructor, Halide's included, calls
 * halide_shutdown_thread_pool) joins the idle workers only.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_native.h"
#include "calls/call_context.h"
#include "calls/thread_pool.h"

enum {
    MAX_THREADS = 256,
    /* Yields a thread with nothing to run spends watching for new work before it sleeps for
     * real: the end of one parallel loop is often just before the start of the next. */
    SPINS = 40,
    /* Checks a thread waiting for the pool's lock makes before it sleeps (it is held briefly). */
    LOCK_SPINS = 100,
    /* Jobs of a halide_do_parallel_tasks call kept on its stack; more are allocated. */
    STACK_JOBS = 8,
};

typedef struct job job;
struct job {
    /* What to run: a do_par_for's task (task_fn) or a parallel task (task.fn). task.min and
     * task.extent are what is left of the range; a serial task's, while it runs, are those of
     * its batch's start, changed by the thread running it when it gives the job back. */
    struct halide_parallel_task_t task;
    halide_task_t task_fn;
    void *user_context;
    shim_call *call; /* the call context its iterations run in: their caller's */
    job *siblings; /* the jobs of the same call, siblings[0..sibling_count) */
    int sibling_count;
    job *parent;   /* the job whose task made this call (task_parent), or NULL */
    job *above, *below; /* neighbours on the queue, while queued */
    bool queued;
    int active;    /* threads running its iterations now */
    int reserved;  /* threads its running nested jobs hold (their min_threads) */
    int status;    /* 0, or the code of the first failure (read unlocked by its serial runner) */
    int next_semaphore; /* how many of its semaphores are acquired for its next iteration */
};

/* One worker thread. Freed by whoever joins it, or by itself where nobody will. */
typedef struct worker {
    pthread_t thread;
    unsigned epoch; /* the pool's, when it started: it leaves once they differ */
    bool busy;      /* running a job (not looking for one, nor asleep) */
    bool detached;  /* nobody will join it */
} worker;

static struct {
    uint32_t lock;       /* the pool's lock (lock()): 0 free, 1 held, 2 held and waited for */
    uint32_t generation; /* bumped under the lock, read without: what sleepers wait on */
    int waiting;         /* threads waiting (FUTEX_WAIT) on the generation */
    job *top;            /* the queue: a stack, newest first */
    int desired;         /* threads to run jobs on, the calling thread included; 0: not yet read */
    int reserved;        /* threads that running top-level jobs hold (their min_threads) */
    int owners;          /* threads in a do_par_for or do_parallel_tasks of the pool's own */
    unsigned epoch;      /* bumped when the workers are retired */
    int count;           /* the current workers, in workers[0..count) */
    worker *workers[MAX_THREADS];
    bool exiting;        /* the process is exiting */
} pool;

static __thread worker *this_worker;  /* the calling thread's record, if it is a worker */
static __thread int owned_here;       /* how many of pool.owners are the calling thread */

/* ---- the lock and the generation --------------------------------------------------------- */

static void futex(uint32_t *word, int op, uint32_t value) {
    syscall(SYS_futex, word, op | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* The pool's lock, taken at every iteration of every loop: a futex word ("Futexes Are Tricky",
 * U. Drepper, mutex 3), whose uncontended lock and unlock are one atomic instruction each (a
 * pthread mutex's are a call and its checks of the mutex's kind, half the pool's own work per
 * iteration). Held only for a few loads and stores, so a contended lock spins a little first. */
static void lock(void) {
    uint32_t state = 0;
    if (__atomic_compare_exchange_n(&pool.lock, &state, 1, false, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED)) {
        return;
    }
    for (int i = 0; i < LOCK_SPINS; i++) {
        relax();
        state = 0;
        if (__atomic_load_n(&pool.lock, __ATOMIC_RELAXED) == 0 &&
            __atomic_compare_exchange_n(&pool.lock, &state, 1, false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            return;
        }
    }
    while (__atomic_exchange_n(&pool.lock, 2, __ATOMIC_ACQUIRE) != 0) {
        futex(&pool.lock, FUTEX_WAIT, 2);
    }
}

static void unlock(void) {
    if (__atomic_exchange_n(&pool.lock, 0, __ATOMIC_RELEASE) == 2) {
        futex(&pool.lock, FUTEX_WAKE, 1);
    }
}

/* ---- the hooks --------------------------------------------------------------------------- */

static halide_do_par_for_t custom_do_par_for = halide_default_do_par_for;
static halide_do_parallel_tasks_t custom_do_parallel_tasks = halide_default_do_parallel_tasks;
static halide_do_task_t custom_do_task = halide_default_do_task;
static halide_do_loop_task_t custom_do_loop_task = halide_default_do_loop_task;
static halide_semaphore_init_t custom_semaphore_init = halide_default_semaphore_init;
static halide_semaphore_release_t custom_semaphore_release = halide_default_semaphore_release;
static halide_semaphore_try_acquire_t custom_semaphore_try_acquire =
    halide_default_semaphore_try_acquire;

/* A hook's current value; NULL (which Halide would call, and crash) is the default. */
#define HOOK(name, fallback)                                                     \
    ({                                                                           \
        __typeof__(custom_##name) hook_ = __atomic_load_n(&custom_##name, __ATOMIC_ACQUIRE); \
        hook_ != NULL ? hook_ : (fallback);                                      \
    })

halide_do_par_for_t shim_pool_do_par_for(void) {
    return HOOK(do_par_for, halide_default_do_par_for);
}

halide_do_parallel_tasks_t shim_pool_do_parallel_tasks(void) {
    return HOOK(do_parallel_tasks, halide_default_do_parallel_tasks);
}

halide_do_par_for_t halide_set_custom_do_par_for(halide_do_par_for_t f) {
    return __atomic_exchange_n(&custom_do_par_for, f, __ATOMIC_ACQ_REL);
}

halide_do_task_t halide_set_custom_do_task(halide_do_task_t f) {
    return __atomic_exchange_n(&custom_do_task, f, __ATOMIC_ACQ_REL);
}

halide_do_loop_task_t halide_set_custom_do_loop_task(halide_do_loop_task_t f) {
    return __atomic_exchange_n(&custom_do_loop_task, f, __ATOMIC_ACQ_REL);
}

void halide_set_custom_parallel_runtime(halide_do_par_for_t do_par_for, halide_do_task_t do_task,
                                        halide_do_loop_task_t do_loop_task,
                                        halide_do_parallel_tasks_t do_parallel_tasks,
                                        halide_semaphore_init_t semaphore_init,
                                        halide_semaphore_try_acquire_t semaphore_try_acquire,
                                        halide_semaphore_release_t semaphore_release) {
    __atomic_store_n(&custom_do_par_for, do_par_for, __ATOMIC_RELEASE);
    __atomic_store_n(&custom_do_task, do_task, __ATOMIC_RELEASE);
    __atomic_store_n(&custom_do_loop_task, do_loop_task, __ATOMIC_RELEASE);
    __atomic_store_n(&custom_do_parallel_tasks, do_parallel_tasks, __ATOMIC_RELEASE);
    __atomic_store_n(&custom_semaphore_init, semaphore_init, __ATOMIC_RELEASE);
    __atomic_store_n(&custom_semaphore_try_acquire, semaphore_try_acquire, __ATOMIC_RELEASE);
    __atomic_store_n(&custom_semaphore_release, semaphore_release, __ATOMIC_RELEASE);
}

int halide_do_task(void *user_context, halide_task_t f, int idx, uint8_t *closure) {
    return HOOK(do_task, halide_default_do_task)(user_context, f, idx, closure);
}

int halide_do_loop_task(void *user_context, halide_loop_task_t f, int min, int extent,
                        uint8_t *closure, void *task_parent) {
    return HOOK(do_loop_task, halide_default_do_loop_task)(user_context, f, min, extent, closure,
                                                           task_parent);
}

int halide_semaphore_init(struct halide_semaphore_t *sema, int count) {
    return HOOK(semaphore_init, halide_default_semaphore_init)(sema, count);
}

int halide_semaphore_release(struct halide_semaphore_t *sema, int count) {
    return HOOK(semaphore_release, halide_default_semaphore_release)(sema, count);
}

bool halide_semaphore_try_acquire(struct halide_semaphore_t *sema, int count) {
    return HOOK(semaphore_try_acquire, halide_default_semaphore_try_acquire)(sema, count);
}

int halide_default_do_task(void *user_context, halide_task_t f, int idx, uint8_t *closure) {
    return f(user_context, idx, closure);
}

int halide_default_do_loop_task(void *user_context, halide_loop_task_t f, int min, int extent,
                                uint8_t *closure, void *task_parent) {
    return f(user_context, min, extent, closure, task_parent);
}

/* ---- semaphores: the count is the first int of the 16 bytes, as in Halide's ---------------- */

static int *count_of(struct halide_semaphore_t *sema) {
    return (int *)sema;
}

static void notify_locked(void);

int halide_default_semaphore_init(struct halide_semaphore_t *sema, int n) {
    __atomic_store_n(count_of(sema), n, __ATOMIC_RELEASE);
    return n;
}

int halide_default_semaphore_release(struct halide_semaphore_t *sema, int n) {
    int now = __atomic_add_fetch(count_of(sema), n, __ATOMIC_ACQ_REL);
    if (n != 0) {
        /* Whatever the count was: a job may wait for more than one (storage folding). */
        lock();
        notify_locked();
        unlock();
    }
    return now;
}

bool halide_default_semaphore_try_acquire(struct halide_semaphore_t *sema, int n) {
    if (n == 0) {
        return true;
    }
    int *count = count_of(sema);
    int seen = __atomic_load_n(count, __ATOMIC_ACQUIRE);
    while (seen >= n) {
        if (__atomic_compare_exchange_n(count, &seen, seen - n, true, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            return true;
        }
    }
    return false;
}

/* ---- the number of threads --------------------------------------------------------------- */

static int clamp_threads(int n) {
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

static int default_threads(void) {
    const char *text = getenv("HL_NUM_THREADS");
    if (text == NULL) {
        text = getenv("HL_NUMTHREADS"); /* the older name */
    }
    return clamp_threads(text != NULL ? atoi(text) : (int)sysconf(_SC_NPROCESSORS_ONLN));
}

int halide_set_num_threads(int n) {
    if (n < 0) {
        halide_error(NULL, "halide_set_num_threads: must be >= 0.");
    }
    lock();
    int previous = pool.desired; /* 0 if never set nor used, as Halide answers */
    pool.desired = n == 0 ? default_threads() : clamp_threads(n);
    unlock();
    return previous;
}

int halide_get_num_threads(void) {
    lock();
    int n = pool.desired;
    unlock();
    return n;
}

/* ---- the queue and the protocol ---------------------------------------------------------- */

static void notify_locked(void) {
    __atomic_add_fetch(&pool.generation, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool.waiting, __ATOMIC_SEQ_CST) > 0) {
        futex(&pool.generation, FUTEX_WAKE, INT_MAX);
    }
}

/* Wait for the next notify_locked (see the protocol above); the lock is held again on return. */
static void sleep_locked(void) {
    uint32_t seen = pool.generation;
    unlock();
    for (int i = 0; i < SPINS && __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST) == seen;
         i++) {
        sched_yield();
    }
    /* Counted as waiting before it looks again: notify_locked, which bumps the generation
     * before it looks at the count, either sees it or was seen. FUTEX_WAIT sleeps only while
     * the generation is still the one it saw. */
    __atomic_add_fetch(&pool.waiting, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST) == seen) {
        futex(&pool.generation, FUTEX_WAIT, seen);
    }
    __atomic_sub_fetch(&pool.waiting, 1, __ATOMIC_SEQ_CST);
    lock();
}

static void push_locked(job *j) {
    j->above = NULL;
    j->below = pool.top;
    if (pool.top != NULL) {
        pool.top->above = j;
    }
    pool.top = j;
    j->queued = true;
}

static void unlink_locked(job *j) {
    if (j->above != NULL) {
        j->above->below = j->below;
    } else {
        pool.top = j->below;
    }
    if (j->below != NULL) {
        j->below->above = j->above;
    }
    j->queued = false;
}

static int status_of(const job *j) {
    return __atomic_load_n(&j->status, __ATOMIC_RELAXED);
}

static void set_status_locked(job *j, int status) {
    __atomic_store_n(&j->status, status, __ATOMIC_RELAXED);
}

/* A job that failed, or one of whose ancestors did, takes no more iterations. (An ancestor's
 * failure is looked up the chain: its children in between may not hear of it before this job
 * does, their owners being this job's, waiting for it.) Returns whether it changed (its owner,
 * waiting for it, must hear of it). */
static inline __attribute__((always_inline)) bool stop_if_failed_locked(job *j) {
    bool changed = false;
    for (const job *ancestor = j->parent; status_of(j) == 0 && ancestor != NULL;
         ancestor = ancestor->parent) {
        if (status_of(ancestor) != 0) {
            set_status_locked(j, status_of(ancestor));
            changed = true;
        }
    }
    if (status_of(j) != 0 && j->queued) {
        unlink_locked(j);
        j->task.extent = 0;
        changed = true;
    }
    return changed;
}

/* Acquire the semaphores for the job's next iteration, as far as they go. */
static bool acquire_next(job *j) {
    if (j->task.num_semaphores == 0) {
        return true; /* (and no write to the job, which every thread reads) */
    }
    for (; j->next_semaphore < j->task.num_semaphores; j->next_semaphore++) {
        const struct halide_semaphore_acquire_t *s = &j->task.semaphores[j->next_semaphore];
        if (!halide_default_semaphore_try_acquire(s->semaphore, s->count)) {
            return false;
        }
    }
    j->next_semaphore = 0;
    return true;
}

/* Whether the calling thread, owner of the jobs from `owned` on (or a worker: NULL), may run
 * an iteration of `j` now; its semaphores are acquired if so. (A serial job is off the queue
 * while a thread runs it.) */
static bool may_run_locked(job *j, const job *owned) {
    if (owned != NULL && j->siblings != owned && j->task.min_threads != 0) {
        return false; /* it may block, and would block this thread's own jobs under it */
    }
    int free_threads;
    if (j->parent == NULL) {
        free_threads = pool.count + 1 - pool.reserved;
    } else {
        int running = j->parent->active > 1 ? j->parent->active : 1;
        free_threads = j->parent->task.min_threads * running - j->parent->reserved;
    }
    return free_threads >= j->task.min_threads && acquire_next(j);
}

/* The first job on the queue the calling thread may run an iteration of, or NULL. */
static job *find_locked(const job *owned) {
    for (job *j = pool.top, *below; j != NULL; j = below) {
        below = j->below;
        if (stop_if_failed_locked(j)) {
            notify_locked();
        } else if (may_run_locked(j, owned)) {
            return j;
        }
    }
    return NULL;
}

static void fail_locked(job *j, int result) {
    if (status_of(j) == 0) {
        set_status_locked(j, result);
    }
    for (int i = 0; i < j->sibling_count; i++) {
        if (status_of(&j->siblings[i]) == 0) {
            set_status_locked(&j->siblings[i], result);
        }
    }
}

/* Run what the calling thread claims of `j` (whose semaphores for one iteration are acquired):
 * one iteration, or a serial job's batch; the lock is let go meanwhile. */
static void run_locked(job *j) {
    int *reserved = j->parent != NULL ? &j->parent->reserved : &pool.reserved;
    j->active++;
    *reserved += j->task.min_threads;
    if (j->task.min_threads != 0) {
        notify_locked(); /* its nested jobs have one more thread's reservation to start in */
    }
    int result = 0;
    if (j->task.serial) {
        /* Off the queue while it runs: this thread alone touches its range and semaphores. */
        unlink_locked(j);
        unlock();
        int done = 0, batch = 1;
        while (batch > 0) {
            while (done + batch < j->task.extent && status_of(j) == 0 && acquire_next(j)) {
                batch++;
            }
            result = halide_do_loop_task(j->user_context, j->task.fn, j->task.min + done, batch,
                                         j->task.closure, j);
            done += batch;
            batch = result == 0 && done < j->task.extent && status_of(j) == 0 && acquire_next(j);
        }
        lock();
        j->task.min += done;
        j->task.extent -= done;
    } else {
        int index = j->task.min++;
        if (--j->task.extent == 0) {
            unlink_locked(j);
        }
        unlock();
        if (j->task_fn != NULL) {
            result = halide_do_task(j->user_context, j->task_fn, index, j->task.closure);
        } else {
            result = halide_do_loop_task(j->user_context, j->task.fn, index, 1, j->task.closure,
                                         j);
        }
        lock();
    }
    if (result != 0) {
        fail_locked(j, result);
    }
    *reserved -= j->task.min_threads;
    j->active--;
    bool requeued = false;
    if (j->task.serial) {
        if (status_of(j) != 0) {
            j->task.extent = 0;
        } else if (j->task.extent > 0) {
            push_locked(j);
            requeued = true;
        }
    }
    if (result != 0 || requeued || j->task.min_threads != 0 ||
        (j->active == 0 && j->task.extent == 0)) {
        notify_locked();
    }
}

/* Whether the jobs owned[0..count) are all done (failed ones stopped). */
static bool finished_locked(job *owned, int count) {
    bool finished = true, changed = false;
    for (int i = 0; i < count; i++) {
        changed |= stop_if_failed_locked(&owned[i]);
        finished &= owned[i].task.extent == 0 && owned[i].active == 0;
    }
    if (changed) {
        notify_locked();
    }
    return finished;
}

/* Run jobs until the calling thread's own, owned[0..count), are done; a worker (owned NULL)
 * until it is retired. */
static void serve_locked(job *owned, int count, worker *self) {
    /* The thread's call context, which it keeps from one iteration to the next of the same
     * call, and gets back as it leaves. */
    shim_call *own_call = shim_current_call(), *in = own_call;
    while (owned != NULL ? !finished_locked(owned, count) : self->epoch == pool.epoch) {
        job *j = find_locked(owned);
        if (j == NULL) {
            sleep_locked();
            continue;
        }
        if (j->call != in) {
            shim_call_enter(j->call);
            in = j->call;
        }
        if (self != NULL) {
            self->busy = true;
        }
        run_locked(j);
        if (self != NULL) {
            self->busy = false;
        }
    }
    if (in != own_call) {
        shim_call_enter(own_call);
    }
}

static void *worker_main(void *arg) {
    worker *self = arg;
    this_worker = self;
    lock();
    serve_locked(NULL, 0, self);
    bool detached = self->detached;
    unlock();
    if (detached) {
        free(self);
    }
    return NULL;
}

static bool spawn_locked(void) {
    worker *w = calloc(1, sizeof *w);
    if (w == NULL) {
        return false;
    }
    w->epoch = pool.epoch;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        free(w);
        return false; /* fewer threads: the pool goes on with those it has */
    }
    pool.workers[pool.count++] = w;
    return true;
}

/* Put the jobs of one call on the queue, the first on top, starting the workers they need. */
static void enqueue_locked(job *jobs, int count, job *parent) {
    if (pool.desired == 0) {
        pool.desired = default_threads();
    }
    if (parent == NULL) {
        /* Threads the jobs may hold blocked at once, plus one for the whole (Halide counts the
         * same): a blocking top-level job is in no enclosing job's reservation. */
        int needed = 0;
        bool may_block = false;
        for (int i = 0; i < count; i++) {
            needed += jobs[i].task.min_threads;
            may_block |= jobs[i].task.min_threads != 0 || jobs[i].task.num_semaphores != 0;
        }
        needed += may_block;
        while (pool.count < MAX_THREADS &&
               (pool.count < pool.desired - 1 || pool.count + 1 - pool.reserved < needed) &&
               spawn_locked()) {
        }
    }
    for (int i = count - 1; i >= 0; i--) {
        push_locked(&jobs[i]);
    }
    pool.owners++;
    owned_here++;
    notify_locked();
}

/* The calling thread's jobs, run: enqueue them, help until they are done. */
static void own_jobs(job *jobs, int count, job *parent) {
    lock();
    enqueue_locked(jobs, count, parent);
    serve_locked(jobs, count, NULL);
    pool.owners--;
    owned_here--;
    unlock();
}

static void prepare(job *j, void *user_context, job *siblings, int sibling_count, job *parent) {
    j->user_context = user_context;
    j->call = shim_current_call();
    j->siblings = siblings;
    j->sibling_count = sibling_count;
    j->parent = parent;
    j->queued = false;
    j->active = j->reserved = j->status = j->next_semaphore = 0;
}

int halide_default_do_par_for(void *user_context, halide_task_t f, int min, int size,
                              uint8_t *closure) {
    if (size <= 0) {
        return halide_error_code_success;
    }
    job j = {.task = {.closure = closure, .min = min, .extent = size}, .task_fn = f};
    prepare(&j, user_context, &j, 1, NULL);
    own_jobs(&j, 1, NULL);
    return j.status;
}

int halide_default_do_parallel_tasks(void *user_context, int num_tasks,
                                     struct halide_parallel_task_t *tasks, void *task_parent) {
    job on_stack[STACK_JOBS];
    job *jobs = on_stack;
    if (num_tasks > STACK_JOBS && (jobs = malloc(num_tasks * sizeof *jobs)) == NULL) {
        return halide_error_out_of_memory(user_context);
    }
    int count = 0;
    for (int i = 0; i < num_tasks; i++) {
        if (tasks[i].extent > 0) { /* (empty tasks are left out) */
            jobs[count] = (job){.task = tasks[i]};
            count++;
        }
    }
    for (int i = 0; i < count; i++) {
        prepare(&jobs[i], user_context, jobs, count, task_parent);
    }
    int status = halide_error_code_success;
    if (count > 0) {
        own_jobs(jobs, count, task_parent);
        for (int i = 0; i < count && status == 0; i++) {
            status = jobs[i].status;
        }
    }
    if (jobs != on_stack) {
        free(jobs);
    }
    return status;
}

/* ---- shutdown, exit and fork ------------------------------------------------------------- */

/* Retire the workers: each leaves once it has finished what it runs. Joins them all, or at
 * exit only those not running a job. */
static void retire(bool wait_for_busy) {
    worker *retired[MAX_THREADS];
    lock();
    int count = pool.count;
    for (int i = 0; i < count; i++) {
        retired[i] = pool.workers[i];
        /* (A task may shut the pool down, or exit the process, on a worker's own thread.) */
        if (retired[i] == this_worker || (retired[i]->busy && !wait_for_busy)) {
            retired[i]->detached = true;
            pthread_detach(retired[i]->thread);
            retired[i] = NULL;
        }
    }
    pool.count = 0;
    pool.epoch++;
    notify_locked();
    /* Callers in the pool keep as many threads as they had, so none waits for good for a
     * worker it counted on (a retired one may be running their nested jobs' parents). */
    for (int i = 0; i < count && pool.owners > 0 && !pool.exiting; i++) {
        spawn_locked();
    }
    unlock();
    for (int i = 0; i < count; i++) {
        if (retired[i] != NULL) {
            pthread_join(retired[i]->thread, NULL);
            free(retired[i]);
        }
    }
}

void halide_shutdown_thread_pool(void) {
    lock();
    bool exiting = pool.exiting;
    unlock();
    retire(!exiting);
}

static void at_exit(void) {
    lock();
    pool.exiting = true;
    unlock();
    retire(false);
}

__attribute__((constructor)) static void watch_exit(void) {
    atexit(at_exit);
}

void shim_pool_after_fork_in_child(void) {
    /* The other threads are gone: their locks, waits, jobs and workers with them. */
    pool.lock = 0;
    pool.waiting = 0;
    pool.top = NULL;
    pool.reserved = 0;
    pool.owners = owned_here;
    for (int i = 0; i < pool.count; i++) {
        if (pool.workers[i] == this_worker) {
            this_worker->detached = true;
        } else {
            free(pool.workers[i]);
        }
    }
    pool.count = 0;
    pool.epoch++;
}
