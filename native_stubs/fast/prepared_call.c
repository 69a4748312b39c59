/* The run of a PreparedCall (shim/calls/pipeline.py) in C: the call's records in its buffers'
 * families (call_records.c), the pipeline run with the GIL released, the Buffers' read state.
 * The same steps as its Python run (PreparedCall._run_in_python), which takes every call this
 * declines before anything has run: profiled calls, calls at exit, buffers whose records
 * cannot be kept from C right now. PreparedRun is PreparedCall's base class: calling a
 * PreparedCall lands here with no Python frame in between.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "calls/call_context.h"
#include "calls/signals_held.h"
#include "profiling/profile.h"
#include "fast/call_records.h"
#include "fast/objects.h"
#include "fast/run.h"

enum { MAX_MEMBERS = 64 };

typedef struct {
    PyObject_HEAD
    int (*argv_fn)(void **); /* NULL: the PreparedCall always runs in Python */
    void **argv;
    halide_buffer_t **buffers;
    unsigned backends;
    bool host_write; /* a CPU pipeline: its outputs are written on the host */
    int count;
    shim_member members[MAX_MEMBERS];
    PyObject *results;  /* what a call returns */
    PyObject *finish;   /* finish(result, errors, prints, call id, prints dropped): raises */
    PyObject *end_call; /* runtime.end_call */
    bool made;          /* __init__ was called: never again (it may have failed halfway) */
} run_object;

static PyObject *s_run_in_python;

/* The run, or NotImplemented when nothing ran and the Python run must take the call. */
static PyObject *run_call(run_object *run) {
    if (shim_profile_on() || shim_calls_closed()) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    /* The members as this call records them: what a call records (the Use of each, its own in
     * a shared family) is the call's, as other threads may be running this PreparedCall
     * meanwhile. (Their buffers and records are borrowed from the run, which the caller holds.) */
    const int count = run->count;
    shim_member members[count > 0 ? count : 1];
    for (int i = 0; i < count; i++) {
        members[i] = run->members[i];
        members[i].shared_use = NULL;
    }
    PyObject *result = NULL;
    shim_signals_hold(); /* the call's records and run: see calls/signals_held.h */
    if (!shim_members_begin(members, count, run->end_call, run->host_write)) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    int status = 0;
    PyObject *report;
    int outcome = shim_fast_run(run->argv_fn, run->argv, run->buffers, count, run->backends,
                                NULL, &status, &report);
    bool ran = outcome == SHIM_FAST_RAN && status != SHIM_CALL_NEEDS_PREPARATION;
    if (ran) {
        shim_members_ran(members, count, run->host_write);
    }
    if (shim_members_end(members, count, run->end_call) < 0) {
        Py_XDECREF(report);
        goto done;
    }
    if (!ran) {
        result = Py_NewRef(Py_NotImplemented); /* the Python run prepares the buffers, then runs */
        goto done;
    }
    if (shim_fast_report(run->finish, report) < 0 ||
        shim_members_results(members, count) < 0) {
        goto done;
    }
    result = Py_NewRef(run->results);
done:
    for (int i = 0; i < count; i++) {
        Py_CLEAR(members[i].shared_use);
    }
    shim_signals_release();
    return result;
}

/* Calling a PreparedCall: the run here, else its Python run, _run_in_python() (also for a
 * PreparedCall whose run cannot be made here: PreparedRun.__init__ was never called). */
static PyObject *run_tp_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (PyTuple_Size(args) != 0 || (kwargs != NULL && PyDict_Size(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a prepared call takes no arguments: its arguments "
                                         "were given to prepare()");
        return NULL;
    }
    run_object *run = (run_object *)self;
    PyObject *result = run->argv_fn != NULL ? run_call(run) : Py_NewRef(Py_NotImplemented);
    if (result != Py_NotImplemented) {
        return result;
    }
    Py_DECREF(result);
    return PyObject_CallMethodObjArgs(self, s_run_in_python, NULL);
}

/* --- the run object -------------------------------------------------------------------------- */

/* PreparedRun(argv_fn, argv, buffers, backends, host_write, members, results, finish,
 * end_call): addresses as ints; ``members`` holds, for each of ``buffers`` in order,
 * (Buffer, its call record, output, replaces, array_input, to_host). */
static int run_init(run_object *run, PyObject *args, PyObject *kwargs) {
    (void)kwargs;
    PyObject *argv_fn, *argv, *buffers, *members, *results, *finish, *end_call;
    int backends, host_write;
    if (run->made) {
        PyErr_SetString(PyExc_TypeError, "a PreparedRun is made once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOipOOOO", &argv_fn, &argv, &buffers, &backends, &host_write,
                          &members, &results, &finish, &end_call)) {
        return -1;
    }
    run->made = true; /* even if this fails halfway: members taken would be taken twice */
    Py_ssize_t count = PySequence_Size(members);
    if (count < 0) {
        return -1;
    }
    if (count > MAX_MEMBERS) {
        PyErr_SetString(PyExc_ValueError, "too many buffers for a prepared run");
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PySequence_GetItem(members, i), *buffer, *record;
        int output, replaces, array_input, to_host;
        bool made = entry != NULL &&
                    PyArg_ParseTuple(entry, "OOpppp", &buffer, &record, &output, &replaces,
                                     &array_input, &to_host) &&
                    shim_member_init(&run->members[i], buffer, record, output, replaces,
                                     array_input, to_host);
        Py_XDECREF(entry);
        if (!made) {
            return -1;
        }
        run->count = (int)i + 1;
    }
    run->argv = PyLong_AsVoidPtr(argv);
    run->buffers = PyLong_AsVoidPtr(buffers);
    int (*function)(void **) = (int (*)(void **))PyLong_AsVoidPtr(argv_fn);
    if (PyErr_Occurred()) {
        return -1;
    }
    run->backends = (unsigned)backends;
    run->host_write = host_write;
    run->results = Py_NewRef(results);
    run->finish = Py_NewRef(finish);
    run->end_call = Py_NewRef(end_call);
    run->argv_fn = function; /* last: a run with it set is complete */
    return 0;
}

static void run_dealloc(run_object *run) {
    for (int i = 0; i < run->count; i++) {
        shim_member_clear(&run->members[i]);
    }
    Py_XDECREF(run->results);
    Py_XDECREF(run->finish);
    Py_XDECREF(run->end_call);
    shim_object_free((PyObject *)run);
}

static PyType_Slot run_slots[] = {
    {Py_tp_init, run_init},
    {Py_tp_dealloc, run_dealloc},
    {Py_tp_call, run_tp_call},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "The base of shim.PreparedCall: its run in C (native_stubs/fast/prepared_call.c)."},
    {0, NULL},
};

static PyType_Spec run_spec = {
    "shim._native.PreparedRun", sizeof(run_object), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    run_slots,
};

void *shim_prepared_run_type(void) {
    static PyObject *type;
    if (type == NULL &&
        (s_run_in_python != NULL || (s_run_in_python = PyUnicode_InternFromString("_run_in_python")))) {
        type = PyType_FromSpec(&run_spec);
    }
    return type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}
