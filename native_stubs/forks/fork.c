/* Forks. A child process has only the thread that called fork; whatever the parent's other
 * threads were doing at that moment stays in its memory as they left it, and never goes on.
 * Everything the native library knows of fork is here, in one pthread_atfork registration, so
 * that forks made from C (an extern stage, a library) are covered as well as os.fork.
 *
 * Devices initialized before a fork: a child has a copy of its parent's driver objects (an
 * OpenCL queue, a CUDA context) but none of the driver's threads, and drivers do not support
 * that: a launch there waits forever. Each backend notes the process it was bound in, and
 * every entry point that would use the device refuses in any other.
 *
 * The host runtime (the shim's thread pool, and Halide's standalone runtime, linked into this
 * library; the runtime a pipeline carries binds to these same objects, since this library is
 * loaded first): a lock another thread held at the fork would be held for good in the child,
 * which hung in its first call of a pipeline needing it. So the child gets, as if freshly
 * loaded:
 * - the thread pool (calls/thread_pool.c), all but the number of threads asked for
 *   (halide_set_num_threads): its mutex, its jobs (other threads' parallel loops), its workers
 *   and sleepers are the parent's. The child's next parallel loop starts workers of its own;
 * - the parking lot's table (Synchronization::table: the buckets' word locks and the queues
 *   of threads waiting on any halide_mutex or halide_cond): every waiter in it was another
 *   thread. It is cleared before anything else of Halide's, so that nothing after it wakes a
 *   waiter that does not exist;
 * - the trace file's spin lock, and the header of the trace buffer (its shared/exclusive spin
 *   lock, cursor and overage): the events buffered but not yet written are the parent's, which
 *   writes them; the child writing them too would put them twice in the file;
 * - the profiler state's lock and sampling thread (the child's first profiled call starts
 *   one), and in its list of calls in flight only the forking thread's own: the others never
 *   end in the child, and their records, on other threads' stacks, may be reused. The same
 *   for the state serving Halide 22 libraries (profiling/halide_profiler.c);
 * - the memoization cache (memoize()'d Funcs' results), empty, all but its size limit: the
 *   entries stay in memory (an entry the forking thread's call is using is released as it
 *   ends), only the child's lookups no longer find them, since another thread may have been
 *   linking or evicting one.
 * None of those locks is taken before the fork instead, to hand the child a state no thread
 * was changing: a thread holding one may be waiting for the GIL, which a thread forking from
 * Python holds all through the fork (shim/profiling/halide_profiler.py reads the profiler state from
 * Python; a cache eviction frees a GPU entry through the backend, in Python). Nor need they be:
 * what the child keeps of what they guard is usable whatever the holder was doing (the queue
 * and the cache are emptied; the list of calls in flight is rebuilt from the forking thread's
 * own records; a pipeline's totals may miss part of a call of the parent's, which the child
 * never reports as its own).
 *
 * The native library's own counters (profiling/profile.c) and its registry of libraries
 * (calls/releases.c) are locked before the fork and let go on both sides after it: their holders
 * only add and link entries, and the child reads them.
 *
 * A fork from inside a task of a parallel loop or an async stage (an extern stage run there)
 * is not covered: the job's other tasks ran on the parent's workers, and the child would wait
 * for them. (With a pool of one thread the child used to finish such a loop alone; now its job
 * is emptied out of the queue with the others'. A child that execs at once is unaffected.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shim_native.h"
#include "calls/call_context.h"
#include "calls/releases.h"
#include "calls/thread_pool.h"
#include "forks/fork.h"
#include "profiling/halide_profiler.h"
#include "profiling/profile.h"
#include "profiling/tracing.h"

/* Halide's objects, by their symbols: no header declares them. Weak, so that a Halide without
 * one still loads (that one is then left as the fork left it; tests/test_abi.py fails). */
extern char halide_parking_lot[] __asm__("_ZN6Halide7Runtime8Internal15Synchronization5tableE")
    __attribute__((weak));
extern char halide_trace_file_lock[] __asm__("_ZN6Halide7Runtime8Internal22halide_trace_file_lockE")
    __attribute__((weak));
extern char halide_trace_buffer[] __asm__("_ZN6Halide7Runtime8Internal19halide_trace_bufferE")
    __attribute__((weak));
extern char halide_memoization_lock[] __asm__("_ZN6Halide7Runtime8Internal16memoization_lockE")
    __attribute__((weak));
extern char halide_cache_entries[] __asm__("_ZN6Halide7Runtime8Internal13cache_entriesE")
    __attribute__((weak));
extern char halide_most_recently_used[] __asm__("_ZN6Halide7Runtime8Internal18most_recently_usedE")
    __attribute__((weak));
extern char halide_least_recently_used[]
    __asm__("_ZN6Halide7Runtime8Internal19least_recently_usedE") __attribute__((weak));
extern char halide_current_cache_size[] __asm__("_ZN6Halide7Runtime8Internal18current_cache_sizeE")
    __attribute__((weak));

/* Halide 21's layout (src/runtime/tracing.cpp), checked by tests/test_abi.py. TraceBuffer, which halide_trace_buffer points to (once a trace file is open): a 32-bit
 * SharedExclusiveSpinLock, then `uint32_t cursor, overage`, then the bytes. */
enum { TRACE_BUFFER_HEADER = 3 * sizeof(uint32_t) };

static struct {
    void *address;
    size_t size;
} objects[SHIM_FORK_OBJECTS];

static pid_t current_process;

/* The size of the object at `address` in the dynamic symbol table (0: not found there). */
static size_t symbol_size(void *address) {
    Dl_info info;
    const ElfW(Sym) *symbol = NULL;
    if (address == NULL || !dladdr1(address, &info, (void **)&symbol, RTLD_DL_SYMENT) ||
        symbol == NULL || info.dli_saddr != address) {
        return 0;
    }
    return symbol->st_size;
}

static void find(enum shim_fork_object which, void *address, size_t least) {
    size_t size = symbol_size(address);
    if (size >= least) {
        objects[which].address = address;
        objects[which].size = size;
    }
}

void *shim_fork_object(int which, size_t *size) {
    if (which < 0 || which >= SHIM_FORK_OBJECTS) {
        *size = 0;
        return NULL;
    }
    *size = objects[which].size;
    return objects[which].address;
}

static void clear(enum shim_fork_object which, size_t from) {
    if (objects[which].address != NULL) {
        memset((char *)objects[which].address + from, 0, objects[which].size - from);
    }
}

/* [*low, *high): the calling thread's stack (false where it cannot be told). */
static bool own_stack(uintptr_t *low, uintptr_t *high) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) {
        return false;
    }
    void *base;
    size_t size;
    bool known = pthread_attr_getstack(&attr, &base, &size) == 0;
    pthread_attr_destroy(&attr);
    *low = (uintptr_t)base;
    *high = (uintptr_t)base + size;
    return known;
}

/* Halide keeps a call's record on its calling thread's stack: the forking thread's own calls
 * (it may be inside some, in an extern stage that forked) are the records on its stack. Each
 * unlinks itself as its call ends. */
static void keep_own_profiled_calls(struct halide_profiler_state *state) {
    uintptr_t low = 0, high = 0;
    if (state->instances != NULL && !own_stack(&low, &high)) {
        low = high = 0; /* none is known to be ours */
    }
    struct halide_profiler_instance_state **link = &state->instances;
    for (struct halide_profiler_instance_state *instance = state->instances, *next;
         instance != NULL; instance = next) {
        next = instance->next;
        if (low <= (uintptr_t)instance && (uintptr_t)instance < high) {
            *link = instance;
            instance->prev_next = link;
            link = &instance->next;
        }
    }
    *link = NULL;
}

static void before_fork(void) {
    shim_profile_lock_for_fork();
    shim_releases_lock_for_fork();
}

static void after_fork_in_parent(void) {
    shim_releases_unlock_after_fork();
    shim_profile_unlock_after_fork();
}

static void after_fork_in_child(void) {
    __atomic_store_n(&current_process, getpid(), __ATOMIC_RELAXED);
    shim_pool_after_fork_in_child();
    clear(SHIM_FORK_PARKING_LOT, 0);
    clear(SHIM_FORK_TRACE_FILE_LOCK, 0);
    if (objects[SHIM_FORK_TRACE_BUFFER].address != NULL) {
        void *buffer = *(void **)objects[SHIM_FORK_TRACE_BUFFER].address;
        if (buffer != NULL) {
            memset(buffer, 0, TRACE_BUFFER_HEADER);
        }
    }
    struct halide_profiler_state *state = shim_profiler_state(0);
    memset(&state->lock, 0, sizeof state->lock);
    state->sampling_thread = NULL;
    keep_own_profiled_calls(state);
    shim_profiler22_reset_in_child();
    keep_own_profiled_calls(shim_profiler_state(1));
    clear(SHIM_FORK_MEMOIZATION_LOCK, 0);
    clear(SHIM_FORK_CACHE_ENTRIES, 0);
    clear(SHIM_FORK_MOST_RECENTLY_USED, 0);
    clear(SHIM_FORK_LEAST_RECENTLY_USED, 0);
    clear(SHIM_FORK_CACHE_SIZE, 0);
    shim_releases_unlock_after_fork();
    shim_profile_unlock_after_fork();
    shim_calls_keep_own();
    shim_trace_forget_other_threads();
}

__attribute__((constructor)) static void watch_forks(void) {
    current_process = getpid();
    find(SHIM_FORK_PARKING_LOT, halide_parking_lot, 1);
    find(SHIM_FORK_TRACE_FILE_LOCK, halide_trace_file_lock, 1);
    find(SHIM_FORK_TRACE_BUFFER, halide_trace_buffer, sizeof(void *));
    find(SHIM_FORK_MEMOIZATION_LOCK, halide_memoization_lock, sizeof(struct halide_mutex));
    find(SHIM_FORK_CACHE_ENTRIES, halide_cache_entries, sizeof(void *));
    find(SHIM_FORK_MOST_RECENTLY_USED, halide_most_recently_used, sizeof(void *));
    find(SHIM_FORK_LEAST_RECENTLY_USED, halide_least_recently_used, sizeof(void *));
    find(SHIM_FORK_CACHE_SIZE, halide_current_cache_size, sizeof(int64_t));
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

const int *shim_process_id(void) {
    _Static_assert(sizeof(pid_t) == sizeof(int), "abi/shim_fork.h gives the pid as an int");
    return (const int *)&current_process;
}

pid_t shim_bound_process(void) {
    return __atomic_load_n(&current_process, __ATOMIC_RELAXED);
}

int shim_refuse_after_fork(void *user_context, pid_t bound, const char *api) {
    /* (0: the device is not initialized yet, in any process: its first use binds it here) */
    if (__builtin_expect(bound == __atomic_load_n(&current_process, __ATOMIC_RELAXED), 1) ||
        bound == 0) {
        return halide_error_code_success;
    }
    char message[160];
    snprintf(message, sizeof message,
             "%s: the device was initialized in the parent process; a forked child cannot "
             "use it\n", api);
    halide_error(user_context, message);
    return halide_error_code_gpu_device_error;
}
