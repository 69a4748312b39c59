/* The states of a family and of its lock that the fast paths read and write (the C fields of
 * shim.memory.families.Family's and FamilyLock's bases, family_state.c). Include after Python.h and
 * shim_native.h. */
#ifndef SHIM_FAST_FAMILY_STATE_H
#define SHIM_FAST_FAMILY_STATE_H

/* An allocation family's state (shim.memory.families.Family's base). */
typedef struct {
    PyObject_HEAD
    PyObject *regions; /* Family.regions: a tuple, replaced, never changed in place */
} shim_family_state;

/* A family lock's state (shim.memory.families.FamilyLock's base). */
typedef struct {
    PyObject_HEAD
    PyObject *owner; /* FamilyLock.owner: the holding thread's id, None or NULL when free */
    int waiting;     /* FamilyLock.waiting: threads in its wait() */
} shim_lock_state;

#endif
