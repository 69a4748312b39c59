/* A shim.Buffer's allocation family, as the served allocations (devices/served.c) see it.
 *
 * A shim.Buffer's struct (SHIM_BUFFER_FLAG_PYTHON) belongs to a family that lives in Python
 * (shim/memory/families.py), whose lock is a Python object. halide_device_malloc and
 * halide_device_free of such a struct (generated code allocating a Buffer's device memory, a C
 * program, Buffer.device_malloc and device_free) are served in C as a pipeline's own buffers
 * are, where the family is plain and idle:
 *  - it is the Family the struct is registered with (families._owned), unshared (members is
 *    None), with no memory and no handle of Python's (memory None, handles empty): the
 *    allocation, if any, is one the native layer served and Python never adopted;
 *  - no thread holds its lock or waits on it (FamilyLock.owner None, waiting 0), and it was not
 *    abandoned at a fork;
 *  - for a free: no pipeline call of another thread uses it (family.uses empty, or this thread
 *    works for a running pipeline call, whose own device calls never wait: families.await_calls);
 *    for a Buffer's own methods: no call uses it at all.
 * A copy (copy_to_host, copy_to_device) is served on the same terms, and also where the
 * allocation is the Python core's: the struct's handle one of the family's, into its current
 * memory; the copy moves what the Python core's _download or upload would (a dense buffer's
 * span, from the handle's offset), with the family's lock taken as below.
 * The served allocation is then recorded in its handle only, as a pipeline buffer's is, and the
 * first Python operation on the Buffer that needs it adopts it into the Buffer's family
 * (families.family_of, which every operation reaches through ``locked``); from then on it is an
 * ordinary allocation of the family's and is never served again.
 *
 * Why holding the GIL stands for taking the family's lock (the argument call_records.c makes
 * for the fast calls' records, extended to allocations): the check and the whole served step run
 * with the GIL held and run no Python code. A Python thread that holds the lock has set owner,
 * or is waiting (waiting > 0: FamilyLock.wait counts itself before clearing owner, and sets
 * owner again before it stops counting), or is between acquiring the lock and setting owner: at
 * the start of its critical section, which then looks at the struct through family_of and sees
 * the served allocation complete (it cannot run a bytecode until the GIL is let go). A Python
 * thread waiting for the lock, or running C without the GIL, is outside its critical section or
 * has set owner. So a served step is atomic with respect to every critical section of the
 * family; against generated code and C programs the served paths' own ordering applies (the
 * handle published last with a release store and claimed with one atomic exchange:
 * device_generic.c). A driver allocation on a pool miss runs with the GIL held, as short as a
 * Python thread's own calls into the driver between two bytecodes.
 *
 * A copy of such an allocation (copy_to_device, copy_to_host: generated code, Buffer's methods)
 * may take long, so it does not keep the GIL: once the family is found idle, this file takes
 * the family's lock itself, as FamilyLock.acquire does (its mutex, then owner), lets the GIL go
 * for the copy, and gives the lock back after. A Python thread that wants the family meanwhile
 * waits for the lock as for any holder; one that adopts the allocation first (family_of runs
 * before the lock is taken) only moves its record into the family: the memory stays, and the
 * copy's flags are set before the lock is given back.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "devices/served.h"
#include "fast/family_state.h"

static PyObject *s_owned;           /* families._owned: struct address -> Family */
static PyTypeObject *s_family_type; /* families.Family */
static PyTypeObject *s_lock_type;   /* families.FamilyLock */
static PyObject *s_members, *s_memory, *s_handles, *s_uses, *s_lock, *s_abandoned;
static PyObject *s_mutex, *s_acquire, *s_release, *s_owner; /* FamilyLock's _lock and its use */

static int serve(const struct halide_buffer_t *buf, int operation, shim_served_step step,
                 void *context);

int shim_buffer_families_watch(void *owned, void *family_type, void *lock_type) {
    PyObject *registry = owned, *family = family_type, *lock = lock_type;
    if (s_owned != NULL) {
        return s_owned == registry && s_family_type == (PyTypeObject *)family &&
               s_lock_type == (PyTypeObject *)lock;
    }
    if (!PyDict_Check(registry) || !PyType_Check(family) ||
        !PyType_Check(lock) ||
        !PyType_IsSubtype((PyTypeObject *)lock, (PyTypeObject *)shim_lock_state_type())) {
        return 0;
    }
    if ((s_members = PyUnicode_InternFromString("members")) == NULL ||
        (s_memory = PyUnicode_InternFromString("memory")) == NULL ||
        (s_handles = PyUnicode_InternFromString("handles")) == NULL ||
        (s_uses = PyUnicode_InternFromString("uses")) == NULL ||
        (s_lock = PyUnicode_InternFromString("lock")) == NULL ||
        (s_abandoned = PyUnicode_InternFromString("abandoned")) == NULL ||
        (s_mutex = PyUnicode_InternFromString("_lock")) == NULL ||
        (s_acquire = PyUnicode_InternFromString("acquire")) == NULL ||
        (s_release = PyUnicode_InternFromString("release")) == NULL ||
        (s_owner = PyUnicode_InternFromString("owner")) == NULL) {
        PyErr_Clear();
        return 0;
    }
    s_family_type = (PyTypeObject *)Py_NewRef(family);
    s_lock_type = (PyTypeObject *)Py_NewRef(lock);
    __atomic_store_n(&s_owned, Py_NewRef(registry), __ATOMIC_RELEASE);
    shim_served_register_family_server(serve);
    return 1;
}

/* `object`'s attribute `name` is `expected` (a slot's value: no Python code runs to read it). */
static bool attribute_is(PyObject *object, PyObject *name, PyObject *expected) {
    PyObject *value = PyObject_GetAttr(object, name);
    bool is = value == expected;
    Py_XDECREF(value);
    return is;
}

/* `object`'s attribute `name` is an empty dict or list. */
static bool attribute_empty(PyObject *object, PyObject *name) {
    PyObject *value = PyObject_GetAttr(object, name);
    bool empty = value != NULL && (PyDict_Check(value) || PyList_Check(value)) &&
                 PyObject_Size(value) == 0;
    Py_XDECREF(value);
    return empty;
}

static bool lock_idle(PyObject *family) {
    PyObject *lock = PyObject_GetAttr(family, s_lock);
    bool idle = false;
    if (lock != NULL && Py_TYPE(lock) == s_lock_type) {
        const shim_lock_state *state = (const shim_lock_state *)lock;
        idle = (state->owner == NULL || state->owner == Py_None) && state->waiting == 0 &&
               attribute_is(lock, s_abandoned, Py_False);
    }
    Py_XDECREF(lock);
    return idle;
}

/* Whether `buf`'s handle is one of the family's, into the family's memory: handles[handle]
 * is [offset, count, memory, backend] (families.Family.add_handle). */
static bool handle_into_memory(PyObject *family, const struct halide_buffer_t *buf) {
    PyObject *memory = PyObject_GetAttr(family, s_memory);
    PyObject *handles = PyObject_GetAttr(family, s_handles);
    PyObject *key = PyLong_FromUnsignedLongLong(shim_device_load(buf));
    PyObject *entry = memory != NULL && memory != Py_None && handles != NULL &&
                              PyDict_Check(handles) && key != NULL
                          ? PyDict_GetItemWithError(handles, key) /* (borrowed) */
                          : NULL;
    bool into = entry != NULL && PyList_Check(entry) && PyList_Size(entry) >= 3 &&
                PyList_GetItem(entry, 2) == memory;
    Py_XDECREF(key);
    Py_XDECREF(handles);
    Py_XDECREF(memory);
    return into;
}

/* Whether the family is idle for `operation` on `buf`, apart from its lock: no allocation of
 * Python's (its allocation, if any, is one the native layer served and Python never adopted);
 * or, for a copy, the Python core's allocation, with `buf`'s handle into it (the copy then
 * moves the bytes the Python core's would: served.c's copyable). */
static bool unused(PyObject *family, const struct halide_buffer_t *buf, int operation) {
    if (Py_TYPE(family) != s_family_type || !attribute_is(family, s_members, Py_None)) {
        return false;
    }
    bool pythons = !attribute_is(family, s_memory, Py_None) || !attribute_empty(family, s_handles);
    if (pythons && !(operation == SHIM_FAMILY_COPY && handle_into_memory(family, buf))) {
        return false;
    }
    if (operation == SHIM_FAMILY_MALLOC) {
        return true;
    }
    if (operation == SHIM_FAMILY_FREE || operation == SHIM_FAMILY_COPY) {
        shim_call *call = shim_current_call();
        if (call != NULL && shim_call_in_pipeline(call)) {
            return true;
        }
    }
    return attribute_empty(family, s_uses);
}

static bool servable(PyObject *family, const struct halide_buffer_t *buf, int operation) {
    return unused(family, buf, operation) && lock_idle(family);
}

/* `step(context)` with the family's lock taken as FamilyLock.acquire takes it (its mutex, then
 * owner: this thread), and the GIL released: a Python thread that wants the family waits for
 * the lock, and the fast paths, which read owner, leave the family to Python meanwhile. With
 * the GIL held. */
static int step_holding_lock(PyObject *family, const struct halide_buffer_t *buf,
                             shim_served_step step, void *context) {
    int result = SHIM_NOT_SERVED;
    PyObject *lock = PyObject_GetAttr(family, s_lock);
    PyObject *mutex = lock == NULL ? NULL : PyObject_GetAttr(lock, s_mutex);
    PyObject *taken = mutex == NULL ? NULL : PyObject_CallMethodObjArgs(mutex, s_acquire, Py_False, NULL);
    PyObject *me = taken == Py_True ? PyLong_FromUnsignedLong(PyThread_get_thread_ident()) : NULL;
    if (me != NULL && PyObject_SetAttr(lock, s_owner, me) == 0) {
        /* Checked again now that it is held: making the argument tuple above may have run the
         * collector, and a finalizer may have let another thread in after the first check. */
        if (unused(family, buf, SHIM_FAMILY_COPY)) {
            PyThreadState *state = PyEval_SaveThread();
            result = step(context);
            PyEval_RestoreThread(state);
        }
        if (PyObject_SetAttr(lock, s_owner, Py_None) != 0) {
            PyErr_Clear();
        }
    }
    if (taken == Py_True) {
        PyObject *released = PyObject_CallMethodObjArgs(mutex, s_release, NULL);
        Py_XDECREF(released);
    }
    Py_XDECREF(me);
    Py_XDECREF(taken);
    Py_XDECREF(mutex);
    Py_XDECREF(lock);
    return result;
}

/* The family server (devices/served.h). */
static int serve(const struct halide_buffer_t *buf, int operation, shim_served_step step,
                 void *context) {
    PyObject *owned = __atomic_load_n(&s_owned, __ATOMIC_ACQUIRE);
    if (!Py_IsInitialized()) {
        return SHIM_NOT_SERVED;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* (a caller's exception in flight stays as it was) */
    int result = SHIM_NOT_SERVED;
    PyObject *address = PyLong_FromVoidPtr((void *)buf);
    PyObject *family = address == NULL ? NULL : PyDict_GetItemWithError(owned, address);
    if (family != NULL && servable(family, buf, operation)) {
        result = operation == SHIM_FAMILY_COPY ? step_holding_lock(family, buf, step, context)
                                               : step(context);
    }
    Py_XDECREF(address);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    PyGILState_Release(gil);
    return result;
}
