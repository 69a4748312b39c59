/* Calls one runtime entry point in a tight loop from C, on several threads at once, and
 * returns the wall time. Compiled by benchmarks/noop_copies.py; the function under test is
 * passed in as a pointer, so the same loop times the shim and Halide's stock runtime. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

typedef int (*copy_to_device_fn)(void *, void *, const void *);
typedef int (*copy_to_host_fn)(void *, void *);

typedef struct {
    void *function;
    int to_device;
    void *buffer;
    const void *interface;
    long iterations;
    pthread_barrier_t *start;
    int cpu;
    long failures;
} job;

static void *run(void *arg) {
    job *j = (job *)arg;
    /* One thread per CPU, so that the scheduler moving threads around is not measured. */
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(j->cpu, &cpus);
    pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
    pthread_barrier_wait(j->start);
    long failures = 0;
    if (j->to_device) {
        copy_to_device_fn f = (copy_to_device_fn)j->function;
        for (long i = 0; i < j->iterations; i++) {
            failures += f(0, j->buffer, j->interface) != 0;
        }
    } else {
        copy_to_host_fn f = (copy_to_host_fn)j->function;
        for (long i = 0; i < j->iterations; i++) {
            failures += f(0, j->buffer) != 0;
        }
    }
    j->failures = failures;
    return 0;
}

static int online_cpus(void) {
    cpu_set_t cpus;
    sched_getaffinity(0, sizeof cpus, &cpus);
    return CPU_COUNT(&cpus) > 0 ? CPU_COUNT(&cpus) : 1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* Seconds for `threads` threads to make `iterations` calls each, thread i on buffers[i].
 * Returns a negative number if any call failed. */
double noop_loop(void *function, int to_device, void **buffers, const void *interface,
                 int threads, long iterations) {
    pthread_t ids[64];
    job jobs[64];
    pthread_barrier_t start;
    if (threads < 1 || threads > 64) {
        return -1;
    }
    pthread_barrier_init(&start, 0, threads + 1);
    for (int i = 0; i < threads; i++) {
        jobs[i] = (job){function, to_device, buffers[i], interface, iterations, &start,
                        i % online_cpus(), 0};
        pthread_create(&ids[i], 0, run, &jobs[i]);
    }
    double begin = now();
    pthread_barrier_wait(&start);
    long failures = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ids[i], 0);
        failures += jobs[i].failures;
    }
    double elapsed = now() - begin;
    pthread_barrier_destroy(&start);
    return failures ? -1 : elapsed;
}
