/* HostExporter: the base that gives shim.Buffer Python's buffer protocol (memoryview(buf),
 * bytes(buf), halide.Buffer(buf), numpy.asarray(buf) without __array__), as halide.Buffer has
 * it. A Python class cannot export a buffer before Python 3.12 (__buffer__), so the slot is C's.
 *
 * The export is the object's host memory as _host_export() gives it: a numpy array over the
 * Buffer's memory, in numpy's axis order, its device results copied home first (the Python
 * core's rules, shim/buffers/buffer.py). The view is the array's own (view->obj is the array):
 * released, it releases the array's export, and the memory lives as long as the view does,
 * whatever becomes of the Buffer. HostExporter derives from Finalized (signals_held.c), whose
 * finalizer shim.Buffer needs too. */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"

static PyObject *s_host_export;

static int get_buffer(PyObject *self, Py_buffer *view, int flags) {
    PyObject *array = PyObject_CallMethodObjArgs(self, s_host_export, NULL);
    if (array == NULL) {
        return -1;
    }
    int result = PyObject_GetBuffer(array, view, flags);
    Py_DECREF(array); /* (the view holds its own reference to it) */
    return result;
}

static PyType_Slot host_exporter_slots[] = {
    {Py_bf_getbuffer, get_buffer},
    {Py_tp_doc, "A Finalized whose buffer protocol exports _host_export()'s array "
                "(native_stubs/calls/host_export.c)."},
    {0, NULL},
};

static PyType_Spec host_exporter_spec = {
    "shim._native.HostExporter", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    host_exporter_slots,
};

void *shim_host_exporter_type(void) {
    static PyObject *type;
    if (type == NULL) {
        PyObject *base = shim_finalized_type();
        if (base == NULL || (s_host_export == NULL &&
                             (s_host_export = PyUnicode_InternFromString("_host_export")) == NULL)) {
            return NULL;
        }
        type = PyType_FromSpecWithBases(&host_exporter_spec, base);
    }
    return type; /* borrowed, as shim_finalized_type's */
}
