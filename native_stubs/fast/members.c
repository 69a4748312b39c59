/* A buffer argument of a fast call (fast/members.h): made from a shim.Buffer and its call
 * record, for the call's records in its family (call_records.c, shared_records.c) and the
 * fast paths that hold it (fastcall.c, prepared_call.c).
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "fast/members.h"

bool shim_member_init(shim_member *m, PyObject *buffer, PyObject *record, bool output,
                      bool replaces, bool array_input, bool to_host) {
    if (!PyTuple_Check(record) || PyTuple_Size(record) != RECORD_FIELDS ||
        !PyList_Check(PyTuple_GetItem(record, RECORD_USES))) {
        PyErr_SetString(PyExc_TypeError, "a Buffer's call record is malformed");
        return false;
    }
    halide_buffer_t *raw = PyLong_AsVoidPtr(PyTuple_GetItem(record, RECORD_ADDRESS));
    if (raw == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "a Buffer's call record has no struct");
        }
        return false;
    }
    Py_INCREF(buffer);
    Py_INCREF(record);
    *m = (shim_member){raw, record, buffer, NULL, NULL, output, replaces, array_input, to_host};
    return true;
}

void shim_member_clear(shim_member *m) {
    Py_CLEAR(m->buffer);
    Py_CLEAR(m->record);
    Py_CLEAR(m->shared_use);
}
