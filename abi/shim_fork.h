/* Halide's runtime internals that a fork resets in the child (native_stubs/forks/fork.c). See
 * abi/shim_calls.h for what every abi/shim_*.h header is.
 *
 * These objects of Halide's host runtime are in no header; the native library finds them by
 * their symbols and their sizes in its dynamic symbol table. tests/test_abi.py checks the
 * layouts fork.c assumes through this. */
enum shim_fork_object {
    SHIM_FORK_PARKING_LOT = 0,     /* Halide::Runtime::Internal::Synchronization::table
                                      (halide_mutex/cond waiters) */
    SHIM_FORK_TRACE_FILE_LOCK = 1, /* ...::halide_trace_file_lock (a spin lock, one byte) */
    SHIM_FORK_TRACE_BUFFER = 2,    /* ...::halide_trace_buffer (a pointer to the buffer) */
    SHIM_FORK_MEMOIZATION_LOCK = 3, /* ...::memoization_lock (a halide_mutex), and the cache: */
    SHIM_FORK_CACHE_ENTRIES = 4,    /* ...::cache_entries (its hash table of entries) */
    SHIM_FORK_MOST_RECENTLY_USED = 5,  /* ...::most_recently_used, */
    SHIM_FORK_LEAST_RECENTLY_USED = 6, /* ...::least_recently_used (its LRU list's ends) */
    SHIM_FORK_CACHE_SIZE = 7,       /* ...::current_cache_size (bytes it holds) */
    SHIM_FORK_OBJECTS = 8
};

/* The object's address, and its size in `*size`; NULL and 0 where the library did not find
 * it (a child then keeps that one as the fork left it). */
void *shim_fork_object(int which, size_t *size);

/* Where the library keeps the id of the process it runs in (a pid_t, an int on Linux), which its
 * fork handler renews in a child before anything else runs there, whether os.fork or fork()
 * called from C forked it: read with no system call (shim/memory/families.py's forking). */
const int *shim_process_id(void);
