/* Finalized: the base of the shim's classes whose finalizer must run to its end (shim.Buffer
 * gives its device memory back and leaves its family; a DLPack import releases its producer's
 * tensor; a CUDA fence gives its event back). Its tp_finalize calls the object's _finalize()
 * with Ctrl-C held from C: as a Python __del__, a KeyboardInterrupt raised at its first
 * bytecodes, before any deferred() section inside could be entered, would be swallowed as
 * "Exception ignored in __del__" and the work left undone for good. A SIGINT that arrives
 * meanwhile is only noted, and raised once the finalizer has returned (call_records.c's
 * shim_ctrl_c_hold and shim_ctrl_c_release, which shim/interrupts.py's handler obeys).
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "fastcall.h"

static PyObject *s_finalize;

static void finalize(PyObject *self) {
    PyObject *type, *value, *traceback; /* (a finalizer keeps the current exception) */
    PyErr_Fetch(&type, &value, &traceback);
    bool held = shim_ctrl_c_hold();
    PyObject *done = PyObject_CallMethodObjArgs(self, s_finalize, NULL);
    if (done == NULL) {
        PyErr_WriteUnraisable(self);
    }
    Py_XDECREF(done);
    shim_ctrl_c_release(held);
    PyErr_Restore(type, value, traceback);
}

static PyType_Slot finalized_slots[] = {
    {Py_tp_finalize, finalize},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "A base whose finalizer, _finalize(), runs with Ctrl-C held "
                "(native_stubs/finalizers.c)."},
    {0, NULL},
};

static PyType_Spec finalized_spec = {
    "shim._native.Finalized", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    finalized_slots,
};

void *shim_finalized_type(void) {
    static PyObject *type;
    if (type == NULL && (s_finalize != NULL || (s_finalize = PyUnicode_InternFromString("_finalize")))) {
        type = PyType_FromSpec(&finalized_spec);
    }
    return type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}
