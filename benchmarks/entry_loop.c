/* Calls one runtime entry point (or a pair that undoes each other) in a tight loop from C, on
 * one or more threads at once, and returns the wall time. Compiled by benchmarks/entry_points.py;
 * the runtime under test is a table of function addresses, so the same loop times the shim and
 * Halide's stock runtime, each in its own process. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "HalideRuntime.h"

/* The entry points, by index: entry_points.py fills the table in this order (FUNCTIONS). */
enum {
    F_DEVICE_MALLOC, F_DEVICE_FREE, F_DEVICE_SYNC, F_DEVICE_RELEASE, F_COPY_TO_HOST,
    F_COPY_TO_DEVICE, F_DEVICE_AND_HOST_MALLOC, F_DEVICE_AND_HOST_FREE, F_BUFFER_COPY,
    F_DEVICE_CROP, F_DEVICE_SLICE, F_DEVICE_RELEASE_CROP, F_WRAP_NATIVE, F_DETACH_NATIVE,
    F_MALLOC, F_FREE, F_DO_PAR_FOR, F_SEMAPHORE_INIT, F_SEMAPHORE_RELEASE,
    F_SEMAPHORE_TRY_ACQUIRE, F_TRACE, F_SET_CUSTOM_TRACE, F_PRINT, F_SET_CUSTOM_PRINT, F_ERROR,
    F_SET_ERROR_HANDLER, F_COUNT
};

/* What one iteration does (OPERATIONS in entry_points.py, same order). */
enum {
    OP_COPY_TO_HOST, OP_COPY_TO_DEVICE, OP_DEVICE_MALLOC_FREE, OP_DEVICE_SYNC, OP_DEVICE_RELEASE,
    OP_DEVICE_AND_HOST_MALLOC_FREE, OP_BUFFER_COPY, OP_CROP_RELEASE, OP_SLICE_RELEASE,
    OP_WRAP_DETACH, OP_COMPUTE_CAPABILITY, OP_MALLOC_FREE, OP_DO_PAR_FOR, OP_SEMAPHORE,
    OP_TRACE, OP_PRINT, OP_ERROR
};

/* One thread's operands. a_dirty / b_dirty: the dirty bits (1 host, 2 device) each
 * iteration gives a / b before its call, the other flag bits kept (the shim keeps bits of its
 * own there), as generated code sets them; -1: left alone. */
typedef struct {
    halide_buffer_t *a, *b;
    const struct halide_device_interface_t *interface; /* the device operand (buffer_copy: dst's) */
    uint64_t native;                                     /* wrap_native's handle */
    int64_t size;                                        /* halide_malloc bytes, par_for tasks */
    int slice_dim, slice_pos;
    int a_dirty, b_dirty;
} operands;

typedef struct {
    void *const *f;
    int op;
    operands *o;
    long iterations;
    pthread_barrier_t *start;
    int cpu;
    long failures;
    double begin, end;
} job;

typedef int (*buf_fn)(void *, halide_buffer_t *);
typedef int (*buf_iface_fn)(void *, halide_buffer_t *, const struct halide_device_interface_t *);
typedef int (*release_fn)(void *, const struct halide_device_interface_t *);
typedef int (*copy_fn)(void *, halide_buffer_t *, const struct halide_device_interface_t *,
                       halide_buffer_t *);
typedef int (*crop_fn)(void *, const halide_buffer_t *, halide_buffer_t *);
typedef int (*slice_fn)(void *, const halide_buffer_t *, int, int, halide_buffer_t *);
typedef int (*wrap_fn)(void *, halide_buffer_t *, uint64_t, const struct halide_device_interface_t *);
typedef int (*capability_fn)(void *, int *, int *);
typedef void *(*malloc_fn)(void *, size_t);
typedef void (*free_fn)(void *, void *);
typedef int (*par_for_fn)(void *, halide_task_t, int, int, uint8_t *);
typedef int (*sem_init_fn)(struct halide_semaphore_t *, int);
typedef bool (*sem_acquire_fn)(struct halide_semaphore_t *, int);
typedef int32_t (*trace_fn)(void *, const struct halide_trace_event_t *);
typedef halide_trace_t (*set_trace_fn)(halide_trace_t);
typedef void (*print_fn)(void *, const char *);
typedef halide_print_t (*set_print_fn)(halide_print_t);
typedef halide_error_handler_t (*set_error_fn)(halide_error_handler_t);

static int empty_task(void *user_context, int index, uint8_t *closure) {
    (void)user_context, (void)index, (void)closure;
    return 0;
}

static int32_t quiet_trace(void *user_context, const struct halide_trace_event_t *event) {
    (void)user_context, (void)event;
    return 0;
}

static void quiet_text(void *user_context, const char *text) {
    (void)user_context, (void)text;
}

/* The interface's compute_capability: the slot after detach_native in
 * halide_device_interface_t (Halide has no generic entry point for it). */
static capability_fn capability_of(const struct halide_device_interface_t *interface) {
    return (capability_fn)(((void *const *)interface)[14]);
}

static void set_dirty(halide_buffer_t *buf, int dirty) {
    if (dirty >= 0) {
        buf->flags = (buf->flags & ~(uint64_t)3) | (uint64_t)dirty;
    }
}

/* One iteration; nonzero on failure. */
static int step(void *const *f, int op, operands *o) {
    set_dirty(o->a, o->a_dirty);
    if (o->b) {
        set_dirty(o->b, o->b_dirty);
    }
    switch (op) {
    case OP_COPY_TO_HOST:
        return ((buf_fn)f[F_COPY_TO_HOST])(0, o->a);
    case OP_COPY_TO_DEVICE:
        return ((buf_iface_fn)f[F_COPY_TO_DEVICE])(0, o->a, o->interface);
    case OP_DEVICE_MALLOC_FREE:
        return ((buf_iface_fn)f[F_DEVICE_MALLOC])(0, o->a, o->interface) |
               ((buf_fn)f[F_DEVICE_FREE])(0, o->a);
    case OP_DEVICE_SYNC:
        return ((buf_fn)f[F_DEVICE_SYNC])(0, o->a);
    case OP_DEVICE_RELEASE: /* then the device is started again, on both sides */
        return ((release_fn)f[F_DEVICE_RELEASE])(0, o->interface) |
               ((buf_iface_fn)f[F_DEVICE_MALLOC])(0, o->a, o->interface) |
               ((buf_fn)f[F_DEVICE_FREE])(0, o->a);
    case OP_DEVICE_AND_HOST_MALLOC_FREE:
        return ((buf_iface_fn)f[F_DEVICE_AND_HOST_MALLOC])(0, o->a, o->interface) |
               ((buf_fn)f[F_DEVICE_AND_HOST_FREE])(0, o->a);
    case OP_BUFFER_COPY:
        return ((copy_fn)f[F_BUFFER_COPY])(0, o->a, o->interface, o->b);
    case OP_CROP_RELEASE:
        return ((crop_fn)f[F_DEVICE_CROP])(0, o->a, o->b) |
               ((buf_fn)f[F_DEVICE_RELEASE_CROP])(0, o->b);
    case OP_SLICE_RELEASE:
        return ((slice_fn)f[F_DEVICE_SLICE])(0, o->a, o->slice_dim, o->slice_pos, o->b) |
               ((buf_fn)f[F_DEVICE_RELEASE_CROP])(0, o->b);
    case OP_WRAP_DETACH:
        return ((wrap_fn)f[F_WRAP_NATIVE])(0, o->b, o->native, o->interface) |
               ((buf_fn)f[F_DETACH_NATIVE])(0, o->b);
    case OP_COMPUTE_CAPABILITY: {
        int major = 0, minor = 0;
        return capability_of(o->interface)(0, &major, &minor);
    }
    case OP_MALLOC_FREE: {
        void *p = ((malloc_fn)f[F_MALLOC])(0, (size_t)o->size);
        ((free_fn)f[F_FREE])(0, p);
        return p == 0;
    }
    case OP_DO_PAR_FOR:
        return ((par_for_fn)f[F_DO_PAR_FOR])(0, empty_task, 0, (int)o->size, 0);
    case OP_SEMAPHORE: {
        struct halide_semaphore_t sema;
        ((sem_init_fn)f[F_SEMAPHORE_INIT])(&sema, 0);
        ((sem_init_fn)f[F_SEMAPHORE_RELEASE])(&sema, 1);
        return !((sem_acquire_fn)f[F_SEMAPHORE_TRY_ACQUIRE])(&sema, 1);
    }
    case OP_TRACE: {
        /* A pipeline's load event of one float at (3, 4): what trace_loads emits per value. */
        static float value = 1.0f;
        static int32_t coordinates[2] = {3, 4};
        struct halide_trace_event_t event = {"f", &value, coordinates, 0,
                                             {halide_type_float, 32, 1}, halide_trace_load,
                                             0, 0, 2};
        return ((trace_fn)f[F_TRACE])(0, &event) < 0;
    }
    case OP_PRINT:
        ((print_fn)f[F_PRINT])(0, "entry_points.py: a line halide_print is given\n");
        return 0;
    case OP_ERROR:
        ((print_fn)f[F_ERROR])(0, "entry_points.py: an error halide_error is given");
        return 0;
    }
    return 1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void *run(void *arg) {
    job *j = (job *)arg;
    /* One thread per CPU, so that the scheduler moving threads around is not measured. */
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(j->cpu, &cpus);
    pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
    pthread_barrier_wait(j->start);
    j->begin = now();
    long failures = 0;
    for (long i = 0; i < j->iterations; i++) {
        failures += step(j->f, j->op, j->o) != 0;
    }
    j->end = now();
    j->failures = failures;
    return 0;
}

static int online_cpus(void) {
    cpu_set_t cpus;
    sched_getaffinity(0, sizeof cpus, &cpus);
    return CPU_COUNT(&cpus) > 0 ? CPU_COUNT(&cpus) : 1;
}

/* Seconds (from the first thread's first call to the last thread's last) for `threads`
 * threads to run `iterations` iterations of `op` each, thread i on
 * operands[i]. The print, error and trace rows run with the runtime's hooks pointed at quiet
 * handlers here (the stock runtime's defaults write to stderr and abort), restored after.
 * Returns a negative number if any call failed. */
double entry_loop(void *const *functions, int op, operands *o, int threads, long iterations) {
    pthread_t ids[64];
    job jobs[64];
    pthread_barrier_t start;
    if (threads < 1 || threads > 64) {
        return -1;
    }
    halide_trace_t old_trace = 0;
    halide_print_t old_print = 0;
    halide_error_handler_t old_error = 0;
    if (op == OP_TRACE) {
        old_trace = ((set_trace_fn)functions[F_SET_CUSTOM_TRACE])(quiet_trace);
    } else if (op == OP_PRINT) {
        old_print = ((set_print_fn)functions[F_SET_CUSTOM_PRINT])(quiet_text);
    } else if (op == OP_ERROR) {
        old_error = ((set_error_fn)functions[F_SET_ERROR_HANDLER])(quiet_text);
    }
    pthread_barrier_init(&start, 0, threads + 1);
    for (int i = 0; i < threads; i++) {
        jobs[i] = (job){functions, op, &o[i], iterations, &start, i % online_cpus(), 0, 0, 0};
        pthread_create(&ids[i], 0, run, &jobs[i]);
    }
    pthread_barrier_wait(&start);
    long failures = 0;
    double begin = 0, end = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ids[i], 0);
        failures += jobs[i].failures;
        begin = i == 0 || jobs[i].begin < begin ? jobs[i].begin : begin;
        end = jobs[i].end > end ? jobs[i].end : end;
    }
    /* From the first thread's start to the last one's end: not the threads' creation. */
    double elapsed = end - begin;
    pthread_barrier_destroy(&start);
    if (op == OP_TRACE) {
        ((set_trace_fn)functions[F_SET_CUSTOM_TRACE])(old_trace);
    } else if (op == OP_PRINT) {
        ((set_print_fn)functions[F_SET_CUSTOM_PRINT])(old_print);
    } else if (op == OP_ERROR) {
        ((set_error_fn)functions[F_SET_ERROR_HANDLER])(old_error);
    }
    return failures ? -1 : elapsed;
}
