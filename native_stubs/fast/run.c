/* A pipeline's run in a call context, on buffers its backends can take.
 *
 * shim_call_run is a prepared call's whole per-run bookkeeping in one C call (abi/shim_calls.h):
 * the Python run of a prepared call (shim/calls/running.py) calls it, and so does the fast paths' run
 * here. It lives above the call contexts (calls/call_context.c), whose public API is all it
 * uses of them, because its check of the buffers asks the device interfaces
 * (devices/device_generic.c) which backend each buffer is on, and those report errors into
 * the call contexts.
 *
 * shim_fast_run and shim_fast_report are the run of both fast paths (fastcall.c, a plain call;
 * prepared_call.c, a prepared call's run), with the GIL released, in a call context of the
 * thread's own (see fast/run.h).
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "calls/call_context.h"
#include "calls/releases.h"
#include "calls/signals_held.h"
#include "fast/run.h"

int shim_call_run(shim_call *call, uint64_t id, void *stream, int (*argv_fn)(void **),
                  void **argv, struct halide_buffer_t **buffers, int count, unsigned backends) {
    for (int i = 0; i < count; i++) {
        const struct halide_device_interface_t *interface =
            __atomic_load_n(&buffers[i]->device_interface, __ATOMIC_ACQUIRE);
        int backend = interface ? shim_backend_of(interface) : -1;
        if (backend < 0 || (backends & (1u << backend))) {
            continue;
        }
        if (backend == SHIM_BACKEND_PROXY && backends != 0) {
            continue; /* a crop whose parent is not on a device yet: any device may take it */
        }
        /* A GPU pipeline would refuse the other interface; a CPU pipeline only minds data
         * that exists on the device alone. */
        if (backends != 0 || (shim_flags_load(buffers[i]) & halide_buffer_flag_device_dirty)) {
            return SHIM_CALL_NEEDS_PREPARATION;
        }
    }
    /* Each buffer's type as the pipeline's release spells a scalar element's (its generated
     * code compares all 32 bits): a Buffer may have gone to a pipeline of another release
     * last. (A Buffer in calls of two releases at once fails one type check: Runner.finish
     * says so.) */
    uint16_t lanes = shim_release_of((const void *)argv_fn)->scalar_lanes;
    for (int i = 0; i < count; i++) {
        __atomic_store_n(&buffers[i]->type.lanes, lanes, __ATOMIC_RELAXED);
    }
    shim_call_reset(call, id);
    shim_call_set_stream(call, stream);
    return shim_call_argv(call, argv_fn, argv);
}

/* After a run: the temporaries' results to host memory if it succeeded, then their device
 * memory freed, reported into `call` as the general path's Buffer methods report theirs. The
 * first failure, or 0. Served allocations (devices/served.c) make this all C on the backends
 * that serve; any other case goes through the Python core, as a pipeline's own calls do. */
static int finish_temporaries(shim_call *call, const shim_fast_temporaries *t, bool succeeded) {
    shim_call *previous = shim_call_enter(call);
    int failure = 0;
    for (int i = 0; succeeded && i < t->count; i++) {
        if (t->to_host[i]) {
            failure = halide_copy_to_host(NULL, t->buffers[i]);
            succeeded = failure == 0;
        }
    }
    for (int i = 0; i < t->count; i++) {
        int freed = halide_device_free(NULL, t->buffers[i]);
        if (failure == 0) {
            failure = freed;
        }
    }
    shim_call_leave(previous);
    return failure;
}

/* The thread's call context for fast runs, and whether a run is using it: a call made on this
 * thread meanwhile (from Python code a device callback of the pipeline runs, or a finalizer
 * the collector runs there) gets a context of its own, as the general path's would
 * (CallContext.begin), instead of resetting the one the outer call is reporting into. */
static __thread shim_call *thread_call;
static __thread bool thread_call_busy;

/* The context a fast run reports into, counted among the running calls (shim_calls_begin);
 * NULL at exit or without memory. Handed back with end_context. */
static shim_call *begin_context(bool *nested) {
    if (thread_call == NULL && (thread_call = shim_call_new(0)) == NULL) {
        return NULL;
    }
    *nested = thread_call_busy;
    shim_call *call = *nested ? shim_call_new(0) : thread_call;
    if (call == NULL) {
        return NULL;
    }
    if (!shim_calls_begin()) {
        if (*nested) {
            shim_call_free(call);
        }
        return NULL; /* the interpreter is exiting */
    }
    thread_call_busy = true;
    return call;
}

static void end_context(shim_call *call, bool nested) {
    if (nested) {
        shim_call_free(call);
    } else {
        thread_call_busy = false;
    }
}

/* The report of a run that failed or printed (see fast/run.h), NULL for one that did not. */
static PyObject *report_of(shim_call *call, int status, uint64_t id) {
    const char *printed = shim_call_prints(call);
    if (status == 0 && printed[0] == '\0') {
        return NULL;
    }
    PyObject *report = Py_BuildValue("(iyyKn)", status, shim_call_errors(call), printed,
                                     (unsigned long long)id,
                                     (Py_ssize_t)shim_call_prints_dropped(call));
    if (report == NULL) { /* no memory: the report says so once the uses are ended */
        PyErr_Clear();
        report = Py_NewRef(Py_None);
    }
    return report;
}

int shim_fast_query(int (*argv_fn)(void **), void **argv, int *status, PyObject **report) {
    *report = NULL;
    bool nested;
    shim_call *call = begin_context(&nested);
    if (call == NULL) {
        return SHIM_FAST_DECLINED;
    }
    uint64_t id = shim_next_call_id();
    shim_call_reset(call, id);
    shim_call_set_stream(call, shim_thread_stream());
    /* With the GIL held: a query takes microseconds, unless it initializes the pipeline's GPU
     * kernels (generated code does that first), which goes to Python anyway. */
    *status = shim_call_argv(call, argv_fn, argv);
    shim_calls_end();
    *report = report_of(call, *status, id);
    end_context(call, nested);
    return SHIM_FAST_RAN;
}

int shim_fast_run(int (*argv_fn)(void **), void **argv, halide_buffer_t **buffers, int count,
                  unsigned backends, const shim_fast_temporaries *temporaries, int *status,
                  PyObject **report) {
    *report = NULL;
    bool nested;
    shim_call *call = begin_context(&nested);
    if (call == NULL) {
        return SHIM_FAST_DECLINED;
    }
    uint64_t id = shim_next_call_id();
    void *stream = shim_thread_stream();
    Py_BEGIN_ALLOW_THREADS
    if (temporaries != NULL) {
        shim_call_set_replaced(call, temporaries->replaced, temporaries->replaced_count);
    }
    *status = shim_call_run(call, id, stream, argv_fn, argv, buffers, count, backends);
    if (temporaries != NULL && temporaries->count > 0 && *status != SHIM_CALL_NEEDS_PREPARATION) {
        int finished = finish_temporaries(call, temporaries, *status == 0);
        if (*status == 0) {
            *status = finished;
        }
    }
    shim_call_set_replaced(call, NULL, 0);
    Py_END_ALLOW_THREADS
    shim_calls_end();
    if (*status != SHIM_CALL_NEEDS_PREPARATION) {
        *report = report_of(call, *status, id);
    }
    end_context(call, nested);
    return SHIM_FAST_RAN;
}

int shim_fast_report(PyObject *finish, PyObject *report) {
    if (report == NULL) {
        return 0;
    }
    if (report == Py_None) {
        Py_DECREF(report);
        PyErr_NoMemory();
        return -1;
    }
    shim_signals_hold();
    PyObject *done = PyObject_Call(finish, report, NULL);
    shim_signals_release();
    Py_DECREF(report);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}
