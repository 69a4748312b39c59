/* The end of the fast paths' tp_deallocs (fastcall.c, prepared_call.c, shared_records.c,
 * family_state.c), in a file of its own below them all: each of them can be read and changed
 * without the others.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "fast/objects.h"

void shim_object_free(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    freefunc free_slot = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_slot(self);
    Py_DECREF(type); /* an instance of a heap type holds a reference to it */
}
