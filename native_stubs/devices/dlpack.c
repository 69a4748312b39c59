/* The C side of DLPack capsules: their destructor and their names. The export and import
 * logic is Python's (shim/exchange/dlpack_capsules.py, shim/exchange/dlpack_export.py, shim/interop/dlpack.py). */
#include <Python.h>

#include "shim_native.h"
#include "calls/signals_held.h"

static const char *const names[2][2] = {
    {"dltensor", "used_dltensor"},
    {"dltensor_versioned", "used_dltensor_versioned"},
};

const char *shim_dlpack_capsule_name(int versioned, int used) {
    return names[versioned != 0][used != 0];
}

/* A capsule nobody consumed still owns its tensor (a consumer renames the capsule to
 * "used_..." and calls the deleter itself, later). Consumers drop refused capsules while
 * raising, and the deleter runs Python: the pending exception waits outside it. */
void shim_dlpack_capsule_destructor(void *object) {
    PyObject *capsule = object;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (PyCapsule_IsValid(capsule, names[1][0])) {
        DLManagedTensorVersioned *tensor = PyCapsule_GetPointer(capsule, names[1][0]);
        if (tensor && tensor->deleter) {
            tensor->deleter(tensor);
        }
    } else if (PyCapsule_IsValid(capsule, names[0][0])) {
        DLManagedTensor *tensor = PyCapsule_GetPointer(capsule, names[0][0]);
        if (tensor && tensor->deleter) {
            tensor->deleter(tensor);
        }
    }
    PyErr_Restore(type, value, traceback);
}

/* The deleters exported tensors get. Their work is Python's (shim_py_dlpack_delete*: drop the
 * export's entry, unpin the device memory), and Python runs signal handlers between any two
 * bytecodes, so a KeyboardInterrupt (or a program's handler's exception) could land before that
 * work begins or halfway through it (before any `with interrupts.deferred()` in Python is
 * entered), where cffi swallows it ("Exception ignored from cffi callback") and the pin leaks
 * for good. So signal handlers are held (calls/signals_held.c) around the whole callback, and a
 * signal noted meanwhile is handled in the code that dropped the capsule, once the tensor is
 * released. */
/* A consumer may drop the tensor while an exception is being raised (numpy frees an array it
 * had just made when the next bytecode raises: `[np.from_dlpack(buf)][missing]`): the
 * deleter's Python code must not run with that exception set, which lost it for good (cffi
 * reported the deleter's SystemError and cleared both). It is kept aside meanwhile, as a
 * finalizer keeps it (calls/signals_held.c). */
static PyGILState_STATE deleter_enter(PyObject *saved[3]) {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyErr_Fetch(&saved[0], &saved[1], &saved[2]);
    shim_signals_hold();
    return gil;
}

static void deleter_leave(PyGILState_STATE gil, PyObject *saved[3]) {
    shim_signals_release();
    PyErr_Restore(saved[0], saved[1], saved[2]);
    PyGILState_Release(gil);
}

void shim_dlpack_delete(DLManagedTensor *self) {
    PyObject *saved[3];
    PyGILState_STATE gil = deleter_enter(saved);
    shim_py_dlpack_delete(self);
    deleter_leave(gil, saved);
}

void shim_dlpack_delete_versioned(DLManagedTensorVersioned *self) {
    PyObject *saved[3];
    PyGILState_STATE gil = deleter_enter(saved);
    shim_py_dlpack_delete_versioned(self);
    deleter_leave(gil, saved);
}
