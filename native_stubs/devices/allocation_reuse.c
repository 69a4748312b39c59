/* Halide's switch for reusing device allocations (allocation_cache.cpp in Halide 21).
 *
 * While halide_can_reuse_device_allocations says so, freed device memory goes to its backend's
 * pool (shim/backends/pool.py) instead of back to the driver, and later allocations are served
 * from it. On by default, as in Halide 21 (whose header still says "false"; its
 * allocation_cache.cpp starts the flag at true). Switching it off empties every pool: the
 * shim's, through Python, and any an application registered with
 * halide_register_device_allocation_pool.
 *
 * Both are plain symbols, so an application that defines its own halide_can_reuse_device_
 * allocations (Halide's "override and switch based on the user_context") is asked instead:
 * the Python side calls through this library's PLT entry.
 */
#include "shim_native.h"

static bool reuse = true;
/* Registered pools, newest first. Nodes have global lifetime and are never removed, so the
 * list is walked without a lock: a node's `next` is set before the node is published. */
static struct halide_device_allocation_pool *pools;

int halide_reuse_device_allocations(void *user_context, bool flag) {
    __atomic_store_n(&reuse, flag, __ATOMIC_SEQ_CST);
    if (flag) {
        return halide_error_code_success; /* Halide's contract: switching on always succeeds */
    }
    /* No lock is held here: the Python callback takes the GIL, and pools may too. */
    int result = shim_py_release_unused_allocations(user_context, SHIM_BACKEND_COUNT);
    for (struct halide_device_allocation_pool *p = __atomic_load_n(&pools, __ATOMIC_ACQUIRE);
         p != NULL; p = p->next) {
        int released = p->release_unused(user_context);
        if (released != halide_error_code_success) {
            result = released;
        }
    }
    return result;
}

bool halide_can_reuse_device_allocations(void *user_context) {
    (void)user_context;
    return __atomic_load_n(&reuse, __ATOMIC_SEQ_CST);
}

void halide_register_device_allocation_pool(struct halide_device_allocation_pool *pool) {
    struct halide_device_allocation_pool *head = __atomic_load_n(&pools, __ATOMIC_ACQUIRE);
    do {
        pool->next = head;
    } while (!__atomic_compare_exchange_n(&pools, &head, pool, true, __ATOMIC_RELEASE,
                                          __ATOMIC_ACQUIRE));
}
