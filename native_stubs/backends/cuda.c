/* Halide's CUDA entry points, served by the shim's CUDA backend (shim/backends/cuda.py).
 *
 * Python (cuda-python) owns the device's primary context, the allocations and the loaded
 * modules; launches stay in C, through the driver library Python found. A device handle is the
 * raw CUdeviceptr, as in Halide; crops are pointer arithmetic.
 *
 * One context story, Halide's (src/runtime/cuda.cpp, class Context): every use of the driver,
 * from C or from Python (shim_cuda_enter/shim_cuda_leave), acquires the context through
 * halide_cuda_acquire_context, pushes it for the duration and pops it after, then releases it.
 * The caller's own current context is therefore left as it was, and an application that sets
 * its own acquire/release/get_stream hooks (halide_set_cuda_*) is served by them: its context
 * for every driver call, its stream for every launch and copy.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "devices/device_generic.h"
#include "forks/fork.h"
#include "profiling/profile.h"

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

static struct {
    CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
    CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUcontext context; /* the backend's context, once Python has started it */
    pid_t process;     /* where it was bound (forks/fork.c) */
} cu;

int shim_cuda_bind(const char *driver, void *context) {
    void *library = dlopen(driver, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) {
        library = dlopen(driver, RTLD_NOW);
    }
    if (library == NULL) {
        return -1;
    }
    cu.launch_kernel = dlsym(library, "cuLaunchKernel");
    cu.module_get_function = dlsym(library, "cuModuleGetFunction");
    cu.ctx_push = dlsym(library, "cuCtxPushCurrent_v2");
    cu.ctx_pop = dlsym(library, "cuCtxPopCurrent_v2");
    if (!cu.launch_kernel || !cu.module_get_function || !cu.ctx_push || !cu.ctx_pop) {
        return -2;
    }
    cu.process = shim_bound_process();
    __atomic_store_n(&cu.context, context, __ATOMIC_RELEASE);
    return 0;
}

/* --- the context and stream hooks (Halide's defaults, and halide_set_cuda_*) -------------- */

static int default_acquire(void *user_context, void **ctx, bool create) {
    if (__atomic_load_n(&cu.context, __ATOMIC_ACQUIRE) == NULL && create) {
        int result = shim_py_device_start(user_context, shim_backend_interface(SHIM_BACKEND_CUDA));
        if (result) {
            return result;
        }
    }
    *ctx = __atomic_load_n(&cu.context, __ATOMIC_ACQUIRE);
    return halide_error_code_success;
}

static int default_release(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}

/* The stream of the pipeline call being served (shim.stream, carried by its call context, so
 * that Halide's worker threads use it too), else the legacy default stream. */
static int default_stream(void *user_context, void *ctx, void **stream) {
    (void)user_context;
    (void)ctx;
    shim_call *call = shim_current_call();
    *stream = call ? shim_call_stream(call) : NULL;
    return halide_error_code_success;
}

static halide_cuda_acquire_context_t acquire_hook = default_acquire;
static halide_cuda_release_context_t release_hook = default_release;
static halide_cuda_get_stream_t stream_hook = default_stream;

halide_cuda_acquire_context_t halide_set_cuda_acquire_context(halide_cuda_acquire_context_t hook) {
    return __atomic_exchange_n(&acquire_hook, hook ? hook : default_acquire, __ATOMIC_ACQ_REL);
}

halide_cuda_release_context_t halide_set_cuda_release_context(halide_cuda_release_context_t hook) {
    return __atomic_exchange_n(&release_hook, hook ? hook : default_release, __ATOMIC_ACQ_REL);
}

halide_cuda_get_stream_t halide_set_cuda_get_stream(halide_cuda_get_stream_t hook) {
    return __atomic_exchange_n(&stream_hook, hook ? hook : default_stream, __ATOMIC_ACQ_REL);
}

int halide_cuda_acquire_context(void *user_context, void **ctx, bool create) {
    int refused = shim_refuse_after_fork(user_context, cu.process, "CUDA");
    if (refused) {
        return refused;
    }
    return __atomic_load_n(&acquire_hook, __ATOMIC_ACQUIRE)(user_context, ctx, create);
}

int halide_cuda_release_context(void *user_context) {
    return __atomic_load_n(&release_hook, __ATOMIC_ACQUIRE)(user_context);
}

int halide_cuda_get_stream(void *user_context, void *ctx, void **stream) {
    return __atomic_load_n(&stream_hook, __ATOMIC_ACQUIRE)(user_context, ctx, stream);
}

int shim_cuda_enter(void *user_context, void **ctx) {
    int result = halide_cuda_acquire_context(user_context, ctx, true);
    if (result) {
        return result;
    }
    if (*ctx == NULL) {
        halide_cuda_release_context(user_context);
        halide_error(user_context, "CUDA: halide_cuda_acquire_context gave no context\n");
        return halide_error_code_gpu_device_error;
    }
    CUresult error = cu.ctx_push(*ctx);
    if (error != 0) {
        halide_cuda_release_context(user_context);
        char msg[96];
        snprintf(msg, sizeof msg, "CUDA: cuCtxPushCurrent failed: error %d\n", error);
        halide_error(user_context, msg);
        return halide_error_code_gpu_device_error;
    }
    return halide_error_code_success;
}

void shim_cuda_leave(void *user_context) {
    CUcontext popped;
    cu.ctx_pop(&popped);
    halide_cuda_release_context(user_context);
}

/* --- modules and launches ------------------------------------------------------------------ */

typedef struct function_entry {
    struct function_entry *next;
    char *name;
    CUfunction function; /* launching one function from many threads at once is safe */
} function_entry;

struct shim_cuda_module {
    CUmodule module;
    CUcontext context; /* the context it was loaded in, the only one it can launch in */
    function_entry *entries;
    pthread_mutex_t lock;
};

shim_cuda_module *shim_cuda_module_new(void *module, void *context) {
    shim_cuda_module *m = calloc(1, sizeof *m);
    if (m != NULL) {
        m->module = module;
        m->context = context;
        pthread_mutex_init(&m->lock, NULL);
    }
    return m;
}

static CUfunction function_for(shim_cuda_module *m, const char *name, CUresult *error) {
    *error = 0;
    for (function_entry *e = __atomic_load_n(&m->entries, __ATOMIC_ACQUIRE); e; e = e->next) {
        if (strcmp(e->name, name) == 0) {
            return e->function;
        }
    }
    CUfunction function = NULL;
    pthread_mutex_lock(&m->lock);
    *error = cu.module_get_function(&function, m->module, name);
    function_entry *entry = *error == 0 ? calloc(1, sizeof *entry) : NULL;
    if (entry != NULL) {
        entry->name = strdup(name);
        entry->function = function;
        entry->next = m->entries;
        __atomic_store_n(&m->entries, entry, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&m->lock);
    return function;
}

const struct halide_device_interface_t *halide_cuda_device_interface(void) {
    return shim_backend_interface(SHIM_BACKEND_CUDA);
}

int halide_cuda_initialize_kernels(void *user_context, void **state_ptr, const char *ptx,
                                   int size) {
    int refused = shim_refuse_after_fork(user_context, cu.process, "CUDA");
    if (refused) {
        return refused;
    }
    if (__atomic_load_n(state_ptr, __ATOMIC_ACQUIRE) != NULL) {
        return halide_error_code_success;
    }
    return shim_py_initialize_kernels(user_context, state_ptr, ptx, size,
                                      shim_backend_interface(SHIM_BACKEND_CUDA));
}

void halide_cuda_finalize_kernels(void *user_context, void *state_ptr) {
    (void)user_context;
    (void)state_ptr;
}

static int launch_in_context(SHIM_RUN_PARAMS, CUstream stream) {
    CUresult error;
    CUfunction function = function_for(state_ptr, entry_name, &error);
    if (function == NULL) {
        char msg[256];
        snprintf(msg, sizeof msg, "CUDA: cuModuleGetFunction(%s) failed: error %d\n", entry_name,
                 error);
        halide_error(user_context, msg);
        return halide_error_code_gpu_device_error;
    }
    int count = 0;
    while (arg_sizes[count] != 0) {
        count++;
    }
    void *params[count + 1];
    uint64_t device_pointers[count + 1];
    for (int i = 0; i < count; i++) {
        if (arg_is_buffer[i]) {
            device_pointers[i] = ((halide_buffer_t *)args[i])->device;
            params[i] = &device_pointers[i];
        } else {
            params[i] = args[i];
        }
    }
    error = cu.launch_kernel(function, blocksX, blocksY, blocksZ, threadsX, threadsY, threadsZ,
                             shared_mem_bytes, stream, params, NULL);
    if (error != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "CUDA: cuLaunchKernel(%s) failed: error %d\n", entry_name, error);
        halide_error(user_context, msg);
        return halide_error_code_gpu_device_error;
    }
    return halide_error_code_success;
}

static int launch(SHIM_RUN_PARAMS) {
    if (state_ptr == NULL) {
        halide_error(user_context, "CUDA: kernel launched before its module was initialized\n");
        return halide_error_code_gpu_device_error;
    }
    CUcontext context;
    int result = shim_cuda_enter(user_context, &context);
    if (result) {
        return result;
    }
    CUstream stream = NULL;
    if (context != ((shim_cuda_module *)state_ptr)->context) {
        /* Halide keeps one module per pipeline and context; a pipeline's kernel state holds
         * one, so its kernels run in the context that loaded them. */
        halide_error(user_context, "CUDA: the pipeline's kernels were loaded in another CUDA "
                                   "context than the one halide_cuda_acquire_context gave now\n");
        result = halide_error_code_gpu_device_error;
    } else {
        result = halide_cuda_get_stream(user_context, context, &stream);
    }
    if (result == 0) {
        result = launch_in_context(SHIM_RUN_ARGS, stream);
    }
    shim_cuda_leave(user_context);
    return result;
}

int halide_cuda_run(SHIM_RUN_PARAMS) {
    int refused = shim_refuse_after_fork(user_context, cu.process, "CUDA");
    if (refused) {
        return refused;
    }
    if (shim_profile_on()) {
        shim_call *call = shim_current_call();
        return shim_profile_run(SHIM_BACKEND_CUDA, call ? shim_call_stream(call) : NULL, launch,
                                SHIM_RUN_ARGS);
    }
    return launch(SHIM_RUN_ARGS);
}

/* --- handles ------------------------------------------------------------------------------ */

int halide_cuda_wrap_device_ptr(void *user_context, struct halide_buffer_t *buf,
                                uint64_t device_ptr) {
    return halide_device_wrap_native(user_context, buf, device_ptr, halide_cuda_device_interface());
}

int halide_cuda_detach_device_ptr(void *user_context, struct halide_buffer_t *buf) {
    int result = shim_check_native_handle(user_context, buf, SHIM_BACKEND_CUDA,
                                          "halide_cuda_detach_device_ptr");
    if (result == SHIM_NO_NATIVE_HANDLE) {
        return halide_error_code_success; /* nothing attached: nothing to detach */
    }
    return result ? result : halide_device_detach_native(user_context, buf);
}

uintptr_t halide_cuda_get_device_ptr(void *user_context, struct halide_buffer_t *buf) {
    int result = shim_check_native_handle(user_context, buf, SHIM_BACKEND_CUDA,
                                          "halide_cuda_get_device_ptr");
    return result ? 0 : (uintptr_t)shim_device_load(buf);
}

/* As for OpenCL (see opencl.c): a bundled runtime's unload-time release finds nothing to do. */
int halide_cuda_device_release(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}

void halide_cuda_cleanup(void) {
}

int halide_cuda_release_unused_device_allocations(void *user_context) {
    return shim_py_release_unused_allocations(user_context, SHIM_BACKEND_CUDA);
}
