/* Python code that a signal handler's exception must not cut short: it runs with signal
 * handlers held from C. Python runs a handler on the main thread between any two bytecodes;
 * the shim's handlers (shim/native/interrupts.py) only note a signal that arrives while a hold is on
 * (shim_signals_held, shim_signals_note), and when the thread's last hold is released the
 * signal is delivered again (PyErr_SetInterruptEx), for its handler to run at Python's next
 * check, outside. The holds: the fast paths around a call (fast/fastcall.c,
 * fast/prepared_call.c) and the Python code they call (fast/call_records.c,
 * fast/shared_records.c), the deleters of exported DLPack tensors (devices/dlpack.c), and two
 * bases for the shim's classes:
 *
 * Finalized: objects whose finalizer must run to its end (shim.Buffer gives its device memory
 * back and leaves its family; a DLPack import releases its producer's tensor; a CUDA fence gives
 * its event back). Its tp_finalize calls the object's _finalize(): as a Python __del__, a
 * KeyboardInterrupt (or a timeout's exception) raised at its start would be swallowed as
 * "Exception ignored in __del__" and the work left undone for good. One class may say that its
 * instances have nothing to finalize when nothing else references them and one of their slots
 * holds anything but None (shim_finalized_skip_when_alone): a PipelineResult whose struct was
 * never made (its _pending, the argument's name), which only marks itself for a later
 * finalizer of its own dying cycle (shim/buffers/pipeline_result.py). Dropped by its last
 * reference, it then costs no Python call at all. The slot is what decides, not the class
 * alone: a PipelineResult can also be made whole (type(result)(array), the views and copies
 * made with type(self)), and a whole one has a struct and device memory to give back.
 *
 * HeldContext: context managers whose entering and leaving must run to their end (a profile
 * that starts must be stopped; a stream set for a block must be put back). Its __enter__ and
 * __exit__ are C methods, which the with statement calls without running a bytecode of its
 * own, and call the object's _enter() and _exit(type, value, traceback): as Python methods, an
 * exception raised at __exit__'s first bytecode would leave the with statement with the
 * profile recording for good.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "calls/signals_held.h"

static PyObject *s_finalize, *s_enter, *s_exit;

/* --- the hold ------------------------------------------------------------------------------ */

/* Per thread: the holds the thread is inside, and the signals noted meanwhile (bit s - 1 for
 * signal s). Python runs handlers on the main thread only, so only its values ever matter;
 * any thread may hold (a deleter or a finalizer runs wherever its object goes), at the cost of
 * a thread-local increment. No GIL needed. */
static _Thread_local int holds;
static _Thread_local uint64_t noted;

void shim_signals_hold(void) {
    holds++;
}

void shim_signals_release(void) {
    if (--holds == 0 && noted != 0) {
        uint64_t signals = noted;
        noted = 0;
        for (int signum = 1; signum <= 64; signum++) {
            if (signals & (UINT64_C(1) << (signum - 1))) {
                shim_signal_again(signum);
            }
        }
    }
}

int shim_signals_held(void) {
    return holds;
}

void shim_signals_note(int signum) {
    if (signum >= 1 && signum <= 64) {
        noted |= UINT64_C(1) << (signum - 1);
    }
}

void shim_signal_again(int signum) {
    PyErr_SetInterruptEx(signum); /* (async-signal-safe, needs no GIL) */
}

/* The class whose instances' finalizer has nothing to do when they are alone and their slot
 * (its member descriptor, read through its own getter: no Python code runs) holds anything but
 * None (new references). */
static PyObject *skip_when_alone, *skip_slot;
static descrgetfunc skip_slot_get;

int shim_finalized_skip_when_alone(void *type, void *slot) {
    PyObject *descriptor = PyType_Check((PyObject *)type) && PyUnicode_Check((PyObject *)slot)
                               ? PyObject_GetAttr((PyObject *)type, (PyObject *)slot)
                               : NULL;
    descrgetfunc get =
        descriptor ? (descrgetfunc)PyType_GetSlot(Py_TYPE(descriptor), Py_tp_descr_get) : NULL;
    if (get == NULL) {
        PyErr_Clear();
        Py_XDECREF(descriptor);
        return 0;
    }
    PyObject *previous_type = skip_when_alone, *previous_slot = skip_slot;
    skip_when_alone = Py_NewRef((PyObject *)type);
    skip_slot = descriptor;
    skip_slot_get = get;
    Py_XDECREF(previous_type);
    Py_XDECREF(previous_slot);
    return 1;
}

/* Whether `self` has nothing to finalize (see shim_finalized_skip_when_alone). Alone: the
 * finalizer runs from the object's deallocation, which holds the one reference (the collector
 * holds its own and the cycle's while it finalizes a cycle's objects). No other finalizer can
 * reach the object after this one. (An exact type: a class that made the instance something
 * else, as a PipelineResult becomes a Buffer, has its own work.) An unset slot counts as
 * holding something: an object whose construction failed before setting it. */
static bool nothing_to_finalize(PyObject *self) {
    if ((PyObject *)Py_TYPE(self) != skip_when_alone || Py_REFCNT(self) != 1) {
        return false;
    }
    PyObject *held = skip_slot_get(skip_slot, self, skip_when_alone);
    if (held == NULL) {
        PyErr_Clear();
        return true;
    }
    Py_DECREF(held);
    return held != Py_None;
}

static void finalize(PyObject *self) {
    PyObject *type, *value, *traceback; /* (a finalizer keeps the current exception) */
    PyErr_Fetch(&type, &value, &traceback);
    if (!nothing_to_finalize(self)) {
        shim_signals_hold();
        PyObject *done = PyObject_CallMethodObjArgs(self, s_finalize, NULL);
        if (done == NULL) {
            PyErr_WriteUnraisable(self);
        }
        Py_XDECREF(done);
        shim_signals_release();
    }
    PyErr_Restore(type, value, traceback);
}

static PyType_Slot finalized_slots[] = {
    {Py_tp_finalize, finalize},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "A base whose finalizer, _finalize(), runs with signal handlers held "
                "(native_stubs/calls/signals_held.c)."},
    {0, NULL},
};

static PyType_Spec finalized_spec = {
    "shim._native.Finalized", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    finalized_slots,
};

static bool interned(PyObject **name, const char *text) {
    return *name != NULL || (*name = PyUnicode_InternFromString(text)) != NULL;
}

void *shim_finalized_type(void) {
    static PyObject *type;
    if (type == NULL && interned(&s_finalize, "_finalize")) {
        type = PyType_FromSpec(&finalized_spec);
    }
    return type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}

/* HeldContext.__enter__ and __exit__: self._enter() and self._exit(*exc), signals held. */
static PyObject *held_method(PyObject *self, PyObject *name, PyObject *args) {
    shim_signals_hold();
    PyObject *method = PyObject_GetAttr(self, name);
    PyObject *result = method != NULL ? PyObject_Call(method, args, NULL) : NULL;
    Py_XDECREF(method);
    shim_signals_release();
    return result;
}

static PyObject *held_enter(PyObject *self, PyObject *unused) {
    PyObject *none = PyTuple_New(0);
    PyObject *result = none != NULL ? held_method(self, s_enter, none) : NULL;
    Py_XDECREF(none);
    return result;
}

static PyObject *held_exit(PyObject *self, PyObject *args) {
    return held_method(self, s_exit, args);
}

static PyMethodDef held_context_methods[] = {
    {"__enter__", held_enter, METH_NOARGS, "self._enter(), with signal handlers held."},
    {"__exit__", held_exit, METH_VARARGS, "self._exit(type, value, traceback), with signal "
                                           "handlers held."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot held_context_slots[] = {
    {Py_tp_methods, held_context_methods},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "A base whose __enter__ and __exit__ call _enter() and _exit(*exc) with "
                "signal handlers held (native_stubs/calls/signals_held.c)."},
    {0, NULL},
};

static PyType_Spec held_context_spec = {
    "shim._native.HeldContext", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    held_context_slots,
};

void *shim_held_context_type(void) {
    static PyObject *type;
    if (type == NULL && interned(&s_enter, "_enter") && interned(&s_exit, "_exit")) {
        type = PyType_FromSpec(&held_context_spec);
    }
    return type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}
