/* Halide's profiler entry points, which a pipeline built with -profile or -profile_by_timer
 * calls (abi/shim_profile.h), each call served by the release of the library it comes from
 * (calls/releases.h: the release's profiler_abi):
 *
 * - Halide 19 and 21 libraries (profiler_abi 0): Halide 21's runtime, the code they ran before
 *   the shim served releases, kept callable under other names (native_stubs/build.py), on
 *   Halide 21's state (halide_profiler_get_state), which Halide's destructor reports at exit.
 * - Halide 22 libraries (profiler_abi 1): Halide 22's semantics (src/runtime/profiler_common.cpp
 *   at abbf7ff983), on a state of the shim's own. Its generated code passes 11 arguments to
 *   instance_start, lays its entries out as 192-byte halide22_profiler_func_stats after the
 *   instance, and adds its counters itself (halide_profiler_update_counters, inlined into it):
 *   Halide 21's sampler, walking the instances with 72-byte entries, would write into the wrong
 *   fields of a 22 instance, so one is never in Halide 21's list. A 22 state has its own lock,
 *   list of pipelines and of calls in flight, and its own sampling thread.
 *
 * The 22 state is laid out as Halide's halide_profiler_state (its pipelines are
 * halide22_profiler_pipeline_stats), so that shim/profiling/halide_profiler.py reads either
 * alike; its `lock` and `sampling_thread` fields are unused: the lock is a pthread mutex, which
 * the sampling thread also waits on while nothing runs (Halide 21's samples every millisecond
 * for good once started). Halide 22 samples from a thread (-profile) or from SIGPROF
 * (-profile_by_timer), two runtimes for one generated code; here both sample from the thread,
 * as Halide 21's runtime linked into the shim does for 21's. Not served: a remote profiler state
 * (Hexagon's get_remote_profiler_state), Halide 22's JSON dump and performance warnings (its
 * report, here a subset: profiling/profiler22_report.c). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim_native.h"
#include "calls/releases.h"
#include "profiling/halide_profiler.h"
#include "profiling/profiler22_report.h"

typedef struct halide_profiler_instance_state instance_state;
typedef struct halide22_profiler_func_stats func22;
typedef struct halide22_profiler_pipeline_stats pipeline22;

static struct halide_profiler_state state22 = {{{0}}, NULL, NULL, NULL, NULL, 1000, 0};
static pthread_mutex_t lock22 = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t started22 = PTHREAD_COND_INITIALIZER; /* an instance was listed */
static bool sampling22;                                       /* the sampling thread runs */

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static pipeline22 *pipeline_of(const instance_state *instance) {
    return (pipeline22 *)instance->pipeline_stats;
}

static func22 *funcs_of(const instance_state *instance) {
    return (func22 *)instance->funcs;
}

static void raise_to(uint64_t *peak, uint64_t value) {
    uint64_t seen = __atomic_load_n(peak, __ATOMIC_SEQ_CST);
    while (value > seen && !__atomic_compare_exchange_n(peak, &seen, value, false,
                                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

/* --- the sampling thread ------------------------------------------------------------------ */

/* One sample of a running instance (caller holds lock22): `dt` billed to the entry its code
 * last said it was in. The entry is read as the generated code stores it (a 32-bit volatile
 * store, no lock), and ignored where it is not one of the pipeline's. */
static void bill(instance_state *instance, uint64_t dt) {
    const pipeline22 *p = pipeline_of(instance);
    int id = __atomic_load_n(&instance->current_func, __ATOMIC_RELAXED);
    if (p == NULL || id < 0 || id >= p->num_funcs) {
        return;
    }
    int active = __atomic_load_n(&instance->active_threads, __ATOMIC_SEQ_CST);
    func22 *f = funcs_of(instance) + id;
    f->time += dt;
    f->active_threads_numerator += (uint64_t)active;
    f->active_threads_denominator += 1;
    instance->samples++;
    instance->active_threads_numerator += (uint64_t)active;
    instance->active_threads_denominator += 1;
    instance->billed_time += dt;
}

static void *sample22(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock22);
    uint64_t previous = now_ns();
    for (;;) {
        if (state22.instances == NULL) {
            pthread_cond_wait(&started22, &lock22);
            previous = now_ns(); /* (the idle time is nobody's) */
            continue;
        }
        int us = state22.sleep_time > 0 ? state22.sleep_time : 1000;
        pthread_mutex_unlock(&lock22);
        struct timespec pause = {us / 1000000, (long)(us % 1000000) * 1000};
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&lock22);
        uint64_t now = now_ns();
        for (instance_state *i = state22.instances; i != NULL; i = i->next) {
            bill(i, now - previous);
        }
        previous = now;
    }
    return NULL;
}

/* Starts the sampling thread (caller holds lock22), with every signal blocked in it: signals
 * are the application's threads' to take. Where it cannot start, calls run unsampled (no
 * time, as a call shorter than a sample). */
static void start_sampling(void) {
    if (sampling22) {
        return;
    }
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pthread_attr_t attr;
    pthread_t thread;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sampling22 = pthread_create(&thread, &attr, sample22, NULL) == 0;
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
}

/* --- Halide 22's entry points -------------------------------------------------------------- */

/* The pipeline's stats (caller holds lock22), made at its first call: pipelines are told
 * apart by the address of their name, a constant of their library, and their entry count. */
static pipeline22 *pipeline22_for(const char *name, int num_funcs, const char *const *names,
                                  const int *parents, const int *canonical_ids, const int *kinds,
                                  const int *buffer_func_ids, const uint32_t *approximated) {
    for (pipeline22 *p = (pipeline22 *)state22.pipelines; p != NULL; p = p->next) {
        if (p->name == name && p->num_funcs == num_funcs) {
            return p;
        }
    }
    pipeline22 *p = calloc(1, sizeof *p);
    func22 *funcs = calloc(num_funcs > 0 ? (size_t)num_funcs : 1, sizeof *funcs);
    if (p == NULL || funcs == NULL) {
        free(p);
        free(funcs);
        return NULL;
    }
    for (int i = 0; i < num_funcs; i++) {
        funcs[i].name = names[i];
        funcs[i].parent = parents[i];
        funcs[i].canonical_id = canonical_ids[i];
        funcs[i].kind = kinds[i];
        funcs[i].buffer_func_id = buffer_func_ids[i];
        funcs[i].counters_approximated = approximated[i];
    }
    p->name = name;
    p->num_funcs = num_funcs;
    p->funcs = funcs;
    p->next = state22.pipelines;
    state22.pipelines = (struct halide_profiler_pipeline_stats *)p;
    return p;
}

static int instance_start22(void *user_context, const char *name, int num_funcs,
                            const char *const *names, const int *parents,
                            const int *canonical_ids, const int *kinds,
                            const int *buffer_func_ids, const uint32_t *approximated,
                            uint64_t native_vector_bytes, instance_state *instance) {
    /* The entries follow the instance in the block the pipeline allocated; zeroed, as the
     * generated code adds to them from here on. */
    func22 *funcs = (func22 *)(instance + 1);
    memset(instance, 0, sizeof *instance + (num_funcs > 0 ? (size_t)num_funcs : 0) * sizeof *funcs);
    instance->funcs = (struct halide_profiler_func_stats *)funcs;
    pthread_mutex_lock(&lock22);
    pipeline22 *p = pipeline22_for(name, num_funcs, names, parents, canonical_ids, kinds,
                                   buffer_func_ids, approximated);
    if (p == NULL) {
        /* (not listed: its instance_end, which runs however the call ends, finds it so) */
        pthread_mutex_unlock(&lock22);
        return halide_error_out_of_memory(user_context);
    }
    p->native_vector_bytes = native_vector_bytes;
    instance->pipeline_stats = (struct halide_profiler_pipeline_stats *)p;
    instance->next = state22.instances;
    instance->prev_next = &state22.instances;
    if (state22.instances != NULL) {
        state22.instances->prev_next = &instance->next;
    }
    state22.instances = instance;
    start_sampling();
    pthread_cond_signal(&started22);
    pthread_mutex_unlock(&lock22);
    instance->start_time = now_ns();
    return 0;
}

/* A finished call's figures into its pipeline's (caller holds lock22): the counters and peaks
 * of every call; the time of a call the sampler reached, each entry's sampled time scaled to
 * the call's measured duration. */
static void merge22(pipeline22 *p, const instance_state *instance, uint64_t duration) {
    p->active_threads_numerator += instance->active_threads_numerator;
    p->active_threads_denominator += instance->active_threads_denominator;
    p->memory_total += instance->memory_total;
    if (instance->memory_peak > p->memory_peak) {
        p->memory_peak = instance->memory_peak;
    }
    p->num_allocs += instance->num_allocs;
    p->runs++;
    p->samples += instance->samples;
    const func22 *from = funcs_of(instance);
    /* Every field from memory_total to the end is a uint64 counter, summed blind, as Halide
     * 22 does (adding a counter there needs nothing here). */
    enum {
        FIRST_COUNTER = offsetof(func22, memory_total),
        COUNTERS = (sizeof(func22) - offsetof(func22, memory_total)) / sizeof(uint64_t)
    };
    for (int i = 0; i < p->num_funcs; i++) {
        func22 *f = p->funcs + i;
        f->memory_peak = from[i].memory_peak > f->memory_peak ? from[i].memory_peak : f->memory_peak;
        f->stack_peak = from[i].stack_peak > f->stack_peak ? from[i].stack_peak : f->stack_peak;
        uint64_t *to = (uint64_t *)((char *)f + FIRST_COUNTER);
        const uint64_t *add = (const uint64_t *)((const char *)&from[i] + FIRST_COUNTER);
        for (int c = 0; c < COUNTERS; c++) {
            to[c] += add[c];
        }
    }
    if (instance->billed_time > 0) {
        p->time += duration;
        p->billed_runs++;
        double scale = (double)duration / (double)instance->billed_time;
        for (int i = 0; i < p->num_funcs; i++) {
            p->funcs[i].time += (uint64_t)((double)from[i].time * scale + 0.5);
        }
    }
}

static int instance_end22(instance_state *instance) {
    uint64_t end = now_ns();
    pthread_mutex_lock(&lock22);
    if (instance->prev_next != NULL) { /* (else its start failed, and listed nothing) */
        pipeline22 *p = pipeline_of(instance);
        if (instance->should_collect_statistics && p != NULL) {
            merge22(p, instance, end - instance->start_time);
        }
        *instance->prev_next = instance->next;
        if (instance->next != NULL) {
            instance->next->prev_next = instance->prev_next;
        }
        instance->prev_next = NULL;
    }
    pthread_mutex_unlock(&lock22);
    return 0;
}

/* Entry `func_id` of a started 22 instance, or NULL (Halide aborts there; a call from code
 * that is not Halide 22's changes nothing). */
static func22 *entry22(instance_state *instance, int func_id) {
    const pipeline22 *p = instance != NULL ? pipeline_of(instance) : NULL;
    return p != NULL && func_id >= 0 && func_id < p->num_funcs ? funcs_of(instance) + func_id : NULL;
}

/* Halide 22's generated code counts allocations and their bytes itself (update_counters):
 * the runtime keeps only what is live and its peak. */
static void memory_allocate22(instance_state *instance, int func_id, uint64_t incr) {
    func22 *f = entry22(instance, func_id);
    if (incr == 0 || f == NULL) {
        return;
    }
    raise_to(&instance->memory_peak,
             __atomic_add_fetch(&instance->memory_current, incr, __ATOMIC_SEQ_CST));
    raise_to(&f->memory_peak, __atomic_add_fetch(&f->memory_current, incr, __ATOMIC_SEQ_CST));
}

static void memory_free22(instance_state *instance, int func_id, uint64_t decr) {
    func22 *f = entry22(instance, func_id);
    if (decr == 0 || f == NULL) {
        return;
    }
    __atomic_sub_fetch(&instance->memory_current, decr, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&f->memory_current, decr, __ATOMIC_SEQ_CST);
}

static void stack_peak_update22(instance_state *instance, const uint64_t *values) {
    const pipeline22 *p = instance != NULL ? pipeline_of(instance) : NULL;
    for (int i = 0; p != NULL && i < p->num_funcs; i++) {
        if (values[i] != 0) {
            raise_to(&funcs_of(instance)[i].stack_peak, values[i]);
        }
    }
}

/* --- the entry points, by the caller's release ---------------------------------------------
 * One definition serves both signatures of instance_start: its parameters are Halide 22's
 * eleven, of which a Halide 21 caller passes the first five, all in registers (x86-64 and
 * AArch64 pass eight or more there), its instance fifth; the parameters it did not pass are
 * never read for it. */

__attribute__((noinline)) int halide_profiler_instance_start(
    void *user_context, const char *pipeline_name, int num_funcs, const void *func_names,
    const void *fifth, const int *func_canonical_ids, const int *func_kinds,
    const int *func_buffer_func_ids, const uint32_t *func_counters_approximated,
    uint64_t native_vector_bytes, instance_state *instance) {
    if (SHIM_CALLER_RELEASE()->profiler_abi == 0) {
        return halide21_profiler_instance_start(user_context, pipeline_name, num_funcs,
                                                (const uint64_t *)func_names,
                                                (instance_state *)fifth);
    }
    return instance_start22(user_context, pipeline_name, num_funcs,
                            (const char *const *)func_names, (const int *)fifth,
                            func_canonical_ids, func_kinds, func_buffer_func_ids,
                            func_counters_approximated, native_vector_bytes, instance);
}

__attribute__((noinline)) int halide_profiler_instance_end(void *user_context,
                                                           instance_state *instance) {
    if (SHIM_CALLER_RELEASE()->profiler_abi == 0) {
        return halide21_profiler_instance_end(user_context, instance);
    }
    return instance_end22(instance);
}

__attribute__((noinline)) void halide_profiler_memory_allocate(void *user_context,
                                                               instance_state *instance,
                                                               int func_id, uint64_t incr) {
    if (SHIM_CALLER_RELEASE()->profiler_abi == 0) {
        halide21_profiler_memory_allocate(user_context, instance, func_id, incr);
    } else {
        memory_allocate22(instance, func_id, incr);
    }
}

__attribute__((noinline)) void halide_profiler_memory_free(void *user_context,
                                                           instance_state *instance, int func_id,
                                                           uint64_t decr) {
    if (SHIM_CALLER_RELEASE()->profiler_abi == 0) {
        halide21_profiler_memory_free(user_context, instance, func_id, decr);
    } else {
        memory_free22(instance, func_id, decr);
    }
}

__attribute__((noinline)) void halide_profiler_stack_peak_update(void *user_context,
                                                                 instance_state *instance,
                                                                 uint64_t *f_values) {
    if (SHIM_CALLER_RELEASE()->profiler_abi == 0) {
        halide21_profiler_stack_peak_update(user_context, instance, f_values);
    } else {
        stack_peak_update22(instance, f_values);
    }
}

/* --- the states, for Python and the fork ---------------------------------------------------- */

struct halide_profiler_state *shim_profiler_state(int abi) {
    return abi == 0 ? halide_profiler_get_state() : abi == 1 ? &state22 : NULL;
}

void shim_profiler_lock(int abi) {
    if (abi == 0) {
        halide_profiler_lock(halide_profiler_get_state());
    } else if (abi == 1) {
        pthread_mutex_lock(&lock22);
    }
}

void shim_profiler_unlock(int abi) {
    if (abi == 0) {
        halide_profiler_unlock(halide_profiler_get_state());
    } else if (abi == 1) {
        pthread_mutex_unlock(&lock22);
    }
}

void shim_profiler_report(int abi, void *user_context) {
    if (abi == 0) {
        halide_profiler_report(user_context);
    } else if (abi == 1) {
        pthread_mutex_lock(&lock22);
        shim_profiler22_print(user_context, &state22);
        pthread_mutex_unlock(&lock22);
    }
}

void shim_profiler22_reset_in_child(void) {
    pthread_mutex_t fresh_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
    memcpy(&lock22, &fresh_lock, sizeof lock22);
    memcpy(&started22, &fresh_cond, sizeof started22);
    sampling22 = false;
}
