/* Halide's MemorySanitizer hooks (halide_msan_*), which code built with the msan target feature
 * calls: the pipeline annotates memory it wrote as initialized and checks the buffers it reads.
 *
 * Each hook does what Halide's msan runtime (src/runtime/msan.cpp) does, with one difference
 * that makes the shim a drop-in where Halide's runtime is linked into the program:
 *
 * - A library that defines a memory-level hook itself (halide_msan_annotate_memory_is_initialized,
 *   halide_msan_check_memory_is_initialized) has its own definition called for its code, as the
 *   static linker would have bound it against Halide's weak one. The shim's definitions come
 *   first in the process's symbol scope, so the pipeline's call arrives here; the library is the
 *   one holding the caller's code (dladdr of the return address), and its definition is what
 *   dlsym finds in it. The buffer-level hooks walk the buffer as Halide's do and call the
 *   memory-level hook of the library that called them. Halide's own msan test works this way:
 *   it counts the calls its definitions see.
 * - Otherwise, in a process with MemorySanitizer's runtime (__msan_unpoison and friends found by
 *   dlsym), the hooks tell it, as Halide's do. Without one there is nothing to tell, and they do
 *   nothing: Halide's msan runtime would not even link there.
 *
 * Pipelines built with the msan feature call them; Halide's runtime in the shim calls the
 * annotation for the text of every message it prints, so what it finds is kept (below).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"

typedef int (*annotate_fn)(void *, const void *, uint64_t);
typedef int (*check_fn)(void *, const void *, uint64_t, const char *);

/* What the hooks call for the code of one library: its own memory-level hooks, else
 * MemorySanitizer's runtime (NULLs where the process has none). */
typedef struct {
    annotate_fn annotate;
    check_fn check;
    void (*unpoison)(const volatile void *, size_t);
    long (*test_shadow)(const volatile void *, size_t);
    void (*check_mem)(const volatile void *, size_t);
} library_hooks;

/* Whether ``symbol`` is defined strongly, in the library ``path`` if not NULL: a program's own
 * definition, where every copy of Halide's runtime (bundled into a pipeline, or into one of
 * Halide's autoscheduler plugins) defines its hooks weak. */
static bool own(void *symbol, const char *path) {
    Dl_info where;
    const ElfW(Sym) *entry = NULL;
    return symbol != NULL && dladdr1(symbol, &where, (void **)&entry, RTLD_DL_SYMENT) &&
           entry != NULL && where.dli_saddr == symbol && ELF64_ST_BIND(entry->st_info) == STB_GLOBAL &&
           (path == NULL || (where.dli_fname != NULL && strcmp(where.dli_fname, path) == 0));
}

/* ``name`` as ``library`` (at ``path``) defines it itself (see own), or NULL; never ``ours``.
 * A library whose definition is found stays loaded for the life of the process: the snapshot
 * below, or a hook call on another thread, may call into it at any time, so unloading it (a
 * dlclose by whoever opened it) must leave its code where it is. RTLD_NODELETE, given to a
 * library already loaded (RTLD_NOLOAD), marks it so; the reference that takes goes again at
 * once, the mark stays. */
static void *own_definition(void *library, const char *path, const char *name, void *ours) {
    void *theirs = dlsym(library, name); /* (the library first, then what it depends on) */
    if (theirs == ours || !own(theirs, path)) {
        return NULL;
    }
    void *kept = dlopen(path, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    if (kept == NULL) {
        return NULL; /* (unloaded meanwhile: nothing of it may be called) */
    }
    dlclose(kept);
    return theirs;
}

/* The loaded libraries' paths, in load order (the main program left out: its definitions would
 * have come before ours). Copied out of dl_iterate_phdr's callback, which holds the loader's
 * lock: opening a library in there waits, in lock order, for a thread's dlopen that waits for it. */
typedef struct {
    char **paths;
    int count, capacity;
} library_paths;

static int add_path(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    library_paths *list = data;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == 0) {
        return 0;
    }
    if (list->count == list->capacity) {
        int capacity = list->capacity ? 2 * list->capacity : 64;
        char **paths = realloc(list->paths, capacity * sizeof *paths);
        if (paths == NULL) {
            return 1;
        }
        list->paths = paths;
        list->capacity = capacity;
    }
    char *path = strdup(info->dlpi_name);
    if (path != NULL) {
        list->paths[list->count++] = path;
    }
    return 0;
}

/* The first loaded library's own definition of each memory-level hook. */
static void defined_elsewhere(library_hooks *found) {
    library_paths list = {NULL, 0, 0};
    dl_iterate_phdr(add_path, &list);
    for (int i = 0; i < list.count; i++) {
        void *library = dlopen(list.paths[i], RTLD_LAZY | RTLD_NOLOAD);
        if (library != NULL) {
            if (found->annotate == NULL) {
                found->annotate = (annotate_fn)own_definition(
                    library, list.paths[i], "halide_msan_annotate_memory_is_initialized",
                    (void *)halide_msan_annotate_memory_is_initialized);
            }
            if (found->check == NULL) {
                found->check = (check_fn)own_definition(
                    library, list.paths[i], "halide_msan_check_memory_is_initialized",
                    (void *)halide_msan_check_memory_is_initialized);
            }
            dlclose(library);
        }
        free(list.paths[i]);
    }
    free(list.paths);
}

/* The hooks for code in the library ``info`` names; ``shim``: the library is the shim's own
 * (Halide's runtime in it annotates the text of every message it prints, on behalf of whichever
 * pipeline it serves: a definition of another loaded library, the first in load order). */
static library_hooks look_up(const Dl_info *info, bool shim) {
    library_hooks found = {NULL, NULL, NULL, NULL, NULL};
    void *annotate = (void *)halide_msan_annotate_memory_is_initialized;
    void *check = (void *)halide_msan_check_memory_is_initialized;
    if (shim) {
        defined_elsewhere(&found);
    } else if (info != NULL) {
        void *library = dlopen(info->dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (library != NULL) {
            found.annotate = (annotate_fn)own_definition(
                library, info->dli_fname, "halide_msan_annotate_memory_is_initialized", annotate);
            found.check = (check_fn)own_definition(
                library, info->dli_fname, "halide_msan_check_memory_is_initialized", check);
            dlclose(library);
        }
    }
    found.unpoison = (void (*)(const volatile void *, size_t))dlsym(RTLD_DEFAULT, "__msan_unpoison");
    found.test_shadow = (long (*)(const volatile void *, size_t))dlsym(RTLD_DEFAULT, "__msan_test_shadow");
    found.check_mem = (void (*)(const volatile void *, size_t))dlsym(RTLD_DEFAULT,
                                                                     "__msan_check_mem_is_initialized");
    return found;
}

/* --- which hooks ---------------------------------------------------------------------------
 * Halide's runtime in the shim calls the annotation for the text of every message it prints (a
 * pipeline built with trace_all and tracing to stderr prints millions), so what it finds for
 * the shim's own code is looked up once and kept: a snapshot, read without a lock or a call
 * into the loader, so that a child forked while another thread looked something up is never
 * stuck on a lock that thread held. shim.load takes a new snapshot after it loads a library
 * (shim_msan_libraries_changed); code loaded otherwise (ctypes) is seen if loaded before the
 * shim's runtime first prints, as Halide's msan test's is. A library whose hooks were found is
 * never unloaded (own_definition): the snapshot calls into it. Calls from a pipeline's own code
 * (msan builds only) look their library up each time. */

/* The shim's code: [shim_start, shim_end), found once (the shim's library stays loaded). */
static uintptr_t shim_start, shim_end;
static library_hooks *_Atomic shim_snapshot;
static pthread_once_t shim_found = PTHREAD_ONCE_INIT;

static int find_shim(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    uintptr_t ours = (uintptr_t)halide_msan_annotate_memory_is_initialized;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + segment->p_vaddr, end = start + segment->p_memsz;
        if (segment->p_type == PT_LOAD && ours >= start && ours < end) {
            shim_start = start;
            shim_end = end;
            return 1;
        }
    }
    return 0;
}

static void find_shim_once(void) {
    dl_iterate_phdr(find_shim, NULL);
}

static void take_snapshot(void) {
    library_hooks *fresh = malloc(sizeof *fresh);
    if (fresh != NULL) {
        *fresh = look_up(NULL, true);
    }
    /* (the snapshot it replaces is not freed: another thread may be reading it) */
    __atomic_store_n(&shim_snapshot, fresh, __ATOMIC_RELEASE);
}

/* Taken again at the next hook call, not here: most libraries loaded never print. */
void shim_msan_libraries_changed(void) {
    __atomic_store_n(&shim_snapshot, NULL, __ATOMIC_RELEASE);
}

/* The hooks for the code at ``caller``. */
static library_hooks hooks_for(const void *caller) {
    pthread_once(&shim_found, find_shim_once);
    if ((uintptr_t)caller >= shim_start && (uintptr_t)caller < shim_end) {
        library_hooks *snapshot = __atomic_load_n(&shim_snapshot, __ATOMIC_ACQUIRE);
        if (snapshot == NULL) {
            take_snapshot(); /* (two threads at once: the same snapshot, twice) */
            snapshot = __atomic_load_n(&shim_snapshot, __ATOMIC_ACQUIRE);
        }
        if (snapshot != NULL) {
            return *snapshot;
        }
        return look_up(NULL, true); /* (no memory for a snapshot) */
    }
    Dl_info info;
    bool known = caller != NULL && dladdr(caller, &info) && info.dli_fname != NULL &&
                 info.dli_fname[0] != 0; /* (not the main program: its own come first anyway) */
    return look_up(known ? &info : NULL, false);
}

static int annotate_memory(library_hooks hooks, void *user_context, const void *ptr, uint64_t len) {
    if (hooks.annotate != NULL) {
        return hooks.annotate(user_context, ptr, len);
    }
    if (hooks.unpoison != NULL) {
        hooks.unpoison(ptr, (size_t)len);
    }
    return 0;
}

static int check_memory(library_hooks hooks, void *user_context, const void *ptr, uint64_t len,
                        const char *name) {
    if (hooks.check != NULL) {
        return hooks.check(user_context, ptr, len, name);
    }
    if (hooks.test_shadow != NULL && hooks.check_mem != NULL) {
        long offset = hooks.test_shadow(ptr, (size_t)len);
        if (offset >= 0) {
            char text[256];
            snprintf(text, sizeof text, "MSAN failure detected for %s @ %p + %ld\n",
                     name != NULL ? name : "", ptr, offset);
            halide_print(user_context, text);
            hooks.check_mem(ptr, (size_t)len);
        }
    }
    return 0;
}

int halide_msan_annotate_memory_is_initialized(void *user_context, const void *ptr, uint64_t len) {
    return annotate_memory(hooks_for(__builtin_return_address(0)), user_context, ptr, len);
}

int halide_msan_check_memory_is_initialized(void *user_context, const void *ptr, uint64_t len,
                                            const char *name) {
    return check_memory(hooks_for(__builtin_return_address(0)), user_context, ptr, len, name);
}

/* --- whole buffers ----------------------------------------------------------------------- */

/* Halide's walk of a buffer's host memory (device_buffer_utils.h, make_buffer_copy, as the msan
 * runtime uses it): the dimensions sorted by stride, those of stride 0 last; the innermost ones
 * that are dense folded into one chunk; the chunks visited outermost dimension first, skipping
 * dimensions of extent 1. The visitor sees each chunk's address and size, in that order. */
#define MAX_WALK_DIMS 16

typedef struct {
    library_hooks hooks;
    void *user_context;
    const char *name; /* NULL: annotate; else check, with this name */
} visitor;

static void visit(const visitor *v, const uint8_t *chunk, uint64_t size) {
    if (v->name == NULL) {
        (void)annotate_memory(v->hooks, v->user_context, chunk, size); /* (errors ignored, as Halide) */
    } else {
        (void)check_memory(v->hooks, v->user_context, chunk, size, v->name);
    }
}

static void walk(const visitor *v, const uint8_t *at, uint64_t chunk, const int64_t *extent,
                 const int64_t *stride, int d) {
    while (d >= 0 && extent[d] == 1) {
        d--;
    }
    if (d < 0) {
        visit(v, at, chunk);
        return;
    }
    for (int64_t i = 0; i < extent[d]; i++) {
        walk(v, at + i * stride[d], chunk, extent, stride, d - 1);
    }
}

static void walk_buffer(const visitor *v, const halide_buffer_t *b) {
    int64_t element = (b->type.bits + 7) / 8;
    if (b->host == NULL || element == 0 || b->dimensions < 0 || b->dimensions > MAX_WALK_DIMS) {
        return; /* (Halide's walk is empty for these too) */
    }
    int64_t extent[MAX_WALK_DIMS], stride[MAX_WALK_DIMS];
    int n = 0;
    for (int i = 0; i < b->dimensions; i++, n++) {
        int64_t s = (int64_t)b->dim[i].stride * element, e = b->dim[i].extent;
        if (e <= 0) {
            return; /* no elements */
        }
        /* Sorted by stride as Halide sorts (unsigned: a negative stride sorts as a large one; a
         * stride of 0 goes after those before it, since it cannot be folded). */
        int insert = 0;
        while (insert < n && !(s != 0 && (uint64_t)s < (uint64_t)stride[insert])) {
            insert++;
        }
        for (int j = n; j > insert; j--) {
            extent[j] = extent[j - 1];
            stride[j] = stride[j - 1];
        }
        extent[insert] = e;
        stride[insert] = s;
    }
    for (int i = n; i < MAX_WALK_DIMS; i++) {
        extent[i] = 1;
        stride[i] = 0;
    }
    uint64_t chunk = (uint64_t)element;
    while (n > 0 && stride[0] == (int64_t)chunk) {
        chunk *= (uint64_t)extent[0];
        for (int j = 1; j < MAX_WALK_DIMS; j++) {
            extent[j - 1] = extent[j];
            stride[j - 1] = stride[j];
        }
        extent[MAX_WALK_DIMS - 1] = 1;
        stride[MAX_WALK_DIMS - 1] = 0;
        n--;
    }
    walk(v, b->host, chunk, extent, stride, MAX_WALK_DIMS - 1);
}

static int annotate_buffer(library_hooks hooks, void *user_context, halide_buffer_t *b) {
    if (b == NULL || (shim_flags_load(b) & halide_buffer_flag_device_dirty)) {
        return 0; /* its host memory is not what holds the values */
    }
    visitor v = {hooks, user_context, NULL};
    walk_buffer(&v, b);
    return 0;
}

int halide_msan_annotate_buffer_is_initialized(void *user_context, halide_buffer_t *b) {
    return annotate_buffer(hooks_for(__builtin_return_address(0)), user_context, b);
}

void halide_msan_annotate_buffer_is_initialized_as_destructor(void *user_context, void *b) {
    (void)annotate_buffer(hooks_for(__builtin_return_address(0)), user_context, (halide_buffer_t *)b);
}

int halide_msan_check_buffer_is_initialized(void *user_context, halide_buffer_t *b,
                                            const char *buf_name) {
    if (b == NULL) {
        return 0;
    }
    library_hooks hooks = hooks_for(__builtin_return_address(0));
    (void)check_memory(hooks, user_context, b, sizeof(*b), buf_name);
    (void)check_memory(hooks, user_context, b->dim, b->dimensions * sizeof(b->dim[0]), buf_name);
    if (shim_flags_load(b) & halide_buffer_flag_device_dirty) {
        return 0;
    }
    visitor v = {hooks, user_context, buf_name};
    walk_buffer(&v, b);
    return 0;
}
