/* The native side of the profiler (shim/profiling/profiler.py): counts of the calls decided in C, and
 * kernel launches reported around the launch. Everything else is recorded in Python, where
 * the calls arrive anyway.
 *
 * Each thread counts into its own block, so that threads deciding no-ops at the same time do
 * not fight over one cache line; the blocks are summed when Python reads a count. A block
 * lives from the thread's first counted call to the thread's exit, when its counts move to
 * the totals of the threads that have gone. */
#include <pthread.h>
#include <stdlib.h>

#include "shim_native.h"
#include "profiling/profile.h"

typedef struct counter_block {
    uint64_t counts[SHIM_FN_COUNT][SHIM_OUTCOME_COUNT];
    struct counter_block *next;
} counter_block;

int shim_profiling;
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER; /* never taken when counting */
static counter_block *blocks;                                    /* live threads' blocks */
static uint64_t gone[SHIM_FN_COUNT][SHIM_OUTCOME_COUNT];         /* exited threads' counts */
static pthread_key_t block_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static __thread counter_block *own_block;

static void retire(void *block_ptr) {
    counter_block *block = block_ptr;
    pthread_mutex_lock(&blocks_lock);
    for (counter_block **link = &blocks; *link != NULL; link = &(*link)->next) {
        if (*link == block) {
            *link = block->next;
            break;
        }
    }
    for (int f = 0; f < SHIM_FN_COUNT; f++) {
        for (int o = 0; o < SHIM_OUTCOME_COUNT; o++) {
            gone[f][o] += __atomic_load_n(&block->counts[f][o], __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&blocks_lock);
    free(block);
}

static void make_key(void) {
    pthread_key_create(&block_key, retire);
}

static counter_block *thread_block(void) {
    if (own_block == NULL) {
        counter_block *block = calloc(1, sizeof *block);
        if (block == NULL) {
            return NULL; /* the count is lost, the call is not */
        }
        pthread_once(&key_once, make_key);
        pthread_setspecific(block_key, block);
        pthread_mutex_lock(&blocks_lock);
        block->next = blocks;
        blocks = block;
        pthread_mutex_unlock(&blocks_lock);
        own_block = block;
    }
    return own_block;
}

/* Around a fork (forks/fork.c): the list and the totals must be whole in the child, which reads
 * them; whoever holds the lock only adds up or links counters, so the fork waits for it. */
void shim_profile_lock_for_fork(void) {
    pthread_mutex_lock(&blocks_lock);
}

void shim_profile_unlock_after_fork(void) {
    pthread_mutex_unlock(&blocks_lock);
}

void shim_profile_enable(bool on) {
    __atomic_store_n(&shim_profiling, on ? 1 : 0, __ATOMIC_RELEASE);
}

void shim_profile_note(enum shim_function function, enum shim_outcome outcome) {
    counter_block *block = thread_block();
    if (block != NULL) {
        /* Only this thread writes the block; the atomic add keeps readers' loads whole. */
        __atomic_fetch_add(&block->counts[function][outcome], 1, __ATOMIC_RELAXED);
    }
}

uint64_t shim_profile_count(int function, int outcome) {
    if (function < 0 || function >= SHIM_FN_COUNT || outcome < 0 || outcome >= SHIM_OUTCOME_COUNT) {
        return 0;
    }
    pthread_mutex_lock(&blocks_lock);
    uint64_t total = gone[function][outcome];
    for (counter_block *block = blocks; block != NULL; block = block->next) {
        total += __atomic_load_n(&block->counts[function][outcome], __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&blocks_lock);
    return total;
}

void shim_profile_reset(void) {
    pthread_mutex_lock(&blocks_lock);
    for (int f = 0; f < SHIM_FN_COUNT; f++) {
        for (int o = 0; o < SHIM_OUTCOME_COUNT; o++) {
            gone[f][o] = 0;
            for (counter_block *block = blocks; block != NULL; block = block->next) {
                __atomic_store_n(&block->counts[f][o], 0, __ATOMIC_RELAXED);
            }
        }
    }
    pthread_mutex_unlock(&blocks_lock);
}

/* What the launch on this thread reported with shim_profile_launch_staged; -1: nothing. */
static __thread int launch_staged = -1;

int shim_profile_run(int backend, void *stream, shim_run_fn run, SHIM_RUN_PARAMS) {
    shim_launch launch = {
        .backend = backend,
        .kernel = entry_name,
        .blocks = {blocksX, blocksY, blocksZ},
        .threads = {threadsX, threadsY, threadsZ},
        .shared_mem_bytes = shared_mem_bytes,
        .stream = stream,
    };
    int token = shim_py_profile_launch_begin(user_context, &launch);
    launch_staged = -1;
    int result = run(SHIM_RUN_ARGS);
    shim_py_profile_launch_end(token, result, launch_staged);
    return result;
}

void shim_profile_launch_staged(int buffers) {
    launch_staged = buffers;
}
