/* A pipeline call's records in a shared family (a Buffer and its crops and slices, whose
 * device state is kept as regions: shim/memory/aliasing.py), kept from C for the fast paths.
 *
 * What beginning and ending a call's use of a member does to its family depends only on the
 * family's state: its regions (host and device), its members, and the dirty bits the call
 * left on the member. aliasing.begin_plan and end_plan work that out in Python once per state
 * and give it as a plan; the member's record keeps the last plan of each kind (RECORD_PLANS)
 * and this code carries it out, with no Python code run, whenever the family is in the state
 * the plan was made for. Family.regions (a C field of its base, family_state.c) is replaced,
 * never changed in place, and a change of the members' set replaces it too: "the same state"
 * is the same regions object (its identity: the plan holds a reference, so no other object can
 * take its address). A call repeated on the same buffers takes the family through the same
 * states, so after its first call every call finds its plans.
 *
 * Plans are made only where the outcome is this simple: at the beginning, no device-side
 * changes to bring home first (a CPU call writing the member); at the end, no other use of the
 * family (refreshing the dirty bits of members other calls are running on is theirs to do) and
 * no conflict (an output left newer on both sides). Elsewhere the call is left to Python
 * (shim/core/call_uses.py's begin_call and end_call), which does the same from scratch.
 *
 * call_records.c calls this with the GIL held, having checked that no thread holds the
 * family's lock (see there why that stands for taking it). Making a plan runs Python code,
 * which lets other threads run: PLANNED then tells the caller to check the lock again.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include "shim_native.h"
#include "calls/signals_held.h"
#include "fast/family_state.h"
#include "fast/objects.h"
#include "fast/shared_records.h"

/* The plans a record keeps: one beginning per kind of use and pipeline (one writing its outputs
 * on the host, or not: a CPU call writing a member first brings the device's changes home,
 * a GPU call does not, so a beginning planned for one is not the other's), one end per kind
 * of use and dirty bits (none, host, device, both) the call left. */
enum {
    USE_KINDS = 3,
    SIDES = 4,
    BEGIN_PLANS = 2 * USE_KINDS,
    PLANS = BEGIN_PLANS + USE_KINDS * SIDES
};

/* A plan's fields (tuples made by shim/memory/aliasing.py): the state it was made for first. */
enum { PLAN_REGIONS, BEGIN_USE, BEGIN_AFTER };
enum { END_AFTER = 1, END_BITS, END_MEMBERS };

/* One member's dirty bits after the end (END_BITS: packed as two native uint64s). */
typedef struct {
    uint64_t address;
    uint64_t bits;
} member_bits;

/* A plan, its fields taken out of the tuple (which it holds: every reference and the structs
 * the addresses are). */
typedef struct {
    PyObject *made;    /* the plan as made (a tuple), or NULL: none */
    PyObject *regions; /* the state it is for */
    PyObject *use;     /* a beginning's Use */
    PyObject *after;   /* the regions after */
    member_bits *bits; /* an end's dirty bits, `count` members */
    Py_ssize_t count;
} member_plan;

/* A record's plans (its RECORD_PLANS, shim/memory/families.py's call_record makes it). */
typedef struct {
    PyObject_HEAD
    member_plan *plans; /* PLANS of them, made with the first (most Buffers never need one) */
} plans_object;

static PyTypeObject *s_family_type, *s_plans_type;
static PyObject *s_begin_plan, *s_end_plan;

static int use_kind(const shim_member *m) {
    return !m->output ? 0 : m->replaces ? 1 : 2;
}

/* The member's family's state, or NULL (a family of another type: declined). */
static shim_family_state *state_of(const shim_member *m) {
    PyObject *family = shim_record_field(m, RECORD_FAMILY);
    return family != NULL && Py_TYPE(family) == s_family_type ? (shim_family_state *)family
                                                              : NULL;
}

/* The member's record's plans, or NULL (another object: declined). */
static plans_object *plans_of(const shim_member *m) {
    PyObject *plans = shim_record_field(m, RECORD_PLANS);
    return plans != NULL && Py_TYPE(plans) == s_plans_type ? (plans_object *)plans : NULL;
}

/* The plan at `index` if it was made for the family's `state` now, else NULL. */
static const member_plan *plan_for(const shim_member *m, int index, const shim_family_state *state) {
    plans_object *plans = plans_of(m);
    const member_plan *known = plans != NULL && plans->plans ? &plans->plans[index] : NULL;
    return known != NULL && known->made != NULL && known->regions == state->regions ? known
                                                                                     : NULL;
}

static void plan_clear(member_plan *p) {
    PyMem_Free(p->bits);
    Py_CLEAR(p->made);
    *p = (member_plan){0};
}

/* Take a plan tuple's fields into `p`; false if it is malformed. */
static bool plan_take(member_plan *p, PyObject *made, bool end) {
    Py_ssize_t fields = end ? END_MEMBERS + 1 : BEGIN_AFTER + 1;
    if (!PyTuple_Check(made) || PyTuple_Size(made) != fields) {
        return false;
    }
    member_plan taken = {.made = made, .regions = PyTuple_GetItem(made, PLAN_REGIONS)};
    if (end) {
        char *bytes;
        Py_ssize_t size;
        taken.after = PyTuple_GetItem(made, END_AFTER);
        if (PyBytes_AsStringAndSize(PyTuple_GetItem(made, END_BITS), &bytes, &size) < 0 ||
            size % (Py_ssize_t)sizeof(member_bits) != 0) {
            return false;
        }
        taken.count = size / (Py_ssize_t)sizeof(member_bits);
        taken.bits = PyMem_Malloc(size > 0 ? (size_t)size : 1);
        if (taken.bits == NULL) {
            return false;
        }
        memcpy(taken.bits, bytes, (size_t)size);
    } else {
        taken.use = PyTuple_GetItem(made, BEGIN_USE);
        taken.after = PyTuple_GetItem(made, BEGIN_AFTER);
    }
    plan_clear(p);
    *p = taken;
    Py_INCREF(made);
    return true;
}

/* Make the plan at `index` of the member's plans: `maker(family, raw, *more)`, whose
 * arguments `more` (a new reference) is taken. Ctrl-C is held meanwhile (a KeyboardInterrupt
 * here would be lost); whatever fails, the call goes on in Python, which meets the failure
 * again. The maker's None is a plan for no state. */
static void make_plan(const shim_member *m, int index, PyObject *maker, PyObject *more) {
    plans_object *plans = plans_of(m);
    PyObject *arguments = more ? PyTuple_New(2 + PyTuple_Size(more)) : NULL;
    if (arguments != NULL) {
        PyTuple_SetItem(arguments, 0, Py_NewRef(shim_record_field(m, RECORD_FAMILY)));
        PyTuple_SetItem(arguments, 1, Py_NewRef(shim_record_field(m, RECORD_RAW)));
        for (Py_ssize_t i = 0; i < PyTuple_Size(more); i++) {
            PyTuple_SetItem(arguments, 2 + i, Py_NewRef(PyTuple_GetItem(more, i)));
        }
    }
    Py_XDECREF(more);
    PyObject *made = NULL;
    if (plans != NULL && arguments != NULL) {
        shim_signals_hold();
        made = PyObject_Call(maker, arguments, NULL);
        shim_signals_release();
    }
    Py_XDECREF(arguments);
    if (made != NULL && made != Py_None) {
        /* (a code the collector ran during the call may have dropped the record: `plans`
         * lives on, held by the member) */
        if (plans->plans == NULL) {
            plans->plans = PyMem_Calloc(PLANS, sizeof *plans->plans);
        }
        if (plans->plans != NULL) {
            plan_take(&plans->plans[index], made, index >= BEGIN_PLANS);
        }
    }
    Py_XDECREF(made);
    PyErr_Clear();
}

/* Give the family the regions `after`. */
static void set_regions(shim_family_state *state, PyObject *after) {
    if (after != state->regions) {
        PyObject *before = state->regions;
        state->regions = Py_NewRef(after);
        Py_XDECREF(before); /* (last: its deallocation may run code that reads the state) */
    }
}

int shim_shared_begin(shim_member *m, bool host_write, bool plan) {
    shim_family_state *state = state_of(m);
    if (state == NULL) {
        return SHIM_SHARED_DECLINED;
    }
    int index = use_kind(m) + (host_write ? USE_KINDS : 0);
    const member_plan *known = plan_for(m, index, state);
    if (known == NULL) {
        if (!plan) {
            return SHIM_SHARED_DECLINED;
        }
        make_plan(m, index, s_begin_plan,
                  Py_BuildValue("(OOO)", m->output ? Py_True : Py_False,
                                m->replaces ? Py_True : Py_False, host_write ? Py_True : Py_False));
        return SHIM_SHARED_PLANNED;
    }
    if (PyList_Append(shim_record_field(m, RECORD_USES), known->use) < 0) {
        PyErr_Clear();
        return SHIM_SHARED_DECLINED;
    }
    if (m->replaces) { /* its results replace what either side held */
        shim_flags_assign(m->raw, halide_buffer_flag_host_dirty | halide_buffer_flag_device_dirty,
                          false);
    }
    PyObject *previous = m->shared_use;
    m->use = m->shared_use = Py_NewRef(known->use); /* (its own: the plan may be replaced) */
    Py_XDECREF(previous);
    set_regions(state, known->after);
    return SHIM_SHARED_DONE;
}

/* Give each member the dirty bits the plan lists, setting before clearing, as
 * families._put_dirty does: a member never looks clean, even for a moment, where it is not. */
static void put_bits(const member_plan *known) {
    const uint64_t dirty = halide_buffer_flag_host_dirty | halide_buffer_flag_device_dirty;
    for (Py_ssize_t i = 0; i < known->count; i++) {
        halide_buffer_t *raw = (halide_buffer_t *)(uintptr_t)known->bits[i].address;
        uint64_t now = shim_flags_get(raw) & dirty, want = known->bits[i].bits & dirty;
        if (want & ~now) {
            shim_flags_assign(raw, want & ~now, true);
        }
        if (now & ~want) {
            shim_flags_assign(raw, now & ~want, false);
        }
    }
}

int shim_shared_end(const shim_member *m, bool plan) {
    PyObject *uses = shim_record_field(m, RECORD_USES);
    shim_family_state *state = state_of(m);
    if (state == NULL || PyList_Size(uses) != 1 || PyList_GetItem(uses, 0) != m->shared_use) {
        PyErr_Clear();
        return SHIM_SHARED_DECLINED; /* other calls use the family: their members' bits */
    }
    int side = !m->output ? 0
                          : (int)(shim_flags_get(m->raw) & (halide_buffer_flag_host_dirty |
                                                            halide_buffer_flag_device_dirty));
    int index = BEGIN_PLANS + use_kind(m) * SIDES + side;
    const member_plan *known = plan_for(m, index, state);
    if (known == NULL) {
        if (!plan) {
            return SHIM_SHARED_DECLINED;
        }
        make_plan(m, index, s_end_plan, Py_BuildValue("(Oi)", m->shared_use, side));
        return SHIM_SHARED_PLANNED;
    }
    if (PySequence_DelItem(uses, 0) < 0) {
        PyErr_Clear();
        return SHIM_SHARED_DECLINED;
    }
    put_bits(known);
    set_regions(state, known->after);
    return SHIM_SHARED_DONE;
}

/* --- the plans object ---------------------------------------------------------------------- */

static void plans_dealloc(PyObject *self) {
    member_plan *plans = ((plans_object *)self)->plans;
    for (int i = 0; plans != NULL && i < PLANS; i++) {
        plan_clear(&plans[i]);
    }
    PyMem_Free(plans);
    shim_object_free(self);
}

static PyType_Slot plans_slots[] = {
    {Py_tp_dealloc, plans_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "What calls on a Buffer do in its shared family, remembered by the C fast "
                "paths (native_stubs/fast/shared_records.c)."},
    {0, NULL},
};

static PyType_Spec plans_spec = {
    "shim._native.MemberPlans", sizeof(plans_object), 0, Py_TPFLAGS_DEFAULT, plans_slots,
};

void *shim_member_plans_type(void) {
    if (s_plans_type == NULL) {
        s_plans_type = (PyTypeObject *)PyType_FromSpec(&plans_spec);
    }
    return s_plans_type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}

bool shim_shared_records_ready(void) {
    if (s_begin_plan != NULL) {
        return true;
    }
    PyObject *aliasing = PyImport_ImportModule("shim.memory.aliasing");
    PyObject *families = PyImport_ImportModule("shim.memory.families");
    PyObject *family_type = families ? PyObject_GetAttrString(families, "Family") : NULL;
    PyObject *base = shim_family_state_type();
    PyObject *begin_plan = aliasing ? PyObject_GetAttrString(aliasing, "begin_plan") : NULL;
    PyObject *end_plan = aliasing ? PyObject_GetAttrString(aliasing, "end_plan") : NULL;
    bool ready = family_type && begin_plan && end_plan && base && shim_member_plans_type() &&
                 PyType_Check(family_type) &&
                 PyType_IsSubtype((PyTypeObject *)family_type, (PyTypeObject *)base);
    Py_XDECREF(aliasing);
    Py_XDECREF(families);
    if (!ready) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "shim.memory.families.Family is not a FamilyState");
        }
        Py_XDECREF(family_type);
        Py_XDECREF(begin_plan);
        Py_XDECREF(end_plan);
        return false;
    }
    s_family_type = (PyTypeObject *)family_type;
    s_end_plan = end_plan;
    s_begin_plan = begin_plan; /* last: it says the rest is ready */
    return true;
}
