/* The allocation pool: one backend's idle device allocations, kept for reuse with Halide's
 * rules (shim/backends/pool.py documents them and is the Python view of this pool).
 *
 * One pool serves both paths of a backend: the Python core (Backend.allocate and free) and
 * the allocations the native layer serves itself (served.c), so that what one frees the other
 * reuses and the counts and bounds Python shows are the whole story. Entries are native values
 * with their capacities, oldest first; the pool owns them until one is taken. The mutex
 * guards the list and the counts only: no driver call is ever made with it held (the caller
 * frees what put and evict hand back).
 */
#include <pthread.h>
#include <stdlib.h>

#include "shim_native.h"

typedef struct {
    uint64_t native;
    uint64_t capacity;
} entry;

struct shim_pool {
    pthread_mutex_t lock;
    entry *entries; /* oldest first */
    uint64_t count, room;
    uint64_t bytes;
    int64_t max_count;
    int64_t max_bytes; /* -1: not set yet */
    uint64_t fresh, reused, freed;
};

shim_pool *shim_pool_new(void) {
    shim_pool *pool = calloc(1, sizeof *pool);
    if (pool != NULL) {
        pthread_mutex_init(&pool->lock, NULL);
        pool->max_bytes = -1;
    }
    return pool;
}

void shim_pool_delete(shim_pool *pool) {
    if (pool != NULL) {
        pthread_mutex_destroy(&pool->lock);
        free(pool->entries);
        free(pool);
    }
}

uint64_t shim_pool_quantize(uint64_t nbytes) {
    if (nbytes < 16) {
        return nbytes;
    }
    int shift = 64 - __builtin_clzll(nbytes) - 4;
    return (((nbytes - 1) >> shift) + 1) << shift;
}

bool shim_pool_fits(uint64_t size, uint64_t capacity) {
    return capacity / 8 * 7 <= size && size <= capacity;
}

void shim_pool_set_bounds(shim_pool *pool, int64_t max_count, int64_t max_bytes) {
    pthread_mutex_lock(&pool->lock);
    pool->max_count = max_count;
    pool->max_bytes = max_bytes;
    pthread_mutex_unlock(&pool->lock);
}

int64_t shim_pool_max_count(const shim_pool *pool) {
    return __atomic_load_n(&pool->max_count, __ATOMIC_RELAXED);
}

int64_t shim_pool_max_bytes(const shim_pool *pool) {
    return __atomic_load_n(&pool->max_bytes, __ATOMIC_RELAXED);
}

static uint64_t remove_at(shim_pool *pool, uint64_t i, uint64_t *capacity) {
    entry e = pool->entries[i];
    for (uint64_t j = i + 1; j < pool->count; j++) {
        pool->entries[j - 1] = pool->entries[j];
    }
    pool->count--;
    pool->bytes -= e.capacity;
    *capacity = e.capacity;
    return e.native;
}

uint64_t shim_pool_take(shim_pool *pool, uint64_t size, uint64_t *capacity) {
    pthread_mutex_lock(&pool->lock);
    uint64_t best = pool->count;
    for (uint64_t i = pool->count; i-- > 0;) { /* newest first: ties go to them */
        uint64_t c = pool->entries[i].capacity;
        if (shim_pool_fits(size, c) && (best == pool->count || c < pool->entries[best].capacity)) {
            best = i;
        }
    }
    uint64_t native = 0;
    if (best < pool->count) {
        native = remove_at(pool, best, capacity);
        pool->reused++;
    }
    pthread_mutex_unlock(&pool->lock);
    return native;
}


static bool over_bounds(const shim_pool *pool) {
    return (int64_t)pool->count > pool->max_count || (int64_t)pool->bytes > pool->max_bytes;
}

int shim_pool_put(shim_pool *pool, uint64_t native, uint64_t capacity) {
    pthread_mutex_lock(&pool->lock);
    bool kept = false;
    if (native != 0 && pool->max_count > 0 && pool->max_bytes >= 0 &&
        capacity <= (uint64_t)pool->max_bytes) {
        if (pool->count == pool->room) {
            uint64_t room = pool->room ? 2 * pool->room : 8;
            entry *grown = realloc(pool->entries, room * sizeof *grown);
            if (grown != NULL) {
                pool->entries = grown;
                pool->room = room;
            }
        }
        if (pool->count < pool->room) {
            pool->entries[pool->count++] = (entry){native, capacity};
            pool->bytes += capacity;
            kept = true;
        }
    }
    int result = !kept ? -1 : over_bounds(pool) ? 1 : 0;
    pthread_mutex_unlock(&pool->lock);
    return result;
}

uint64_t shim_pool_evict(shim_pool *pool, uint64_t *capacity) {
    pthread_mutex_lock(&pool->lock);
    uint64_t native = pool->count && over_bounds(pool) ? remove_at(pool, 0, capacity) : 0;
    pthread_mutex_unlock(&pool->lock);
    return native;
}

uint64_t shim_pool_pop(shim_pool *pool, uint64_t *capacity) {
    pthread_mutex_lock(&pool->lock);
    uint64_t native = pool->count ? remove_at(pool, 0, capacity) : 0;
    pthread_mutex_unlock(&pool->lock);
    return native;
}

uint64_t shim_pool_length(const shim_pool *pool) {
    return __atomic_load_n(&pool->count, __ATOMIC_RELAXED);
}

uint64_t shim_pool_bytes(const shim_pool *pool) {
    return __atomic_load_n(&pool->bytes, __ATOMIC_RELAXED);
}

void shim_pool_counts(const shim_pool *pool, uint64_t *fresh, uint64_t *reused, uint64_t *freed) {
    pthread_mutex_lock((pthread_mutex_t *)&pool->lock);
    *fresh = pool->fresh;
    *reused = pool->reused;
    *freed = pool->freed;
    pthread_mutex_unlock((pthread_mutex_t *)&pool->lock);
}

void shim_pool_count(shim_pool *pool, uint64_t fresh, uint64_t freed) {
    pthread_mutex_lock(&pool->lock);
    pool->fresh += fresh;
    pool->freed += freed;
    pthread_mutex_unlock(&pool->lock);
}

void shim_pool_forget_after_fork(shim_pool *pool) {
    /* Another thread of the parent may have held the lock at the fork: a new one. The
     * entries' memory stays the parent's and is never released here. */
    pthread_mutex_init(&pool->lock, NULL);
    pool->count = 0;
    pool->bytes = 0;
}
