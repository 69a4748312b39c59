/* A pipeline call's records in its buffers' families, kept from C for the fast paths (a plain
 * call, fastcall.c; a prepared call's run, prepared_call.c): the same steps as the Python
 * run (shim/runtime.py's begin_call and end_call, PreparedCall._results), done with a few
 * C-API calls on the same Python objects, for the common case where they are simple:
 *
 * - every family is a plain one (not shared by crops: those keep regions, in Python), no
 *   thread holds its lock (FamilyLock.owner is None) and none has deferred work to it;
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
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "fastcall.h"

static PyObject *s_owner, *s_waiting, *s_run_deferred, *s_copy_to_host, *s_unread;

/* A field of the member's Buffer's record (families.call_record), borrowed. */
static PyObject *field(const shim_member *m, int index) {
    return PyTuple_GetItem(m->record, index);
}

bool shim_member_init(shim_member *m, PyObject *buffer, PyObject *record, bool output,
                      bool replaces, bool array_input, bool to_host) {
    if (!PyTuple_Check(record) || PyTuple_Size(record) != RECORD_FIELDS ||
        !PyList_Check(PyTuple_GetItem(record, RECORD_USES)) ||
        !PyList_Check(PyTuple_GetItem(record, RECORD_DEFERRED))) {
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
    *m = (shim_member){raw, record, buffer, NULL, output, replaces, array_input, to_host};
    m->use = field(m, !output ? RECORD_USE_INPUT : replaces ? RECORD_USE_REPLACING : RECORD_USE_UPDATING);
    return true;
}

void shim_member_clear(shim_member *m) {
    Py_CLEAR(m->buffer);
    Py_CLEAR(m->record);
}

/* --- the family's lock ----------------------------------------------------------------------- */

/* Whether no thread holds the family's lock (see above), and (`no_waiters`) none waits on it. */
static bool lock_free(const shim_member *m, bool no_waiters) {
    PyObject *lock = field(m, RECORD_LOCK);
    PyObject *owner = PyObject_GetAttr(lock, s_owner);
    bool free_ = owner == Py_None;
    Py_XDECREF(owner);
    if (free_ && no_waiters) {
        PyObject *waiting = PyObject_GetAttr(lock, s_waiting);
        free_ = waiting != NULL && PyObject_IsTrue(waiting) == 0;
        Py_XDECREF(waiting);
    }
    PyErr_Clear();
    return free_;
}

static bool plain_family(const shim_member *m) {
    return !(shim_flags_get(m->raw) & SHIM_BUFFER_FLAG_REGIONS) &&
           PyList_Size(field(m, RECORD_DEFERRED)) == 0;
}

/* --- beginning and ending a use ---------------------------------------------------------- */

/* With the lock free: record the use as runtime.begin_call does for a plain family; an
 * array input is marked host-dirty first (the caller may have written the array), as
 * Buffer.set_host_dirty would, which waits for calls writing it and refuses device changes:
 * false (nothing done) where that would not be instant. */
static bool begin_use(const shim_member *m) {
    PyObject *uses = field(m, RECORD_USES);
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
    PyObject *uses = field(m, RECORD_USES);
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
    PyObject *entry = PyTuple_Pack(3, field(m, RECORD_RAW), field(m, RECORD_FAMILY), m->use);
    PyObject *uses = entry ? PyList_New(1) : NULL;
    PyObject *done = NULL;
    if (uses != NULL) {
        PyList_SetItem(uses, 0, entry); /* steals it */
        entry = NULL;
        done = PyObject_CallFunctionObjArgs(end_call, Py_None, uses, NULL);
    }
    Py_XDECREF(entry);
    Py_XDECREF(uses);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* End the use as runtime.end_call does; through end_call itself where that cannot be done at
 * once (a held lock: end_call may block, this may not; threads to wake, which takes the lock;
 * a family that became shared meanwhile). -1 with an exception set if that failed. */
static int end_use(const shim_member *m, PyObject *end_call) {
    if (plain_family(m) && lock_free(m, true)) {
        remove_use(m);
        return 0;
    }
    return end_in_python(m, end_call);
}

/* Run whatever other threads deferred to the family while the call held it. */
static int run_deferred(const shim_member *m) {
    if (PyList_Size(field(m, RECORD_DEFERRED)) == 0) {
        return 0;
    }
    PyObject *done = PyObject_CallMethodObjArgs(field(m, RECORD_FAMILY), s_run_deferred, NULL);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

bool shim_members_begin(const shim_member *members, int count, PyObject *end_call) {
    for (int i = 0; i < count; i++) {
        const shim_member *m = &members[i];
        if (!plain_family(m) || !lock_free(m, false) || !begin_use(m)) {
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

int shim_members_end(const shim_member *members, int count, PyObject *end_call) {
    PyObject *type = NULL, *value = NULL, *traceback = NULL;
    for (int i = 0; i < count; i++) {
        if (end_use(&members[i], end_call) < 0 && type == NULL) {
            PyErr_Fetch(&type, &value, &traceback);
        }
        PyErr_Clear();
    }
    for (int i = 0; i < count; i++) {
        if (run_deferred(&members[i]) < 0 && type == NULL) {
            PyErr_Fetch(&type, &value, &traceback);
        }
        PyErr_Clear();
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
        if (PyObject_SetAttr(m->buffer, s_unread, m->output ? Py_True : Py_False) < 0) {
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

bool shim_call_records_ready(void) {
    struct { PyObject **name; const char *text; } names[] = {
        {&s_owner, "owner"}, {&s_waiting, "waiting"}, {&s_run_deferred, "run_deferred"},
        {&s_copy_to_host, "copy_to_host"}, {&s_unread, "_unread"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].name == NULL &&
            (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return false;
        }
    }
    return true;
}
