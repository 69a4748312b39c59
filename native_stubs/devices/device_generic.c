/* The generic halide_* device entry points, and the shim's device interfaces.
 *
 * Generated code and Halide's buffer helpers call these, and every device interface's public
 * members point here, as in Halide. The shim's own interfaces (at the end of this file) are
 * here too, because they and the entry points are each other's: an interface's public members
 * are the entry points, and each entry point asks whether the interface it is given is one of
 * them. Each entry point
 *   1. validates the buffer as Halide 21 does (same checks, order and error codes),
 *   2. decides the no-ops from atomic loads, without a lock and without Python,
 *   3. dispatches through the interface's impl table.
 * There is no process-wide lock (Halide's device_copy_mutex): nothing here takes any lock.
 *
 * For the shim's own interfaces (below) the impl entries are the Python runtime core,
 * which takes the allocation family's lock, re-checks the flags, moves the data and updates the
 * flags itself. Before it, device_malloc, device_free, copy_to_device and copy_to_host ask
 * served.c, which serves a pipeline's own buffers (no Python family exists for them) entirely in
 * C and leaves every other case to the Python core; buffer_copy between host memories asks
 * host_copy.c first, likewise. For any other interface (a backend the shim does not implement, running in a
 * pipeline's bundled runtime) the impl is the backend alone and this file updates the flags
 * afterwards, as Halide's generic layer does.
 *
 * Why the lock-free no-op is safe (double-checked locking)
 * --------------------------------------------------------
 * The fast paths read buf->device, buf->device_interface and buf->flags with acquire loads.
 * The shim's slow paths write them under the family lock, and in this order:
 *  - an allocation publishes the interface, then the handle, both with release stores, after
 *    the allocation exists: a reader that sees the handle sees a usable allocation;
 *  - a dirty bit is cleared with a release read-modify-write only after the copy it describes
 *    has completed: a reader that sees host_dirty clear also sees every byte that upload wrote
 *    (and likewise device_dirty clear and the download), so returning "nothing to do" hands the
 *    caller data that is already where it needs it.
 * Served allocations (served.c) keep the same two orders without a lock: the handle is
 * published after the memory and the handle exist, and cleared before the memory goes back to
 * the pool; a served free or an adoption by Python claims the handle with one atomic exchange,
 * so exactly one of them takes the memory.
 * A fast path that sees a dirty bit set takes the slow path, which re-reads everything under
 * the lock: two threads racing to copy the same buffer copy it once; the second finds the bit
 * clear. What the fast path cannot see is a bit being set at the same moment by a writer on
 * another thread (generated code sets flags with plain stores). Such a writer is racing with
 * the reader for the data itself; Halide's global lock does not order it either, since the
 * writer never takes that lock.
 */
#include <sched.h>
#include <stdio.h>

#include "shim_native.h"
#include "devices/device_generic.h"
#include "devices/device_store.h"
#include "devices/host_copy.h"
#include "devices/served.h"
#include "profiling/profile.h"

enum {
    HOST_DIRTY = halide_buffer_flag_host_dirty,
    DEVICE_DIRTY = halide_buffer_flag_device_dirty,
};

/* Halide's own buffer_copy, from the standalone runtime, minus its global lock: used for
 * interfaces the shim does not own. */
int halide_buffer_copy_already_locked(void *user_context, struct halide_buffer_t *src,
                                      const struct halide_device_interface_t *dst_device_interface,
                                      struct halide_buffer_t *dst);

static const struct halide_device_interface_t *interface_of(const halide_buffer_t *buf) {
    return __atomic_load_n(&buf->device_interface, __ATOMIC_ACQUIRE);
}

static inline bool shim_owns_interface(const struct halide_device_interface_t *device_interface) {
    return shim_backend_of(device_interface) >= 0;
}

static inline bool shim_is_proxy(const struct halide_device_interface_t *device_interface) {
    return device_interface != NULL && device_interface == shim_backend_interface(SHIM_BACKEND_PROXY);
}

/* Whether a buffer whose device and device_interface fields read `device` and `interface` has
 * device memory of its own: a handle, and not the proxy interface a member of a shared family
 * carries until the family is on a device (its "handle" is then the member's own address).
 * The Python core asks the same with shim/memory/aliasing.py's has_allocation. */
static inline bool shim_has_allocation(uint64_t device,
                                       const struct halide_device_interface_t *interface) {
    return device != 0 && interface != NULL && !shim_is_proxy(interface);
}

#define COLD __attribute__((noinline, cold))
#define LIKELY(x) __builtin_expect(!!(x), 1)

/* One acquire-load snapshot of the fields a fast path decides on. */
typedef struct {
    uint64_t device;
    const struct halide_device_interface_t *interface;
    uint64_t flags;
} snapshot;

static inline snapshot take_snapshot(const halide_buffer_t *buf) {
    snapshot s;
    s.device = shim_device_load(buf);
    s.interface = interface_of(buf);
    s.flags = shim_flags_load(buf);
    return s;
}

/* Both dirty bits set: a conflict, except on a member of a shared family, whose bits say
 * only that some part of it is newer on each side (SHIM_BUFFER_FLAG_REGIONS). */
static inline bool both_dirty(uint64_t flags) {
    return (flags & (HOST_DIRTY | DEVICE_DIRTY | SHIM_BUFFER_FLAG_REGIONS)) ==
           (HOST_DIRTY | DEVICE_DIRTY);
}

/* Would validate() accept this snapshot? (device and interface both set or both unset, not
 * both dirty) */
static inline bool snapshot_valid(snapshot s) {
    return (s.device != 0) == (s.interface != NULL) && !both_dirty(s.flags);
}

/* Halide's debug_log_and_validate_buf: null buffer, device without interface, interface
 * without device, both dirty. */
static COLD int validate(void *user_context, const halide_buffer_t *buf, const char *routine) {
    if (buf == NULL) {
        return halide_error_buffer_is_null(user_context, routine);
    }
    /* A malloc stores the interface, then the handle; a free the handle, then the interface
     * (shim_device_store): a pair read while another thread does either can be half of each,
     * as when one thread frees a Buffer's device memory (under its family's lock) while another
     * asks to copy it (which validates before taking the lock). A half pair is read again
     * until no store overlapped the reading: none begun by its end that had not ended by its
     * start. Only then is it the buffer's own, and an error. (Before, a free seen half done
     * failed the copy with "device_interface_no_device": ThreadSanitizer's slower stores made
     * it show in tests/test_fast_paths_adversarial.py's movers.) A bounded wait: stores on
     * other buffers that never pause leave a buffer made half the error. */
    uint64_t device;
    const struct halide_device_interface_t *interface;
    for (int tries = 0;; tries++) {
        uint64_t ended = __atomic_load_n(&shim_device_stores_ended, __ATOMIC_SEQ_CST);
        device = shim_device_load(buf);
        interface = interface_of(buf);
        bool whole = (device != 0) == (interface != NULL) ||
                     __atomic_load_n(&shim_device_stores_begun, __ATOMIC_SEQ_CST) == ended;
        if (whole || tries == 1 << 16) {
            break;
        }
        sched_yield();
    }
    bool has_device = device != 0;
    bool has_interface = interface != NULL;
    if (has_device && !has_interface) {
        return halide_error_no_device_interface(user_context);
    }
    if (has_interface && !has_device) {
        return halide_error_device_interface_no_device(user_context);
    }
    if (both_dirty(shim_flags_load(buf))) {
        return halide_error_host_and_device_dirty(user_context);
    }
    return halide_error_code_success;
}

static COLD int refuse_interface_switch(void *user_context, const char *routine) {
    char msg[128];
    snprintf(msg, sizeof msg, "%s does not support switching device interfaces\n", routine);
    halide_error(user_context, msg);
    return halide_error_code_incompatible_device_interface;
}

/* The device each interface's memory is on: its own, except for another kind of memory of
 * one device (OpenCL images, on the OpenCL backend's: shim/backends/opencl_image.py, whose
 * class says so as ``api``). */
static const int device_of[SHIM_BACKEND_COUNT] = {
    [SHIM_BACKEND_HOST] = SHIM_BACKEND_HOST,     [SHIM_BACKEND_OPENCL] = SHIM_BACKEND_OPENCL,
    [SHIM_BACKEND_CUDA] = SHIM_BACKEND_CUDA,     [SHIM_BACKEND_PROXY] = SHIM_BACKEND_PROXY,
    [SHIM_BACKEND_OPENCL_IMAGE] = SHIM_BACKEND_OPENCL, [SHIM_BACKEND_VULKAN] = SHIM_BACKEND_VULKAN,
};

/* Halide refuses to move a buffer to another interface; between two kinds of memory of one
 * device (one context: OpenCL's buffers and images) the shim moves it, as a program would by
 * hand: what only the device holds goes home, the allocation is freed, and the caller goes on
 * to allocate on the interface it asked for. A pipeline that stores an argument in texture
 * memory asks for images where the shim may have put the argument in buffer memory for it (a
 * numpy array uploaded before the call) or an earlier pipeline left it there. 1: moved; 0: not
 * such a move; else the failure. */
static int move_within_device(void *user_context, struct halide_buffer_t *buf,
                              const struct halide_device_interface_t *current,
                              const struct halide_device_interface_t *wanted) {
    int from = shim_backend_of(current), to = shim_backend_of(wanted);
    if (from < 0 || to < 0 || from == to || device_of[from] != device_of[to] ||
        !shim_has_allocation(shim_device_load(buf), current)) {
        return 0;
    }
    int result = halide_error_code_success;
    if (shim_flags_load(buf) & DEVICE_DIRTY) {
        result = halide_copy_to_host(user_context, buf);
    }
    if (result == halide_error_code_success) {
        result = halide_device_free(user_context, buf);
    }
    return result == halide_error_code_success ? 1 : result;
}

/* A malloc-like entry point may not move a buffer to another interface. */
static int check_same_interface(void *user_context, const halide_buffer_t *buf,
                                const struct halide_device_interface_t *device_interface,
                                const char *routine) {
    if (device_interface == NULL) {
        /* Halide dereferences the NULL interface here; we report it instead. */
        return halide_error_no_device_interface(user_context);
    }
    const struct halide_device_interface_t *current = interface_of(buf);
    if (current != NULL && current != device_interface && !shim_is_proxy(current)) {
        return refuse_interface_switch(user_context, routine);
    }
    return halide_error_code_success;
}

int shim_check_native_handle(void *user_context, const halide_buffer_t *buf, int backend,
                             const char *routine) {
    if (buf == NULL) {
        return halide_error_buffer_is_null(user_context, routine);
    }
    const struct halide_device_interface_t *current = interface_of(buf);
    if (!shim_has_allocation(shim_device_load(buf), current)) {
        return SHIM_NO_NATIVE_HANDLE;
    }
    if (current != shim_backend_interface(backend)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: the buffer's device memory belongs to another device "
                 "interface\n", routine);
        halide_error(user_context, msg);
        return halide_error_code_incompatible_device_interface;
    }
    return halide_error_code_success;
}

/* The outcomes decided here, counted while profiling (profiling/profile.c). */
#define NOOP(function)                                                                     \
    shim_decided(SHIM_FN_##function, SHIM_OUTCOME_NOOP, halide_error_code_success)
#define REFUSED(function, code) shim_decided(SHIM_FN_##function, SHIM_OUTCOME_REFUSED, (code))

/* Runs a foreign backend's impl entry the way Halide's generic layer does: inside
 * use_module/release_module, any failure reported as `failure`. */
#define FOREIGN_CALL(function, interface, failure, entry, ...)                              \
    ({                                                                                     \
        shim_decided(SHIM_FN_##function, SHIM_OUTCOME_FOREIGN, 0);                         \
        (interface)->impl->use_module();                                                   \
        int foreign_result_ = (interface)->impl->entry(__VA_ARGS__);                       \
        (interface)->impl->release_module();                                               \
        foreign_result_ ? (failure) : halide_error_code_success;                           \
    })

int halide_copy_to_host(void *user_context, struct halide_buffer_t *buf) {
    if (LIKELY(buf != NULL)) {
        snapshot s = take_snapshot(buf);
        if (LIKELY(snapshot_valid(s) && !(s.flags & DEVICE_DIRTY))) {
            return NOOP(COPY_TO_HOST); /* nothing to copy */
        }
    }
    int result = validate(user_context, buf, "halide_copy_to_host");
    if (result) {
        return REFUSED(COPY_TO_HOST, result);
    }
    if (!(shim_flags_load(buf) & DEVICE_DIRTY)) {
        return NOOP(COPY_TO_HOST);
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface == NULL) {
        return halide_error_code_no_device_interface;
    }
    if (shim_owns_interface(interface)) {
        result = shim_served_copy_to_host(user_context, buf, shim_backend_of(interface));
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return interface->impl->copy_to_host(user_context, buf);
    }
    result = FOREIGN_CALL(COPY_TO_HOST, interface, halide_error_code_copy_to_host_failed,
                          copy_to_host, user_context, buf);
    if (result == halide_error_code_success) {
        shim_flags_clear(buf, DEVICE_DIRTY);
    }
    return result;
}

int halide_copy_to_device(void *user_context, struct halide_buffer_t *buf,
                          const struct halide_device_interface_t *device_interface) {
    if (LIKELY(buf != NULL)) {
        snapshot s = take_snapshot(buf);
        if (LIKELY(shim_has_allocation(s.device, s.interface) && !(s.flags & HOST_DIRTY) &&
                   (device_interface == NULL || device_interface == s.interface))) {
            return NOOP(COPY_TO_DEVICE); /* already on this device, and current */
        }
    }
    int result = validate(user_context, buf, "halide_copy_to_device");
    if (result) {
        return REFUSED(COPY_TO_DEVICE, result);
    }
    const struct halide_device_interface_t *current = interface_of(buf);
    if (device_interface == NULL) {
        if (current == NULL) {
            return halide_error_code_no_device_interface;
        }
        device_interface = current;
    }
    /* A crop carrying the proxy interface is not on a device yet: the backend asked for
     * allocates its parent and makes it alias that (shim/core/runtime.py). */
    bool allocated = shim_has_allocation(shim_device_load(buf), current);
    if (allocated && current != device_interface) {
        result = move_within_device(user_context, buf, current, device_interface);
        if (result == 0) {
            return refuse_interface_switch(user_context, "halide_copy_to_device");
        }
        if (result != 1) {
            return result;
        }
        allocated = false;
    }
    if (allocated && !(shim_flags_load(buf) & HOST_DIRTY)) {
        return NOOP(COPY_TO_DEVICE);
    }
    if (shim_owns_interface(device_interface)) {
        result = shim_served_copy_to_device(user_context, buf, shim_backend_of(device_interface),
                                            device_interface);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return device_interface->impl->copy_to_device(user_context, buf);
    }
    if (!allocated) {
        result = halide_device_malloc(user_context, buf, device_interface);
        if (result) {
            return result;
        }
    }
    uint64_t flags = shim_flags_load(buf);
    if (!(flags & HOST_DIRTY)) {
        return NOOP(COPY_TO_DEVICE);
    }
    if (flags & DEVICE_DIRTY) {
        return halide_error_code_copy_to_device_failed;
    }
    result = FOREIGN_CALL(COPY_TO_DEVICE, device_interface, halide_error_code_copy_to_device_failed,
                          copy_to_device, user_context, buf);
    if (result == halide_error_code_success) {
        shim_flags_clear(buf, HOST_DIRTY);
    }
    return result;
}

int halide_device_malloc(void *user_context, struct halide_buffer_t *buf,
                         const struct halide_device_interface_t *device_interface) {
    if (LIKELY(buf != NULL)) {
        snapshot s = take_snapshot(buf);
        if (LIKELY(s.device != 0 && s.interface == device_interface && device_interface != NULL &&
                   snapshot_valid(s))) {
            return NOOP(DEVICE_MALLOC); /* already allocated there */
        }
    }
    int result = validate(user_context, buf, "halide_device_malloc");
    if (result) {
        return REFUSED(DEVICE_MALLOC, result);
    }
    if (device_interface != NULL) {
        result = move_within_device(user_context, buf, interface_of(buf),
                                              device_interface);
        if (result < 0 || result > 1) {
            return result;
        }
    }
    result = check_same_interface(user_context, buf, device_interface, "halide_device_malloc");
    if (result) {
        return REFUSED(DEVICE_MALLOC, result);
    }
    if (shim_has_allocation(shim_device_load(buf), interface_of(buf))) {
        return NOOP(DEVICE_MALLOC); /* already allocated on this interface */
    }
    if (shim_owns_interface(device_interface)) {
        result = shim_served_malloc(user_context, buf, shim_backend_of(device_interface),
                                    device_interface);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return device_interface->impl->device_malloc(user_context, buf);
    }
    return FOREIGN_CALL(DEVICE_MALLOC, device_interface, halide_error_code_device_malloc_failed,
                        device_malloc, user_context, buf);
}

int halide_device_free(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_free");
    if (result) {
        return REFUSED(DEVICE_FREE, result);
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface == NULL) {
        shim_flags_clear(buf, DEVICE_DIRTY);
        return NOOP(DEVICE_FREE);
    }
    if (shim_owns_interface(interface)) {
        result = shim_served_free(user_context, buf, shim_backend_of(interface), interface);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return interface->impl->device_free(user_context, buf);
    }
    result = FOREIGN_CALL(DEVICE_FREE, interface, halide_error_code_device_free_failed,
                          device_free, user_context, buf);
    if (result == halide_error_code_success) {
        shim_flags_clear(buf, DEVICE_DIRTY);
    }
    return result;
}

int shim_buffer_device_malloc(struct halide_buffer_t *buf,
                              const struct halide_device_interface_t *interface) {
    if (buf == NULL || !shim_owns_interface(interface)) {
        return SHIM_NOT_SERVED;
    }
    return shim_served_buffer_malloc(buf, shim_backend_of(interface), interface);
}

int shim_buffer_device_free(struct halide_buffer_t *buf) {
    const struct halide_device_interface_t *interface = buf == NULL ? NULL : interface_of(buf);
    if (interface == NULL || !shim_owns_interface(interface)) {
        return SHIM_NOT_SERVED;
    }
    return shim_served_buffer_free(buf, shim_backend_of(interface), interface);
}

void halide_device_free_as_destructor(void *user_context, void *obj) {
    (void)halide_device_free(user_context, (struct halide_buffer_t *)obj);
}

int halide_device_sync(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_sync");
    if (result) {
        return REFUSED(DEVICE_SYNC, result);
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface == NULL) {
        return halide_error_no_device_interface(user_context);
    }
    if (shim_owns_interface(interface)) {
        int backend = shim_backend_of(interface);
        if (backend == SHIM_BACKEND_HOST || backend == SHIM_BACKEND_PROXY) {
            /* The Python core's sync of these waits for nothing (runtime.py's device_sync: a
             * crop's proxy has no device; the host device runs every copy to completion, and
             * its Backend.sync is the base class's, which does nothing). */
            return NOOP(DEVICE_SYNC);
        }
        /* A backend with one in-order queue waits for it in C, as its Python sync() does
         * (clFinish, vkQueueWaitIdle: what served.c's allocator says); the others, and a
         * wait that fails (reported there), go to the Python core. */
        result = shim_served_sync(backend);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return interface->impl->device_sync(user_context, buf);
    }
    return FOREIGN_CALL(DEVICE_SYNC, interface, halide_error_code_device_sync_failed,
                        device_sync, user_context, buf);
}

int halide_device_sync_global(void *user_context,
                              const struct halide_device_interface_t *device_interface) {
    if (device_interface == NULL) {
        return halide_error_code_no_device_interface;
    }
    return device_interface->impl->device_sync(user_context, NULL);
}

void halide_device_release(void *user_context,
                           const struct halide_device_interface_t *device_interface) {
    if (device_interface != NULL) {
        (void)device_interface->impl->device_release(user_context);
    }
}

int halide_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                  const struct halide_device_interface_t *device_interface) {
    int result = validate(user_context, buf, "halide_device_and_host_malloc");
    if (result) {
        return REFUSED(DEVICE_AND_HOST_MALLOC, result);
    }
    result = check_same_interface(user_context, buf, device_interface,
                                  "halide_device_and_host_malloc");
    if (result) {
        return REFUSED(DEVICE_AND_HOST_MALLOC, result);
    }
    if (shim_owns_interface(device_interface)) {
        result = shim_served_device_and_host_malloc(user_context, buf,
                                                    shim_backend_of(device_interface),
                                                    device_interface);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return device_interface->impl->device_and_host_malloc(user_context, buf);
    }
    return FOREIGN_CALL(DEVICE_AND_HOST_MALLOC, device_interface,
                        halide_error_code_device_malloc_failed, device_and_host_malloc,
                        user_context, buf);
}

int halide_device_and_host_free(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_and_host_free");
    if (result) {
        return REFUSED(DEVICE_AND_HOST_FREE, result);
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface != NULL && shim_owns_interface(interface)) {
        result = shim_served_device_and_host_free(user_context, buf, shim_backend_of(interface),
                                                  interface);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return interface->impl->device_and_host_free(user_context, buf);
    }
    if (interface != NULL) {
        result = FOREIGN_CALL(DEVICE_AND_HOST_FREE, interface, halide_error_code_device_free_failed,
                              device_and_host_free, user_context, buf);
        if (result) {
            return result;
        }
    } else if (buf->host != NULL) {
        /* The device side is already gone; the host side is still ours to free. */
        halide_free(user_context, buf->host);
        buf->host = NULL;
    }
    shim_flags_clear(buf, DEVICE_DIRTY);
    return interface != NULL ? halide_error_code_success : NOOP(DEVICE_AND_HOST_FREE);
}

void halide_device_and_host_free_as_destructor(void *user_context, void *obj) {
    (void)halide_device_and_host_free(user_context, (struct halide_buffer_t *)obj);
}

void halide_device_host_nop_free(void *user_context, void *obj) {
    (void)user_context;
    (void)obj;
}

int halide_device_wrap_native(void *user_context, struct halide_buffer_t *buf, uint64_t handle,
                              const struct halide_device_interface_t *device_interface) {
    int result = validate(user_context, buf, "halide_device_wrap_native");
    if (result) {
        return REFUSED(WRAP_NATIVE, result);
    }
    result = check_same_interface(user_context, buf, device_interface,
                                  "halide_device_wrap_native");
    if (result) {
        return REFUSED(WRAP_NATIVE, result);
    }
    /* As in Halide: the interface is set before the backend sees the buffer, and a failure
     * reports device_malloc_failed. */
    __atomic_store_n(&buf->device_interface, device_interface, __ATOMIC_RELEASE);
    if (shim_owns_interface(device_interface)) {
        return device_interface->impl->wrap_native(user_context, buf, handle);
    }
    return FOREIGN_CALL(WRAP_NATIVE, device_interface, halide_error_code_device_malloc_failed,
                        wrap_native, user_context, buf, handle);
}

int halide_device_detach_native(void *user_context, struct halide_buffer_t *buf) {
    int result = validate(user_context, buf, "halide_device_detach_native");
    if (result) {
        return REFUSED(DETACH_NATIVE, result);
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (interface == NULL) {
        return NOOP(DETACH_NATIVE);
    }
    if (shim_owns_interface(interface)) {
        result = interface->impl->detach_native(user_context, buf);
    } else {
        result = FOREIGN_CALL(DETACH_NATIVE, interface,
                              halide_error_code_device_detach_native_failed, detach_native,
                              user_context, buf);
    }
    if (result) {
        return result;
    }
    if (shim_device_load(buf) != 0) {
        halide_error(user_context, "buf->device is not 0 after detach_native\n");
        return halide_error_code_internal_error;
    }
    return halide_error_code_success;
}

static int check_crop_destination(void *user_context, const struct halide_buffer_t *dst,
                                  bool dimensions_ok) {
    if (shim_device_load(dst) != 0) {
        halide_error(user_context, "destination buffer already has a device allocation\n");
        return halide_error_code_device_crop_failed;
    }
    if (!dimensions_ok) {
        halide_error(user_context, "crop or slice with mismatched dimensionality\n");
        return halide_error_code_device_crop_failed;
    }
    return halide_error_code_success;
}

int halide_device_crop(void *user_context, const struct halide_buffer_t *src,
                       struct halide_buffer_t *dst) {
    /* Halide dereferences NULL buffers in the crop family of calls; we report them. */
    if (src == NULL || dst == NULL) {
        return halide_error_buffer_is_null(user_context, "halide_device_crop");
    }
    if (shim_device_load(src) == 0) {
        return NOOP(DEVICE_CROP);
    }
    int result = check_crop_destination(user_context, dst, src->dimensions == dst->dimensions);
    if (result) {
        return REFUSED(DEVICE_CROP, result);
    }
    const struct halide_device_interface_t *interface = interface_of(src);
    if (!shim_owns_interface(interface)) {
        shim_decided(SHIM_FN_DEVICE_CROP, SHIM_OUTCOME_FOREIGN, 0);
    } else {
        result = shim_served_crop(src, dst, -1, 0, shim_backend_of(interface), interface);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
    }
    interface->impl->use_module();
    return interface->impl->device_crop(user_context, src, dst);
}

int halide_device_slice(void *user_context, const struct halide_buffer_t *src, int slice_dim,
                        int slice_pos, struct halide_buffer_t *dst) {
    if (src == NULL || dst == NULL) {
        return halide_error_buffer_is_null(user_context, "halide_device_slice");
    }
    if (shim_device_load(src) == 0) {
        return NOOP(DEVICE_SLICE);
    }
    int result =
        check_crop_destination(user_context, dst, src->dimensions == dst->dimensions + 1);
    if (result) {
        return REFUSED(DEVICE_SLICE, result);
    }
    const struct halide_device_interface_t *interface = interface_of(src);
    if (!shim_owns_interface(interface)) {
        shim_decided(SHIM_FN_DEVICE_SLICE, SHIM_OUTCOME_FOREIGN, 0);
    } else if (slice_dim >= 0 && slice_dim < src->dimensions) {
        result = shim_served_crop(src, dst, slice_dim, slice_pos, shim_backend_of(interface),
                                  interface);
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
    }
    interface->impl->use_module();
    return interface->impl->device_slice(user_context, src, slice_dim, slice_pos, dst);
}

int halide_device_release_crop(void *user_context, struct halide_buffer_t *buf) {
    if (buf == NULL) {
        return halide_error_buffer_is_null(user_context, "halide_device_release_crop");
    }
    if (shim_device_load(buf) == 0) {
        return NOOP(DEVICE_RELEASE_CROP);
    }
    const struct halide_device_interface_t *interface = interface_of(buf);
    if (shim_owns_interface(interface)) {
        int result = shim_served_release_crop(buf, shim_backend_of(interface));
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return interface->impl->device_release_crop(user_context, buf);
    }
    shim_decided(SHIM_FN_DEVICE_RELEASE_CROP, SHIM_OUTCOME_FOREIGN, 0);
    int result = interface->impl->device_release_crop(user_context, buf);
    buf->device = 0;
    interface->impl->release_module();
    buf->device_interface = NULL;
    return result;
}

static bool shim_or_none(const struct halide_device_interface_t *device_interface) {
    return device_interface == NULL || shim_owns_interface(device_interface);
}

int halide_buffer_copy(void *user_context, struct halide_buffer_t *src,
                       const struct halide_device_interface_t *dst_device_interface,
                       struct halide_buffer_t *dst) {
    if (src == NULL || dst == NULL) {
        return halide_error_buffer_is_null(user_context, "halide_buffer_copy");
    }
    if (shim_or_none(interface_of(src)) && shim_or_none(dst_device_interface) &&
        shim_or_none(interface_of(dst))) {
        /* In C where it can be: between host memories, or with a served allocation on
         * either side. */
        int result = dst_device_interface == NULL ? shim_host_copy(src, dst) : SHIM_NOT_SERVED;
        const struct halide_device_interface_t *from = interface_of(src);
        if (result == SHIM_NOT_SERVED) {
            result = shim_served_buffer_copy(
                user_context, src, from, from == NULL ? -1 : shim_backend_of(from),
                dst_device_interface,
                dst_device_interface == NULL ? -1 : shim_backend_of(dst_device_interface), dst);
        }
        if (result != SHIM_NOT_SERVED) {
            return result;
        }
        return shim_py_buffer_copy(user_context, src, dst_device_interface, dst);
    }
    shim_decided(SHIM_FN_BUFFER_COPY, SHIM_OUTCOME_FOREIGN, 0);
    return halide_buffer_copy_already_locked(user_context, src, dst_device_interface, dst);
}

/* --- the shim's device interfaces ----------------------------------------------------------
 *
 * One halide_device_interface_t per backend, for the process. As in Halide, the public members
 * point to the generic entry points above, and each interface's impl table reaches the backend.
 * Here every impl entry calls the Python runtime core (shim/core/runtime.py), which locks the
 * allocation family, re-checks the flags, has the backend move the bytes and updates the flags;
 * the same callbacks serve every backend, told apart by the interface they are passed. */
static const struct halide_device_interface_impl_t impls[SHIM_BACKEND_COUNT];

static void no_module_refcount(void) {
    /* Halide uses these to reference-count JIT modules; AOT code needs nothing. */
}

static int compute_capability(int backend, void *user_context, int *major, int *minor);

#define INTERFACE(BACKEND, CAPABILITY)                                                          \
    {                                                                                           \
        halide_device_malloc, halide_device_free, halide_device_sync, halide_device_release,   \
            halide_copy_to_host, halide_copy_to_device, halide_device_and_host_malloc,          \
            halide_device_and_host_free, halide_buffer_copy, halide_device_crop,                \
            halide_device_slice, halide_device_release_crop, halide_device_wrap_native,         \
            halide_device_detach_native, CAPABILITY, &impls[BACKEND],                           \
    }

static int host_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_HOST, uc, major, minor);
}
static int opencl_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_OPENCL, uc, major, minor);
}
static int cuda_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_CUDA, uc, major, minor);
}
static int proxy_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_PROXY, uc, major, minor);
}
static int opencl_image_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_OPENCL_IMAGE, uc, major, minor);
}

static int vulkan_compute_capability(void *uc, int *major, int *minor) {
    return compute_capability(SHIM_BACKEND_VULKAN, uc, major, minor);
}

static const struct halide_device_interface_t interfaces[SHIM_BACKEND_COUNT] = {
    [SHIM_BACKEND_HOST] = INTERFACE(SHIM_BACKEND_HOST, host_compute_capability),
    [SHIM_BACKEND_OPENCL] = INTERFACE(SHIM_BACKEND_OPENCL, opencl_compute_capability),
    [SHIM_BACKEND_CUDA] = INTERFACE(SHIM_BACKEND_CUDA, cuda_compute_capability),
    [SHIM_BACKEND_PROXY] = INTERFACE(SHIM_BACKEND_PROXY, proxy_compute_capability),
    [SHIM_BACKEND_OPENCL_IMAGE] = INTERFACE(SHIM_BACKEND_OPENCL_IMAGE,
                                            opencl_image_compute_capability),
    [SHIM_BACKEND_VULKAN] = INTERFACE(SHIM_BACKEND_VULKAN, vulkan_compute_capability),
};

const struct halide_device_interface_t *shim_backend_interface(int backend) {
    if (backend < 0 || backend >= SHIM_BACKEND_COUNT) {
        return NULL;
    }
    return &interfaces[backend];
}

int shim_backend_of(const struct halide_device_interface_t *device_interface) {
    if (device_interface < &interfaces[0] || device_interface >= &interfaces[SHIM_BACKEND_COUNT]) {
        return -1;
    }
    return (int)(device_interface - &interfaces[0]);
}

/* A backend's answer, once it has given one: it keeps its device for the life of the process
 * (shim/backends/devices.py), forked children included, so the answer never changes. Asked
 * again while profiling, so that a profile sees each call. */
static struct {
    int major, minor;
    bool known; /* stored last, with release order */
} capabilities[SHIM_BACKEND_COUNT];

static int compute_capability(int backend, void *user_context, int *major, int *minor) {
    if (!shim_profile_on() && __atomic_load_n(&capabilities[backend].known, __ATOMIC_ACQUIRE)) {
        *major = __atomic_load_n(&capabilities[backend].major, __ATOMIC_RELAXED);
        *minor = __atomic_load_n(&capabilities[backend].minor, __ATOMIC_RELAXED);
        return halide_error_code_success;
    }
    int result = shim_py_compute_capability(user_context, major, minor, &interfaces[backend]);
    if (result == halide_error_code_success) {
        __atomic_store_n(&capabilities[backend].major, *major, __ATOMIC_RELAXED);
        __atomic_store_n(&capabilities[backend].minor, *minor, __ATOMIC_RELAXED);
        __atomic_store_n(&capabilities[backend].known, true, __ATOMIC_RELEASE);
    }
    return result;
}

/* The impl entries. Those whose arguments carry no interface (malloc, release, a global sync)
 * need one function per backend; the macro writes them. */
#define IMPL_FUNCTIONS(NAME, BACKEND)                                                            \
    static int NAME##_device_malloc(void *uc, struct halide_buffer_t *buf) {                     \
        return shim_py_device_malloc(uc, buf, &interfaces[BACKEND]);                             \
    }                                                                                            \
    static int NAME##_device_free(void *uc, struct halide_buffer_t *buf) {                       \
        return shim_py_device_free(uc, buf, &interfaces[BACKEND]);                               \
    }                                                                                            \
    static int NAME##_device_sync(void *uc, struct halide_buffer_t *buf) {                       \
        return shim_py_device_sync(uc, buf, &interfaces[BACKEND]);                               \
    }                                                                                            \
    static int NAME##_device_release(void *uc) {                                                 \
        return shim_py_device_release(uc, &interfaces[BACKEND]);                                 \
    }                                                                                            \
    static int NAME##_copy_to_host(void *uc, struct halide_buffer_t *buf) {                      \
        return shim_py_copy_to_host(uc, buf, &interfaces[BACKEND]);                              \
    }                                                                                            \
    static int NAME##_copy_to_device(void *uc, struct halide_buffer_t *buf) {                    \
        return shim_py_copy_to_device(uc, buf, &interfaces[BACKEND]);                            \
    }                                                                                            \
    static int NAME##_device_and_host_malloc(void *uc, struct halide_buffer_t *buf) {            \
        return shim_py_device_and_host_malloc(uc, buf, &interfaces[BACKEND]);                    \
    }                                                                                            \
    static int NAME##_device_and_host_free(void *uc, struct halide_buffer_t *buf) {              \
        return shim_py_device_and_host_free(uc, buf, &interfaces[BACKEND]);                      \
    }                                                                                            \
    static int NAME##_device_crop(void *uc, const struct halide_buffer_t *src,                   \
                                  struct halide_buffer_t *dst) {                                 \
        return shim_py_device_crop(uc, src, dst, &interfaces[BACKEND]);                          \
    }                                                                                            \
    static int NAME##_device_slice(void *uc, const struct halide_buffer_t *src, int dim,         \
                                   int pos, struct halide_buffer_t *dst) {                       \
        return shim_py_device_slice(uc, src, dim, pos, dst, &interfaces[BACKEND]);               \
    }                                                                                            \
    static int NAME##_device_release_crop(void *uc, struct halide_buffer_t *buf) {               \
        return shim_py_device_release_crop(uc, buf, &interfaces[BACKEND]);                       \
    }                                                                                            \
    static int NAME##_wrap_native(void *uc, struct halide_buffer_t *buf, uint64_t handle) {      \
        return shim_py_wrap_native(uc, buf, handle, &interfaces[BACKEND]);                       \
    }                                                                                            \
    static int NAME##_detach_native(void *uc, struct halide_buffer_t *buf) {                     \
        return shim_py_detach_native(uc, buf, &interfaces[BACKEND]);                             \
    }

#define IMPL_TABLE(NAME)                                                                        \
    {                                                                                           \
        no_module_refcount, no_module_refcount, NAME##_device_malloc, NAME##_device_free,       \
            NAME##_device_sync, NAME##_device_release, NAME##_copy_to_host,                     \
            NAME##_copy_to_device, NAME##_device_and_host_malloc, NAME##_device_and_host_free,  \
            shim_py_buffer_copy, NAME##_device_crop, NAME##_device_slice,                       \
            NAME##_device_release_crop, NAME##_wrap_native, NAME##_detach_native,               \
    }

IMPL_FUNCTIONS(host, SHIM_BACKEND_HOST)
IMPL_FUNCTIONS(opencl, SHIM_BACKEND_OPENCL)
IMPL_FUNCTIONS(cuda, SHIM_BACKEND_CUDA)
IMPL_FUNCTIONS(proxy, SHIM_BACKEND_PROXY)
IMPL_FUNCTIONS(opencl_image, SHIM_BACKEND_OPENCL_IMAGE)
IMPL_FUNCTIONS(vulkan, SHIM_BACKEND_VULKAN)

static const struct halide_device_interface_impl_t impls[SHIM_BACKEND_COUNT] = {
    [SHIM_BACKEND_HOST] = IMPL_TABLE(host),
    [SHIM_BACKEND_OPENCL] = IMPL_TABLE(opencl),
    [SHIM_BACKEND_CUDA] = IMPL_TABLE(cuda),
    [SHIM_BACKEND_PROXY] = IMPL_TABLE(proxy),
    [SHIM_BACKEND_OPENCL_IMAGE] = IMPL_TABLE(opencl_image),
    [SHIM_BACKEND_VULKAN] = IMPL_TABLE(vulkan),
};

void shim_buffer_set_device(struct halide_buffer_t *buf, uint64_t device,
                            const struct halide_device_interface_t *device_interface) {
    shim_device_store(buf, device, device_interface);
}
