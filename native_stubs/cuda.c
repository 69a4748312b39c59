/* Halide's CUDA entry points, served by the shim's CUDA backend (shim/backends/cuda.py).
 *
 * Python (cuda-python) owns the context (the device's primary context), the allocations and
 * the loaded modules; launches stay in C, through the driver library Python found, on the
 * stream of the calling pipeline (chosen per call) or the backend's default stream. A device
 * handle is the raw CUdeviceptr, as in Halide; crops are pointer arithmetic.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

static struct {
    CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
    CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*ctx_set_current)(CUcontext);
    CUcontext context;
    CUstream stream;
    pid_t process; /* where it was bound (fork.c) */
} cu;

static __thread CUcontext thread_context;

int shim_cuda_bind(const char *driver, void *context, void *stream) {
    void *library = dlopen(driver, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) {
        library = dlopen(driver, RTLD_NOW);
    }
    if (library == NULL) {
        return -1;
    }
    cu.launch_kernel = dlsym(library, "cuLaunchKernel");
    cu.module_get_function = dlsym(library, "cuModuleGetFunction");
    cu.ctx_set_current = dlsym(library, "cuCtxSetCurrent");
    if (!cu.launch_kernel || !cu.module_get_function || !cu.ctx_set_current) {
        return -2;
    }
    cu.process = shim_bound_process();
    cu.stream = stream;
    __atomic_store_n(&cu.context, context, __ATOMIC_RELEASE);
    return 0;
}

typedef struct function_entry {
    struct function_entry *next;
    char *name;
    CUfunction function; /* launching one function from many threads at once is safe */
} function_entry;

struct shim_cuda_module {
    CUmodule module;
    function_entry *entries;
    pthread_mutex_t lock;
};

shim_cuda_module *shim_cuda_module_new(void *module) {
    shim_cuda_module *m = calloc(1, sizeof *m);
    if (m != NULL) {
        m->module = module;
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
    return shim_py_cuda_initialize(user_context, state_ptr, ptx, size);
}

void halide_cuda_finalize_kernels(void *user_context, void *state_ptr) {
    (void)user_context;
    (void)state_ptr;
}

static CUstream stream_for_this_call(void) {
    shim_call *call = shim_current_call();
    void *stream = call ? shim_call_stream(call) : NULL;
    return stream ? stream : cu.stream;
}

static int launch(SHIM_RUN_PARAMS) {
    shim_cuda_module *module = state_ptr;
    CUcontext context = __atomic_load_n(&cu.context, __ATOMIC_ACQUIRE);
    if (module == NULL || context == NULL) {
        halide_error(user_context, "CUDA: kernel launched before its module was initialized\n");
        return halide_error_code_gpu_device_error;
    }
    if (thread_context != context) {
        /* Halide's worker threads start without a current context. */
        if (cu.ctx_set_current(context) != 0) {
            halide_error(user_context, "CUDA: cuCtxSetCurrent failed\n");
            return halide_error_code_gpu_device_error;
        }
        thread_context = context;
    }
    CUresult error;
    CUfunction function = function_for(module, entry_name, &error);
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
                             shared_mem_bytes, stream_for_this_call(), params, NULL);
    if (error != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "CUDA: cuLaunchKernel(%s) failed: error %d\n", entry_name, error);
        halide_error(user_context, msg);
        return halide_error_code_gpu_device_error;
    }
    return halide_error_code_success;
}

int halide_cuda_run(SHIM_RUN_PARAMS) {
    int refused = shim_refuse_after_fork(user_context, cu.process, "CUDA");
    if (refused) {
        return refused;
    }
    if (shim_profile_on()) {
        return shim_profile_run(SHIM_BACKEND_CUDA, stream_for_this_call(), launch, SHIM_RUN_ARGS);
    }
    return launch(SHIM_RUN_ARGS);
}

int halide_cuda_wrap_device_ptr(void *user_context, struct halide_buffer_t *buf,
                                uint64_t device_ptr) {
    return halide_device_wrap_native(user_context, buf, device_ptr, halide_cuda_device_interface());
}

int halide_cuda_detach_device_ptr(void *user_context, struct halide_buffer_t *buf) {
    return halide_device_detach_native(user_context, buf);
}

uintptr_t halide_cuda_get_device_ptr(void *user_context, struct halide_buffer_t *buf) {
    (void)user_context;
    return buf == NULL ? 0 : (uintptr_t)buf->device;
}

/* As for OpenCL (see opencl.c): a bundled runtime's unload-time release finds nothing to do. */
int halide_cuda_device_release(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}

void halide_cuda_cleanup(void) {
}

int halide_cuda_release_unused_device_allocations(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}

int halide_cuda_acquire_context(void *user_context, void **ctx, bool create) {
    int refused = shim_refuse_after_fork(user_context, cu.process, "CUDA");
    if (refused) {
        return refused;
    }
    if (__atomic_load_n(&cu.context, __ATOMIC_ACQUIRE) == NULL && create) {
        int result = shim_py_cuda_start(user_context);
        if (result) {
            return result;
        }
    }
    *ctx = cu.context;
    return halide_error_code_success;
}

int halide_cuda_release_context(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}

int halide_cuda_get_stream(void *user_context, void *ctx, void **stream) {
    (void)user_context;
    (void)ctx;
    *stream = stream_for_this_call();
    return halide_error_code_success;
}
