/* Device allocations served by the native layer, with no Python: device_malloc and
 * device_free of a pipeline's own buffers, and of a shim.Buffer's struct whose family is idle;
 * with them (sections below) device-and-host malloc and free, copies, halide_buffer_copy,
 * crops, slices and syncs.
 *
 * Generated code allocates and frees its intermediate GPU buffers on every call (Halide's
 * interpolate app: 13 pairs a call, local_laplacian: 22). Through the Python core each pair
 * cost 50-300 us against the stock runtime's 1-2 us. What such a pair needs is little: the
 * size from the dims, memory from the backend's pool or its driver, a handle, and the reverse.
 * This file does exactly that, for the one case where nothing else is involved, and leaves
 * every other case to the Python core (shim/core/runtime.py), the implementation of record:
 *  - the buffer is no member of a shared family (SHIM_BUFFER_FLAG_REGIONS), and either no
 *    shim.Buffer's (no allocation family exists in Python for it, so there are no regions, no
 *    calls in flight to wait for and no other holders of its memory) or a shim.Buffer's
 *    (SHIM_BUFFER_FLAG_PYTHON) whose family is idle, checked and served where its lock stands
 *    taken (fast/buffer_families.c, which says what idle is and why that is a lock);
 *  - the backend's native side registered an allocator (shim_served_register) and can call
 *    its driver now (not in a forked child), and Python has not switched serving off;
 *  - nobody is profiling (a profile sees every allocation the Python core makes);
 *  - the layout is one the Python core would allocate for without an error (no negative
 *    stride, no empty extent), and the driver gives the memory.
 * Any other case, or any step that fails, returns SHIM_NOT_SERVED before anything changed,
 * and the Python core takes the call as it would have without this file; errors are always
 * reported there.
 *
 * The result is what the Python core would have made: the same size, rounded and pooled by
 * the same pool (pool.c) with the same rules and counts, a handle of the same layout, the
 * same fields and flags. The one difference is where the record of the allocation is kept:
 * in the handle (the backend's make_handle), not in a Python family. The first time the
 * Python core meets such a handle (a crop C leaves to it, a copy, a DLPack export, a free
 * while profiling), it adopts it (shim_served_adopt, from shim/memory/families.py): the
 * allocation becomes an ordinary family's and is never served here again. A claim is one
 * atomic exchange in the handle, so a served free and an adoption never both take one.
 *
 * Ordering with the lock-free no-op checks (device_generic.c): the handle is published with a
 * release store after the allocation and the handle exist, and cleared before the memory goes
 * back to the pool, as the Python core does under its family lock. Two threads allocating the
 * same bare struct at once (which generated code never does) cannot both succeed: the
 * interface is claimed with a compare-and-swap, and the loser gives its memory back. (The
 * Python core stores the fields without one: a served malloc racing a Python malloc of the
 * same struct, on a thread where profiling or serving just changed, could leave one of the two
 * allocations unreferenced. Only a program allocating one struct from two threads at once
 * could see it.)
 */
#include <sched.h>

#include "shim_native.h"
#include "devices/device_store.h"
#include "devices/host_copy.h"
#include "devices/served.h"
#include "profiling/profile.h"

typedef struct {
    const shim_allocator *allocator; /* NULL until registered */
    shim_pool *pool;
    bool off;   /* switched off by Python (shim_serve_allocations) */
    int64_t live, live_bytes;
    uint64_t uploaded, downloaded, device_copied; /* bytes the served copies moved */
} served_backend;

static served_backend backends[SHIM_BACKEND_COUNT];
static shim_family_server family_server; /* NULL until fast/buffer_families.c registers */

void shim_served_register_family_server(shim_family_server server) {
    __atomic_store_n(&family_server, server, __ATOMIC_RELEASE);
}

void shim_served_register(int backend, const shim_allocator *allocator, shim_pool *pool) {
    if (backend < 0 || backend >= SHIM_BACKEND_COUNT) {
        return;
    }
    backends[backend].pool = pool;
    __atomic_store_n(&backends[backend].allocator, allocator, __ATOMIC_RELEASE);
}

void shim_serve_allocations(int backend, bool on) {
    if (backend >= 0 && backend < SHIM_BACKEND_COUNT) {
        __atomic_store_n(&backends[backend].off, !on, __ATOMIC_RELEASE);
    }
}

bool shim_serves_allocations(int backend) {
    return backend >= 0 && backend < SHIM_BACKEND_COUNT &&
           __atomic_load_n(&backends[backend].allocator, __ATOMIC_ACQUIRE) != NULL &&
           !__atomic_load_n(&backends[backend].off, __ATOMIC_ACQUIRE);
}

int64_t shim_served_live(int backend, int64_t *bytes) {
    if (backend < 0 || backend >= SHIM_BACKEND_COUNT) {
        *bytes = 0;
        return 0;
    }
    *bytes = __atomic_load_n(&backends[backend].live_bytes, __ATOMIC_RELAXED);
    return __atomic_load_n(&backends[backend].live, __ATOMIC_RELAXED);
}

void shim_served_transferred(int backend, uint64_t *uploaded, uint64_t *downloaded,
                             uint64_t *device_copied) {
    bool known = backend >= 0 && backend < SHIM_BACKEND_COUNT;
    *uploaded = known ? __atomic_load_n(&backends[backend].uploaded, __ATOMIC_RELAXED) : 0;
    *downloaded = known ? __atomic_load_n(&backends[backend].downloaded, __ATOMIC_RELAXED) : 0;
    *device_copied =
        known ? __atomic_load_n(&backends[backend].device_copied, __ATOMIC_RELAXED) : 0;
}

/* The locks of the served allocations' lists of crops (see "crops and slices" below): one of
 * these stripes per allocation, by the address of its own handle. Global and never freed, so
 * that a thread holding only a crop can take its allocation's lock, then check that the crop
 * still names that allocation, with no handle freed under it meanwhile. */
enum { CROP_STRIPES = 64 };
static uint32_t crop_stripes[CROP_STRIPES];

static uint32_t *stripe_of(uint64_t root) {
    return &crop_stripes[(root >> 6) % CROP_STRIPES];
}

static void stripe_lock(uint32_t *stripe) {
    while (__atomic_exchange_n(stripe, 1, __ATOMIC_ACQUIRE)) {
        sched_yield();
    }
}

static void stripe_unlock(uint32_t *stripe) {
    __atomic_store_n(stripe, 0, __ATOMIC_RELEASE);
}

static void count_live(served_backend *b, int64_t count, int64_t capacity) {
    __atomic_add_fetch(&b->live, count, __ATOMIC_RELAXED);
    __atomic_add_fetch(&b->live_bytes, count * capacity, __ATOMIC_RELAXED);
}

/* The allocator of `backend`, if it serves at all now. */
static const shim_allocator *allocator_for(int backend) {
    if (backend < 0 || backend >= SHIM_BACKEND_COUNT) {
        return NULL;
    }
    served_backend *b = &backends[backend];
    const shim_allocator *a = __atomic_load_n(&b->allocator, __ATOMIC_ACQUIRE);
    if (a == NULL || __atomic_load_n(&b->off, __ATOMIC_ACQUIRE) || !a->usable()) {
        return NULL;
    }
    return a;
}

/* The allocator, if this call may be served on `backend` at all: not while profiling, which
 * sees each allocation and copy. */
static const shim_allocator *serving(int backend) {
    return shim_profile_on() ? NULL : allocator_for(backend);
}

/* A struct with no shim.Buffer and in no shared family: no family in Python. */
static bool bare(const halide_buffer_t *buf) {
    return !(shim_flags_load(buf) & (SHIM_BUFFER_FLAG_PYTHON | SHIM_BUFFER_FLAG_REGIONS));
}

bool shim_buffer_span(const struct halide_buffer_t *buf, uint64_t *span) {
    int64_t elem = (buf->type.bits + 7) / 8;
    int64_t last = 0;
    for (int i = 0; i < buf->dimensions; i++) {
        int64_t extent = buf->dim[i].extent, stride = buf->dim[i].stride;
        if (extent <= 0 || stride < 0 || extent > (INT64_C(1) << 40) ||
            stride > (INT64_C(1) << 40)) {
            return false;
        }
        last += (extent - 1) * stride * elem;
        if (last > (INT64_C(1) << 60)) {
            return false;
        }
    }
    *span = (uint64_t)(last + elem);
    return elem > 0;
}

/* Memory that will not be used: back to the pool if reuse allows (evicting what no longer
 * fits), else to the driver. */
static void give_back(void *user_context, served_backend *b, const shim_allocator *a,
                      uint64_t native, uint64_t capacity) {
    uint64_t freed = 0;
    int pooled = halide_can_reuse_device_allocations(user_context)
                     ? shim_pool_put(b->pool, native, capacity)
                     : -1;
    if (pooled < 0) {
        a->release(native);
        freed++;
    }
    uint64_t evicted_capacity;
    for (uint64_t evicted; pooled > 0 && (evicted = shim_pool_evict(b->pool, &evicted_capacity));) {
        a->release(evicted);
        freed++;
    }
    if (freed) {
        shim_pool_count(b->pool, 0, freed);
    }
}

/* What a served malloc or free works on: the call's arguments and the backend's allocator. */
typedef struct {
    void *user_context;
    struct halide_buffer_t *buf;
    int backend;
    const struct halide_device_interface_t *interface;
    const shim_allocator *allocator;
    bool mark_host; /* Buffer.device_malloc: the host holds the data */
    bool keep_device_data; /* Buffer.device_free: device-only results are never dropped */
    bool to_device; /* a copy's direction */
} served_call;

/* A served operation, run either directly (a bare struct) or, for a shim.Buffer's struct,
 * where its family's lock stands taken (shim_buffer_family_serve). */
static int run_served(served_call *c, int operation, shim_served_step step) {
    uint64_t flags = shim_flags_load(c->buf);
    if (flags & SHIM_BUFFER_FLAG_REGIONS) {
        return SHIM_NOT_SERVED;
    }
    if (flags & SHIM_BUFFER_FLAG_PYTHON) {
        shim_family_server server = __atomic_load_n(&family_server, __ATOMIC_ACQUIRE);
        return server == NULL ? SHIM_NOT_SERVED : server(c->buf, operation, step, c);
    }
    return operation == SHIM_FAMILY_IDLE ? SHIM_NOT_SERVED : step(c);
}

static int malloc_step(void *context) {
    served_call *c = context;
    struct halide_buffer_t *buf = c->buf;
    if (shim_device_load(buf) != 0 ||
        __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) != NULL) {
        return SHIM_NOT_SERVED;
    }
    uint64_t nbytes;
    if (!shim_buffer_span(buf, &nbytes)) {
        return SHIM_NOT_SERVED;
    }
    served_backend *b = &backends[c->backend];
    const shim_allocator *a = c->allocator;
    bool reuse = halide_can_reuse_device_allocations(c->user_context);
    uint64_t size = reuse ? shim_pool_quantize(nbytes) : nbytes, capacity = size;
    uint64_t native = reuse ? shim_pool_take(b->pool, size, &capacity) : 0;
    bool fresh = native == 0;
    if (fresh) {
        native = a->create(size);
        if (native == 0) {
            return SHIM_NOT_SERVED; /* the Python core retries after emptying the pool, and reports */
        }
        shim_pool_count(b->pool, 1, 0);
    }
    uint64_t handle = a->make_handle(native, nbytes, capacity);
    if (handle != 0 && c->mark_host && buf->host != NULL) {
        shim_flags_set(buf, halide_buffer_flag_host_dirty); /* before the handle is published */
    }
    const struct halide_device_interface_t *none = NULL;
    if (handle != 0 &&
        __atomic_compare_exchange_n(&buf->device_interface, &none, c->interface, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        count_live(b, 1, (int64_t)capacity);
        __atomic_store_n(&buf->device, handle, __ATOMIC_RELEASE);
        return halide_error_code_success;
    }
    if (handle != 0) { /* another thread gave the struct an interface meanwhile */
        uint64_t n, s, cap;
        a->claim(handle, &n, &s, &cap);
        a->release_handle(handle);
    }
    give_back(c->user_context, b, a, native, capacity);
    return SHIM_NOT_SERVED;
}

int shim_served_malloc(void *user_context, struct halide_buffer_t *buf, int backend,
                       const struct halide_device_interface_t *interface) {
    served_call c = {user_context, buf, backend, interface, serving(backend), false, false};
    if (c.allocator == NULL || shim_device_load(buf) != 0 ||
        __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) != NULL) {
        return SHIM_NOT_SERVED;
    }
    return run_served(&c, SHIM_FAMILY_MALLOC, malloc_step);
}

int shim_served_buffer_malloc(struct halide_buffer_t *buf, int backend,
                              const struct halide_device_interface_t *interface) {
    served_call c = {NULL, buf, backend, interface, serving(backend), true, false};
    if (c.allocator == NULL || !(shim_flags_load(buf) & SHIM_BUFFER_FLAG_PYTHON) ||
        shim_device_load(buf) != 0 ||
        __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) != NULL) {
        return SHIM_NOT_SERVED;
    }
    return run_served(&c, SHIM_FAMILY_IDLE, malloc_step);
}

static int free_step(void *context) {
    served_call *c = context;
    struct halide_buffer_t *buf = c->buf;
    const shim_allocator *a = c->allocator;
    uint64_t handle = shim_device_load(buf);
    if (handle == 0 || __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) != c->interface ||
        (c->keep_device_data && buf->host != NULL &&
         (shim_flags_load(buf) & halide_buffer_flag_device_dirty))) {
        return SHIM_NOT_SERVED; /* (Buffer.device_free brings device-only results home first) */
    }
    served_backend *b = &backends[c->backend];
    uint64_t native, nbytes, capacity;
    /* An allocation with crops made in C stays while they live: the Python core, which drops
     * the handle and keeps the memory for the crops (families.py's drop_handle), takes it. */
    uint32_t *stripe = stripe_of(handle);
    stripe_lock(stripe);
    bool claimed = a->link(handle)->next == 0 && a->claim(handle, &native, &nbytes, &capacity);
    stripe_unlock(stripe);
    if (!claimed) {
        return SHIM_NOT_SERVED; /* made by the Python core, adopted by it, or cropped */
    }
    shim_device_store(buf, 0, NULL);
    shim_flags_clear(buf, halide_buffer_flag_device_dirty);
    a->release_handle(handle);
    count_live(b, -1, (int64_t)capacity);
    give_back(c->user_context, b, a, native, capacity);
    return halide_error_code_success;
}

static int serve_free(served_call *c, int operation) {
    if (c->allocator == NULL || shim_device_load(c->buf) == 0 ||
        __atomic_load_n(&c->buf->device_interface, __ATOMIC_ACQUIRE) != c->interface ||
        shim_pool_max_bytes(backends[c->backend].pool) < 0) {
        return SHIM_NOT_SERVED; /* (the pool's byte bound is set by the Python core's first free) */
    }
    return run_served(c, operation, free_step);
}

int shim_served_free(void *user_context, struct halide_buffer_t *buf, int backend,
                     const struct halide_device_interface_t *interface) {
    served_call c = {user_context, buf, backend, interface, serving(backend), false, false};
    return serve_free(&c, SHIM_FAMILY_FREE);
}

int shim_served_buffer_free(struct halide_buffer_t *buf, int backend,
                            const struct halide_device_interface_t *interface) {
    served_call c = {NULL, buf, backend, interface, serving(backend), false, true};
    if (!(shim_flags_load(buf) & SHIM_BUFFER_FLAG_PYTHON)) {
        return SHIM_NOT_SERVED;
    }
    return serve_free(&c, SHIM_FAMILY_IDLE);
}

/* halide_device_and_host_malloc and _free of a bare struct: the host side from halide_malloc,
 * the device side as halide_device_malloc's, as the Python core's device_and_host_malloc and
 * device_and_host_free (runtime.py) do; any case the device side declines goes back to the
 * Python core with the host side undone. */
int shim_served_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                       int backend,
                                       const struct halide_device_interface_t *interface) {
    uint64_t nbytes;
    if (bare(buf) && serving(backend) != NULL && shim_device_load(buf) == 0 &&
        shim_buffer_span(buf, &nbytes)) {
        uint8_t *before = buf->host;
        void *host = halide_malloc(user_context, nbytes);
        if (host == NULL) {
            return SHIM_NOT_SERVED; /* (the Python core reports it) */
        }
        buf->host = host;
        if (shim_served_malloc(user_context, buf, backend, interface) ==
            halide_error_code_success) {
            return halide_error_code_success;
        }
        buf->host = before;
        halide_free(user_context, host);
    }
    return SHIM_NOT_SERVED;
}

int shim_served_device_and_host_free(void *user_context, struct halide_buffer_t *buf, int backend,
                                     const struct halide_device_interface_t *interface) {
    if (!bare(buf) ||
        shim_served_free(user_context, buf, backend, interface) != halide_error_code_success) {
        return SHIM_NOT_SERVED;
    }
    if (buf->host != NULL) {
        halide_free(user_context, buf->host);
        buf->host = NULL;
    }
    shim_flags_clear(buf, halide_buffer_flag_host_dirty | halide_buffer_flag_device_dirty);
    return halide_error_code_success;
}

/* The allocation's own handle that `handle` (live, of this allocator's backend) belongs to,
 * with its stripe taken: `handle` itself unless it is a crop made here. */
static uint64_t lock_root(const shim_allocator *a, uint64_t handle, uint32_t **stripe) {
    for (;;) {
        uint64_t root = __atomic_load_n(&a->link(handle)->root, __ATOMIC_ACQUIRE);
        root = root != 0 ? root : handle;
        *stripe = stripe_of(root);
        stripe_lock(*stripe);
        uint64_t now = __atomic_load_n(&a->link(handle)->root, __ATOMIC_ACQUIRE);
        if ((now != 0 ? now : handle) == root) {
            return root; /* (an adoption, which clears a crop's root, takes the same stripe) */
        }
        stripe_unlock(*stripe);
    }
}

int shim_served_adopt(int backend, uint64_t handle, uint64_t *native, uint64_t *nbytes,
                      uint64_t *capacity, uint64_t *root) {
    if (backend < 0 || backend >= SHIM_BACKEND_COUNT || handle == 0) {
        return 0;
    }
    served_backend *b = &backends[backend];
    const shim_allocator *a = __atomic_load_n(&b->allocator, __ATOMIC_ACQUIRE);
    if (a == NULL) {
        return 0;
    }
    uint32_t *stripe;
    *root = lock_root(a, handle, &stripe);
    bool claimed = a->claim(*root, native, nbytes, capacity);
    if (claimed) {
        /* Its crops become the caller's too: no longer this file's (their list stays, frozen,
         * for shim_served_crops). */
        for (uint64_t crop = a->link(*root)->next; crop != 0; crop = a->link(crop)->next) {
            __atomic_store_n(&a->link(crop)->root, 0, __ATOMIC_RELEASE);
        }
    }
    stripe_unlock(stripe);
    if (!claimed) {
        return 0;
    }
    count_live(b, -1, (int64_t)*capacity);
    return 1;
}

int shim_served_crops(int backend, uint64_t root, uint64_t *handles, uint64_t *offsets,
                      int room) {
    const shim_allocator *a = backend < 0 || backend >= SHIM_BACKEND_COUNT
                                  ? NULL
                                  : __atomic_load_n(&backends[backend].allocator, __ATOMIC_ACQUIRE);
    int count = 0;
    for (uint64_t crop = a == NULL ? 0 : a->link(root)->next; crop != 0;
         crop = a->link(crop)->next, count++) {
        if (count < room) {
            handles[count] = crop;
            offsets[count] = a->link(crop)->offset;
        }
    }
    return count;
}

/* --- copies ---------------------------------------------------------------------------------
 *
 * copy_to_device and copy_to_host of a served allocation, where the buffer's elements are
 * dense: they fill its span exactly, so the Python core's copy plan (shim/native/regions.py's
 * mirror_plan: the device mirrors the host layout from the min element) moves exactly the span's
 * bytes, one blocking copy. Other layouts, and everything the Python core would refuse, are
 * left to it. The dirty bit is cleared only once the copy has completed (see device_generic.c). */

/* Whether the elements of `buf` are every element of its span once: sorted by stride, each
 * dimension with more than one element steps over exactly the ones before it. */
static bool dense(const halide_buffer_t *buf) {
    if (buf->dimensions > 16) {
        return false;
    }
    int64_t extents[16], strides[16];
    int count = 0;
    for (int i = 0; i < buf->dimensions; i++) {
        if (buf->dim[i].extent > 1) {
            int j = count++;
            for (; j > 0 && strides[j - 1] > buf->dim[i].stride; j--) { /* insertion sort */
                extents[j] = extents[j - 1];
                strides[j] = strides[j - 1];
            }
            extents[j] = buf->dim[i].extent;
            strides[j] = buf->dim[i].stride;
        }
    }
    int64_t step = 1;
    for (int i = 0; i < count; i++) {
        if (strides[i] != step) {
            return false;
        }
        step *= extents[i];
    }
    return true;
}

/* The native value of the allocation `buf` holds, where in it `buf` starts and the bytes it
 * spans, if a copy of it may be served: a served allocation, or the Python core's allocation of
 * a shim.Buffer's struct, which only reaches here through the family server, once that found
 * the handle its family's, into the family's memory (fast/buffer_families.c). */
static bool copyable(const shim_allocator *a, const halide_buffer_t *buf, uint64_t *native,
                     uint64_t *offset, uint64_t *nbytes) {
    uint64_t device = shim_device_load(buf), allocated;
    if (buf->host == NULL || device == 0) {
        return false;
    }
    *offset = 0;
    if (!a->served(device, native, &allocated) &&
        !((shim_flags_load(buf) & SHIM_BUFFER_FLAG_PYTHON) &&
          a->locate(device, native, offset, &allocated))) {
        return false;
    }
    return shim_buffer_span(buf, nbytes) && *nbytes <= allocated && dense(buf);
}

/* The copy itself, once the struct's family (if it has one) is held: `c->mark_host` says which
 * way (true: to the device). */
static int copy_step(void *context) {
    served_call *c = context;
    struct halide_buffer_t *buf = c->buf;
    bool up = c->to_device;
    uint64_t native, offset, nbytes;
    if (!copyable(c->allocator, buf, &native, &offset, &nbytes)) {
        return SHIM_NOT_SERVED;
    }
    uint64_t flags = shim_flags_load(buf);
    uint64_t newer = up ? halide_buffer_flag_host_dirty : halide_buffer_flag_device_dirty;
    if (!(flags & newer)) {
        return halide_error_code_success;
    }
    if (flags & (halide_buffer_flag_host_dirty | halide_buffer_flag_device_dirty) & ~newer) {
        return SHIM_NOT_SERVED; /* both sides changed: the Python core reports it */
    }
    int failed = up ? c->allocator->write(native, offset, buf->host, nbytes)
                    : c->allocator->read(native, offset, buf->host, nbytes);
    if (failed) {
        return SHIM_NOT_SERVED; /* the Python core reports it (or tries again, and reports) */
    }
    served_backend *b = &backends[c->backend];
    __atomic_add_fetch(up ? &b->uploaded : &b->downloaded, nbytes, __ATOMIC_RELAXED);
    shim_flags_clear(buf, newer); /* only once the copy has completed (see device_generic.c) */
    return halide_error_code_success;
}

int shim_served_copy_to_device(void *user_context, struct halide_buffer_t *buf, int backend,
                               const struct halide_device_interface_t *interface) {
    served_call c = {user_context, buf, backend, interface, serving(backend), false, false, true};
    if (c.allocator == NULL || buf->host == NULL) {
        return SHIM_NOT_SERVED;
    }
    if (shim_device_load(buf) == 0) {
        /* As the Python core allocates for a copy (runtime.allocate_behind_host): new memory
         * holds nothing, so the host holds the data, marked so before the handle is published;
         * unless the running call replaces the buffer's contents (shim_call_set_replaced). A
         * shim.Buffer's struct is allocated by the Python core, which knows its calls. */
        uint64_t nbytes;
        if (!shim_buffer_span(buf, &nbytes) || !dense(buf) ||
            (shim_flags_load(buf) & (SHIM_BUFFER_FLAG_PYTHON | SHIM_BUFFER_FLAG_REGIONS)) ||
            __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) != NULL) {
            return SHIM_NOT_SERVED;
        }
        if (!shim_call_replaces(shim_current_call(), buf)) {
            shim_flags_set(buf, halide_buffer_flag_host_dirty);
        }
        if (shim_served_malloc(user_context, buf, backend, interface) != halide_error_code_success) {
            return SHIM_NOT_SERVED;
        }
    } else if (__atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE) != interface) {
        return SHIM_NOT_SERVED; /* on another device: the Python core refuses or moves it */
    }
    return run_served(&c, SHIM_FAMILY_COPY, copy_step);
}

int shim_served_copy_to_host(void *user_context, struct halide_buffer_t *buf, int backend) {
    served_call c = {user_context, buf, backend, NULL, serving(backend), false, false};
    if (c.allocator == NULL || buf->host == NULL || shim_device_load(buf) == 0) {
        return SHIM_NOT_SERVED;
    }
    return run_served(&c, SHIM_FAMILY_COPY, copy_step);
}


/* --- halide_buffer_copy ----------------------------------------------------------------------
 *
 * Copies to or from a bare struct's served allocation (not adopted), in the Python core's
 * buffer_copy's order of paths (runtime.py): into host memory, from the source's device where
 * its host memory does not hold its data; into a device allocation (made here first where the
 * destination has none, as the Python core's allocate), from the source's allocation on the same
 * device where that holds its data, else from its host memory. host_copy.c plans and moves
 * the bytes; anything it cannot prove the same is left to the Python core. */

typedef struct {
    const shim_allocator *allocator;
    uint64_t native;
    served_backend *backend;
} served_memory;

static int read_served(void *context, int64_t offset, void *host, int64_t nbytes) {
    served_memory *m = context;
    int failed = m->allocator->read(m->native, (uint64_t)offset, host, (uint64_t)nbytes);
    if (!failed) {
        __atomic_add_fetch(&m->backend->downloaded, (uint64_t)nbytes, __ATOMIC_RELAXED);
    }
    return failed;
}

static int write_served(void *context, int64_t offset, const void *host, int64_t nbytes) {
    served_memory *m = context;
    int failed = m->allocator->write(m->native, (uint64_t)offset, host, (uint64_t)nbytes);
    if (!failed) {
        __atomic_add_fetch(&m->backend->uploaded, (uint64_t)nbytes, __ATOMIC_RELAXED);
    }
    return failed;
}

/* `buf`'s device allocation, if it is a served one this copy may use. */
static bool served_memory_of(const shim_allocator *a, int backend, const halide_buffer_t *buf,
                             served_memory *m, shim_device_memory *memory) {
    uint64_t device = shim_device_load(buf), allocated;
    if (device == 0 || !bare(buf) || !a->served(device, &m->native, &allocated) ||
        allocated > INT64_MAX) {
        return false;
    }
    m->allocator = a;
    m->backend = &backends[backend];
    *memory = (shim_device_memory){read_served, write_served, m, (int64_t)allocated};
    return true;
}

typedef struct {
    served_memory *from, *to;
} served_pair;

static int copy_served(void *context, int64_t src_offset, int64_t dst_offset, int64_t nbytes) {
    served_pair *p = context;
    int failed = p->to->allocator->copy(p->from->native, (uint64_t)src_offset, p->to->native,
                                        (uint64_t)dst_offset, (uint64_t)nbytes);
    if (!failed) {
        __atomic_add_fetch(&p->to->backend->device_copied, (uint64_t)nbytes, __ATOMIC_RELAXED);
    }
    return failed;
}

int shim_served_buffer_copy(void *user_context, struct halide_buffer_t *src,
                            const struct halide_device_interface_t *src_interface, int src_backend,
                            const struct halide_device_interface_t *dst_interface, int dst_backend,
                            struct halide_buffer_t *dst) {
    if (__atomic_load_n(&src->device_interface, __ATOMIC_ACQUIRE) != src_interface) {
        return SHIM_NOT_SERVED; /* (moved meanwhile: its handle may be another backend's) */
    }
    uint64_t flags = shim_flags_load(src);
    bool has_device = shim_device_load(src) != 0;
    bool host_valid =
        src->host != NULL && (!(flags & halide_buffer_flag_device_dirty) || !has_device);
    bool device_valid =
        has_device && (src->host == NULL || !(flags & halide_buffer_flag_host_dirty));
    served_memory from, to;
    shim_device_memory from_memory, to_memory;
    if (dst_interface == NULL) {
        const shim_allocator *a = src_interface == NULL ? NULL : serving(src_backend);
        if (a == NULL || host_valid || !device_valid ||
            !served_memory_of(a, src_backend, src, &from, &from_memory)) {
            return SHIM_NOT_SERVED;
        }
        return shim_copy_from_device(src, dst, &from_memory);
    }
    const shim_allocator *a = serving(dst_backend);
    const struct halide_device_interface_t *dst_now =
        __atomic_load_n(&dst->device_interface, __ATOMIC_ACQUIRE);
    bool on_device = device_valid && src_interface == dst_interface;
    if (a == NULL || src == dst || !bare(src) || !bare(dst) ||
        (dst_now != NULL && dst_now != dst_interface) || (!on_device && !host_valid) ||
        (on_device && !served_memory_of(a, dst_backend, src, &from, &from_memory))) {
        return SHIM_NOT_SERVED;
    }
    if (shim_device_load(dst) == 0 &&
        shim_served_malloc(user_context, dst, dst_backend, dst_interface) !=
            halide_error_code_success) {
        return SHIM_NOT_SERVED;
    }
    if (!served_memory_of(a, dst_backend, dst, &to, &to_memory)) {
        return SHIM_NOT_SERVED;
    }
    if (on_device) {
        served_pair pair = {&from, &to};
        return shim_copy_between_devices(src, dst, &from_memory, &to_memory, copy_served, &pair);
    }
    return shim_copy_to_device(src, dst, &to_memory);
}

/* --- crops and slices -------------------------------------------------------------------------
 *
 * halide_device_crop and halide_device_slice of a served allocation (or of a crop of one made
 * here), and halide_device_release_crop of such a crop. The Python core (shim/core/runtime.py's
 * _crop_into and device_release_crop, for a struct with no shim.Buffer) adopts the allocation,
 * asks the backend for a handle at the crop's byte offset, and counts it in the family's
 * handles, so that the memory stays while any handle into it does. Here the same handle is made
 * (the backend's make_crop, which declines where only its Python side can make one), the
 * crop's byte offset computed as regions.py's Layout.offset_of does, and the counting is the
 * allocation's list of live crops: its own handle is not freed here while the list has any
 * (free_step), and an adoption takes the list with it (the Python core then counts each
 * crop's handle in the family, families.py's _adopted). Each change of a list, a served free's
 * claim and an adoption happen with the allocation's stripe taken, so a crop is either in the
 * list when the allocation is adopted, or made after it and refused (the allocation no longer
 * marked served). A shim.Buffer's struct and a shared family's member stay with the Python
 * core, whose family lock they need. Crops change no memory: they are served while profiling
 * too (counted as served; served.c's allocations are not, as a profile sees each one). */

/* Byte offset of the element at `coords` from the min element of `buf` (Layout.offset_of);
 * false where it overflows. */
static bool offset_of(const halide_buffer_t *buf, const int64_t *coords, int64_t *offset) {
    int64_t elem = (buf->type.bits + 7) / 8, sum = 0, term;
    for (int i = 0; i < buf->dimensions; i++) {
        if (__builtin_mul_overflow(coords[i] - buf->dim[i].min, buf->dim[i].stride, &term) ||
            __builtin_mul_overflow(term, elem, &term) || __builtin_add_overflow(sum, term, &sum)) {
            return false;
        }
    }
    *offset = sum;
    return true;
}

int shim_served_crop(const struct halide_buffer_t *src, struct halide_buffer_t *dst, int slice_dim,
                     int slice_pos, int backend, const struct halide_device_interface_t *interface) {
    const shim_allocator *a = allocator_for(backend);
    uint64_t handle = shim_device_load(src), nbytes;
    if (a == NULL || handle == 0 || src->dimensions > 16 || !bare(src) || !bare(dst) ||
        __atomic_load_n(&src->device_interface, __ATOMIC_ACQUIRE) != interface ||
        !shim_buffer_span(dst, &nbytes)) {
        return SHIM_NOT_SERVED; /* (an empty or negatively strided crop: the Python core reports) */
    }
    /* The crop's min element in the source's coordinates (runtime.py's device_crop and
     * device_slice). */
    int64_t coords[16];
    for (int i = 0, j = 0; i < src->dimensions; i++) {
        coords[i] = i == slice_dim ? slice_pos : dst->dim[j++].min;
    }
    int64_t within;
    if (!offset_of(src, coords, &within)) {
        return SHIM_NOT_SERVED;
    }
    uint32_t *stripe;
    uint64_t root = lock_root(a, handle, &stripe);
    uint64_t native, allocated, offset = root == handle ? 0 : a->link(handle)->offset;
    uint64_t crop = 0;
    if (a->served(root, &native, &allocated) && (within >= 0 || offset >= (uint64_t)-within)) {
        crop = a->make_crop(native, offset + (uint64_t)within, nbytes);
    }
    if (crop != 0) {
        shim_served_link *l = a->link(crop), *r = a->link(root);
        l->offset = offset + (uint64_t)within;
        l->prev = root;
        l->next = r->next;
        if (r->next != 0) {
            a->link(r->next)->prev = crop;
        }
        r->next = crop;
        __atomic_store_n(&l->root, root, __ATOMIC_RELEASE);
    }
    stripe_unlock(stripe);
    if (crop == 0) {
        return SHIM_NOT_SERVED;
    }
    shim_device_store(dst, crop, interface);
    return shim_decided(slice_dim < 0 ? SHIM_FN_DEVICE_CROP : SHIM_FN_DEVICE_SLICE,
                        SHIM_OUTCOME_SERVED, halide_error_code_success);
}

int shim_served_release_crop(struct halide_buffer_t *buf, int backend) {
    const shim_allocator *a = allocator_for(backend);
    uint64_t handle = shim_device_load(buf);
    if (a == NULL || handle == 0 || !bare(buf) ||
        __atomic_load_n(&a->link(handle)->root, __ATOMIC_ACQUIRE) == 0) {
        return SHIM_NOT_SERVED; /* not a crop made here, or one adopted by the Python core */
    }
    uint32_t *stripe;
    uint64_t root = lock_root(a, handle, &stripe);
    bool ours = root != handle;
    if (ours) { /* out of the list; its allocation's handle stays, and with it the memory */
        shim_served_link *l = a->link(handle);
        if (l->prev == root) {
            a->link(root)->next = l->next;
        } else {
            a->link(l->prev)->next = l->next;
        }
        if (l->next != 0) {
            a->link(l->next)->prev = l->prev;
        }
    }
    stripe_unlock(stripe);
    if (!ours) {
        return SHIM_NOT_SERVED; /* adopted meanwhile */
    }
    shim_device_store(buf, 0, NULL); /* (the flags stay, as runtime.py's _drop_device leaves them) */
    a->release_handle(handle);
    return shim_decided(SHIM_FN_DEVICE_RELEASE_CROP, SHIM_OUTCOME_SERVED,
                        halide_error_code_success);
}

int shim_served_sync(int backend) {
    const shim_allocator *a = allocator_for(backend);
    if (a == NULL || a->sync() != 0) {
        return SHIM_NOT_SERVED;
    }
    return shim_decided(SHIM_FN_DEVICE_SYNC, SHIM_OUTCOME_SERVED, halide_error_code_success);
}
