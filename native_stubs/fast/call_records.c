/* A pipeline call's records in its buffers' families, kept from C for the fast paths (a plain
 * call, fastcall.c; a prepared call's run, prepared_call.c): the same steps as the Python
 * run (shim/core/call_uses.py's begin_call and end_call, PreparedCall._results), done with a few
 * C-API calls on the same Python objects, for the common case where they are simple:
 *
 * - no thread holds a family's lock (FamilyLock.owner is None) or waits on it (an operation
 *   waiting for the family's calls goes before a new one: call_uses.begin_call); a shared
 *   family (a Buffer and its crops, which keep regions) is in a state for which
 *   shared_records.c has a plan;
 * - array inputs' families have no call in flight and no changes on the device side.
 *
 * When one of these does not hold, shim_members_begin records nothing and says so, and the
 * caller leaves the call to Python before anything has run; when a family's lock is held at
 * the end, or threads wait on it, runtime.end_call ends that use (it may block, this may not).
 *
 * Why reading FamilyLock.owner stands for taking the lock: this code holds the GIL from the
 * check to the end of its change to the family's lists and runs no Python code in between. A
 * thread that takes the lock meanwhile (its blocking acquire runs without the GIL) cannot run
 * a line of its critical section before this code lets go of the GIL, and then sees the change
 * complete: as if this code had taken and released the lock first. A thread that has the lock
 * but has not yet set owner is at the start of its critical section (FamilyLock.acquire) or
 * coming back from wait(), after which it looks at the uses again; one that set owner holds it
 * for real, and then this code leaves the family to Python.
 *
 * The Python code this calls for the end of a call (runtime.end_call) runs with
 * signal handlers held (shim_signals_hold), as the Python run's bookkeeping does: a
 * KeyboardInterrupt (or any handler's exception) landing before end_call's own deferred() would
 * leave the use recorded, and every later operation on the Buffer waiting for it.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "calls/signals_held.h"
#include "fast/call_records.h"
#include "fast/family_state.h"
#include "fast/shared_records.h"

static PyObject *s_copy_to_host;

/* --- slots read and written directly ------------------------------------------------------ */

/* An attribute kept in a __slots__ slot of objects of one type, read and written through its
 * member descriptor: getattr's type and dict lookups cost more than the rest of a call's
 * bookkeeping. Objects of another type take the generic way. */
typedef struct {
    PyTypeObject *type;
    PyObject *name, *descr;
    descrgetfunc get;
    descrsetfunc set;
} slot;

static slot buffer_record, buffer_unread;
static PyTypeObject *s_lock_type; /* families.FamilyLock */

static bool slot_init(slot *s, PyObject *type, const char *name) {
    if (s->type != NULL) {
        return (PyObject *)s->type == type;
    }
    s->name = PyUnicode_InternFromString(name);
    s->descr = s->name ? PyObject_GetAttr(type, s->name) : NULL; /* the class's: the descriptor */
    if (s->descr == NULL) {
        return false;
    }
    s->get = (descrgetfunc)PyType_GetSlot(Py_TYPE(s->descr), Py_tp_descr_get);
    s->set = (descrsetfunc)PyType_GetSlot(Py_TYPE(s->descr), Py_tp_descr_set);
    if (s->get == NULL || s->set == NULL) {
        PyErr_Format(PyExc_TypeError, "%s is not a slot", name);
        return false;
    }
    s->type = (PyTypeObject *)Py_NewRef(type);
    return true;
}

static PyObject *slot_get(const slot *s, PyObject *object) {
    return Py_TYPE(object) == s->type ? s->get(s->descr, object, (PyObject *)s->type)
                                      : PyObject_GetAttr(object, s->name);
}

static int slot_set(const slot *s, PyObject *object, PyObject *value) {
    return Py_TYPE(object) == s->type ? s->set(s->descr, object, value)
                                      : PyObject_SetAttr(object, s->name, value);
}

PyObject *shim_buffer_record(PyObject *buffer) {
    return slot_get(&buffer_record, buffer);
}

/* --- the family's lock ----------------------------------------------------------------------- */

/* Whether no thread holds the family's lock (see above), and (`no_waiters`) none waits on it.
 * (A lock of another type: as if held, Python takes the call.) */
static bool lock_free(const shim_member *m, bool no_waiters) {
    PyObject *lock = shim_record_field(m, RECORD_LOCK);
    if (lock == NULL || Py_TYPE(lock) != s_lock_type) {
        PyErr_Clear();
        return false;
    }
    const shim_lock_state *state = (const shim_lock_state *)lock;
    return (state->owner == NULL || state->owner == Py_None) && !(no_waiters && state->waiting);
}

static bool shared_family(const shim_member *m) {
    return shim_flags_get(m->raw) & SHIM_BUFFER_FLAG_REGIONS;
}

/* --- beginning and ending a use ---------------------------------------------------------- */

/* With the lock free: record the use as runtime.begin_call does for a plain family; an
 * array input is marked host-dirty first (the caller may have written the array), as
 * Buffer.set_host_dirty would, which waits for calls writing it and refuses device changes:
 * false (nothing done) where that would not be instant. */
static bool begin_plain_use(shim_member *m) {
    Py_CLEAR(m->shared_use);
    m->use = shim_record_field(m, !m->output ? RECORD_USE_INPUT : m->replaces ? RECORD_USE_REPLACING
                                                                   : RECORD_USE_UPDATING);
    PyObject *uses = shim_record_field(m, RECORD_USES);
    uint64_t flags = shim_flags_get(m->raw);
    if (m->array_input) {
        if (PyList_Size(uses) != 0 || (flags & halide_buffer_flag_device_dirty)) {
            return false;
        }
        shim_flags_assign(m->raw, halide_buffer_flag_host_dirty, true);
    }
    if (PyList_Append(uses, m->use) < 0) {
        PyErr_Clear();
        return false;
    }
    if (m->replaces) { /* its results replace what either side held */
        shim_flags_assign(m->raw, halide_buffer_flag_host_dirty | halide_buffer_flag_device_dirty,
                          false);
    }
    return true;
}

static void remove_use(const shim_member *m) {
    PyObject *uses = shim_record_field(m, RECORD_USES);
    for (Py_ssize_t i = PyList_Size(uses) - 1; i >= 0; i--) {
        if (PyList_GetItem(uses, i) == m->use) {
            if (PySequence_DelItem(uses, i) < 0) {
                PyErr_Clear(); /* (an index just read: cannot fail) */
            }
            return;
        }
    }
}

/* runtime.end_call(None, [(raw, family, use)]) for this member's use. */
static int end_in_python(const shim_member *m, PyObject *end_call) {
    PyObject *entry = PyTuple_Pack(3, shim_record_field(m, RECORD_RAW),
                                   shim_record_field(m, RECORD_FAMILY), m->use);
    PyObject *uses = entry ? PyList_New(1) : NULL;
    PyObject *done = NULL;
    if (uses != NULL) {
        PyList_SetItem(uses, 0, entry); /* steals it */
        entry = NULL;
        shim_signals_hold();
        done = PyObject_CallFunctionObjArgs(end_call, Py_None, uses, NULL);
        shim_signals_release();
    }
    Py_XDECREF(entry);
    Py_XDECREF(uses);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* Record the use as runtime.begin_call does, with the family's lock free; false (nothing
 * done) where that cannot be done at once. A shared family's plan may be made in Python
 * first, after which the lock is checked again. */
static bool begin_use(shim_member *m, bool host_write) {
    for (bool plan = true;; plan = false) {
        /* (No waiters either: an operation waiting for the family's calls goes before a new
         * call, which Python arranges: call_uses.begin_call.) */
        if (!lock_free(m, true)) {
            return false;
        }
        if (!shared_family(m)) {
            return begin_plain_use(m);
        }
        int done = shim_shared_begin(m, host_write, plan);
        if (done != SHIM_SHARED_PLANNED) {
            return done == SHIM_SHARED_DONE;
        }
    }
}

/* End the use as runtime.end_call does; through end_call itself where that cannot be done at
 * once (a held lock: end_call may block, this may not; threads to wake, which takes the lock;
 * a family that became shared meanwhile; a shared family in a state no plan covers). -1 with
 * an exception set if that failed. */
static int end_use(const shim_member *m, PyObject *end_call) {
    for (bool plan = true;; plan = false) {
        if (!lock_free(m, true)) {
            break;
        }
        if (m->shared_use == NULL) {
            if (shared_family(m)) {
                break; /* (shared since the call began: its plain use ends in Python) */
            }
            remove_use(m);
            return 0;
        }
        int done = shim_shared_end(m, plan);
        if (done != SHIM_SHARED_PLANNED) {
            if (done == SHIM_SHARED_DONE) {
                return 0;
            }
            break;
        }
    }
    return end_in_python(m, end_call);
}

bool shim_members_begin(shim_member *members, int count, PyObject *end_call, bool host_write) {
    for (int i = 0; i < count; i++) {
        if (!begin_use(&members[i], host_write)) {
            for (int k = 0; k < i; k++) {
                if (end_use(&members[k], end_call) < 0) {
                    PyErr_WriteUnraisable(end_call);
                }
            }
            return false;
        }
    }
    return true;
}

/* Keep the exception set now if none is kept yet, else drop it. */
static void keep_first_error(PyObject **type, PyObject **value, PyObject **traceback) {
    if (*type == NULL) {
        PyErr_Fetch(type, value, traceback);
    } else {
        PyErr_Clear();
    }
}

int shim_members_end(const shim_member *members, int count, PyObject *end_call) {
    PyObject *type = NULL, *value = NULL, *traceback = NULL;
    for (int i = 0; i < count; i++) {
        if (end_use(&members[i], end_call) < 0) {
            keep_first_error(&type, &value, &traceback);
        }
    }
    if (type != NULL) {
        PyErr_Restore(type, value, traceback);
        return -1;
    }
    return 0;
}

void shim_members_ran(const shim_member *members, int count, bool host_write) {
    for (int i = 0; host_write && i < count; i++) {
        /* Code compiled for the CPU writes outputs without marking them host-dirty; a device
         * copy they may have would go stale. */
        if (members[i].output) {
            shim_flags_assign(members[i].raw, halide_buffer_flag_host_dirty, true);
        }
    }
}

int shim_members_results(const shim_member *members, int count) {
    for (int i = 0; i < count; i++) {
        const shim_member *m = &members[i];
        if (slot_set(&buffer_unread, m->buffer, m->output ? Py_True : Py_False) < 0) {
            return -1;
        }
    }
    for (int i = 0; i < count; i++) {
        const shim_member *m = &members[i];
        if (m->to_host && (shim_flags_get(m->raw) & halide_buffer_flag_device_dirty)) {
            PyObject *done = PyObject_CallMethodObjArgs(m->buffer, s_copy_to_host, NULL);
            Py_XDECREF(done);
            if (done == NULL) {
                return -1;
            }
        }
    }
    return 0;
}

/* `lock_type`, FamilyLock, must have LockState's fields. */
static bool lock_type_ready(PyObject *lock_type) {
    PyObject *base = shim_lock_state_type();
    if (base == NULL || !PyType_Check(lock_type) ||
        !PyType_IsSubtype((PyTypeObject *)lock_type, (PyTypeObject *)base)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "FamilyLock is not a LockState");
        }
        return false;
    }
    if (s_lock_type == NULL) {
        s_lock_type = (PyTypeObject *)Py_NewRef(lock_type);
    }
    return s_lock_type == (PyTypeObject *)lock_type;
}

bool shim_call_records_ready(PyObject *buffer_type, PyObject *lock_type) {
    if (s_copy_to_host == NULL && (s_copy_to_host = PyUnicode_InternFromString("copy_to_host")) == NULL) {
        return false;
    }
    if (!slot_init(&buffer_record, buffer_type, "_record") ||
        !slot_init(&buffer_unread, buffer_type, "_unread") ||
        !lock_type_ready(lock_type) || !shim_shared_records_ready()) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "the call records' types changed");
        }
        return false;
    }
    return true;
}
