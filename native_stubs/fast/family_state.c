/* FamilyState and LockState, the bases of shim.memory.families.Family and FamilyLock: what the C
 * fast paths read and write at every call (call_records.c, shared_records.c), kept in C
 * fields. As __slots__ slots, each read and each write would be a call through a descriptor,
 * costing more than the rest of the call's records together.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#include <structmember.h>

#include "shim_native.h"
#include "fast/family_state.h"
#include "fast/objects.h"

static PyMemberDef state_members[] = {
    {"regions", T_OBJECT_EX, offsetof(shim_family_state, regions), 0,
     "(host, device): frozensets of boxes newer on that side (see shim/memory/families.py)"},
    {NULL, 0, 0, 0, NULL},
};

static void state_dealloc(PyObject *self) {
    Py_CLEAR(((shim_family_state *)self)->regions);
    shim_object_free(self);
}

static PyType_Slot state_slots[] = {
    {Py_tp_members, state_members},
    {Py_tp_dealloc, state_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "The base of shim.memory.families.Family: its state the C fast paths read "
                "(native_stubs/fast/family_state.c)."},
    {0, NULL},
};

static PyType_Spec state_spec = {
    "shim._native.FamilyState", sizeof(shim_family_state), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, state_slots,
};

static PyMemberDef lock_members[] = {
    {"owner", T_OBJECT, offsetof(shim_lock_state, owner), 0,
     "the id of the thread holding the lock, or None (see shim/memory/families.py)"},
    {"waiting", T_INT, offsetof(shim_lock_state, waiting), 0, "threads waiting on it"},
    {NULL, 0, 0, 0, NULL},
};

static void lock_dealloc(PyObject *self) {
    Py_CLEAR(((shim_lock_state *)self)->owner);
    shim_object_free(self);
}

static PyType_Slot lock_slots[] = {
    {Py_tp_members, lock_members},
    {Py_tp_dealloc, lock_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "The base of shim.memory.families.FamilyLock: its state the C fast paths read "
                "(native_stubs/fast/family_state.c)."},
    {0, NULL},
};

static PyType_Spec lock_spec = {
    "shim._native.LockState", sizeof(shim_lock_state), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, lock_slots,
};

void *shim_lock_state_type(void) {
    static PyObject *type;
    if (type == NULL) {
        type = PyType_FromSpec(&lock_spec);
    }
    return type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}

void *shim_family_state_type(void) {
    static PyObject *type;
    if (type == NULL) {
        type = PyType_FromSpec(&state_spec);
    }
    return type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}
