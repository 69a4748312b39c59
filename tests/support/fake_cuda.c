/* The C half of a CUDA driver for machines without a GPU (tests/support/fake_cuda.py): the
 * entry points the shim's C code calls (native_stubs/backends/cuda.c), a per-thread context stack, and a
 * log of kernel launches on one sequence shared with the Python half. Launches run nothing. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { STACK = 16, LOG = 4096 };

static __thread void *stack[STACK];
static __thread int depth;
static long sequence;

typedef struct {
    long seq;
    uintptr_t stream, context, function;
    unsigned blocks[3], threads[3];
} launch_record;

/* Pushes to make fail (fake_fail_pushes): the calls numbered [fail_from, fail_to). */
static long pushes, fail_from, fail_to;

static launch_record launches[LOG];
static int launch_count;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

long fake_tick(void) {
    return __atomic_add_fetch(&sequence, 1, __ATOMIC_SEQ_CST);
}

uintptr_t fake_current_context(void) {
    return depth ? (uintptr_t)stack[depth - 1] : 0;
}

int fake_context_depth(void) {
    return depth;
}

int fake_launch_count(void) {
    return __atomic_load_n(&launch_count, __ATOMIC_ACQUIRE);
}

const launch_record *fake_launch(int i) {
    return &launches[i];
}

void fake_fail_pushes(long after, long times) {
    long next = __atomic_load_n(&pushes, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fail_from, next + after, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fail_to, next + after + times, __ATOMIC_SEQ_CST);
}

int cuCtxPushCurrent_v2(void *context) {
    long call = __atomic_fetch_add(&pushes, 1, __ATOMIC_SEQ_CST);
    if (context == NULL || depth == STACK ||
        (call >= __atomic_load_n(&fail_from, __ATOMIC_SEQ_CST) &&
         call < __atomic_load_n(&fail_to, __ATOMIC_SEQ_CST))) {
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    }
    stack[depth++] = context;
    return 0;
}

int cuCtxPopCurrent_v2(void **context) {
    if (depth == 0) {
        return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    }
    void *popped = stack[--depth];
    if (context != NULL) {
        *context = popped;
    }
    return 0;
}

int cuModuleGetFunction(void **function, void *module, const char *name) {
    if (module == NULL) {
        return 400; /* CUDA_ERROR_INVALID_HANDLE */
    }
    *function = strdup(name);
    return 0;
}

int cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned tx,
                   unsigned ty, unsigned tz, unsigned shared, void *stream, void **params,
                   void **extra) {
    (void)shared;
    (void)params;
    (void)extra;
    if (depth == 0) {
        return 201; /* no current context */
    }
    pthread_mutex_lock(&log_lock);
    if (launch_count < LOG) {
        launch_record *r = &launches[launch_count];
        r->seq = fake_tick();
        r->stream = (uintptr_t)stream;
        r->context = (uintptr_t)stack[depth - 1];
        r->function = (uintptr_t)function;
        unsigned b[3] = {gx, gy, gz}, t[3] = {tx, ty, tz};
        memcpy(r->blocks, b, sizeof b);
        memcpy(r->threads, t, sizeof t);
        __atomic_store_n(&launch_count, launch_count + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&log_lock);
    return 0;
}
