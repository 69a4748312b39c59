/* The C side of DLPack capsules: their destructor and their names. The export and import
 * logic is Python's (shim/dlpack_capsules.py, shim/dlpack_export.py, shim/dlpack.py). */
#include <Python.h>

#include "shim_native.h"

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
 * export's entry, unpin the device memory), and Python runs SIGINT's handler between any two
 * bytecodes, so a KeyboardInterrupt could land before that work begins or halfway through it
 * (before any `with interrupts.deferred()` in Python is entered), where cffi swallows it
 * ("Exception ignored from cffi callback") and the pin leaks for good. So Ctrl-C is deferred
 * here, in C, around the whole callback: the handler (shim/interrupts.py) sees
 * shim_interrupts_in_deleter() and only notes the signal, and leaving the outermost deleter
 * raises it again, to land in the code that dropped the capsule, once the tensor is released.
 * Per thread: a consumer may run a deleter on any thread (only the main thread's handler runs,
 * and reads the main thread's count); no GIL needed, cffi takes it inside. */
static _Thread_local int in_deleter;
static _Thread_local int noted;

int shim_interrupts_in_deleter(void) {
    return in_deleter;
}

void shim_interrupts_note(void) {
    noted = 1;
}

static void deleter_leave(void) {
    if (--in_deleter == 0 && noted) {
        noted = 0;
        PyErr_SetInterrupt();  /* (async-signal-safe, needs no GIL): SIGINT, once more */
    }
}

void shim_dlpack_delete(DLManagedTensor *self) {
    in_deleter++;
    shim_py_dlpack_delete(self);
    deleter_leave();
}

void shim_dlpack_delete_versioned(DLManagedTensorVersioned *self) {
    in_deleter++;
    shim_py_dlpack_delete_versioned(self);
    deleter_leave();
}
