/* What the translation units that use Python's C API (fastcall.c, prepared_call.c) share.
 * Include after Python.h and shim_native.h. */
#ifndef SHIM_FASTCALL_H
#define SHIM_FASTCALL_H

enum { SHIM_FAST_RAN, SHIM_FAST_DECLINED };

/* Run a pipeline in the calling thread's fast-path call context, on the thread's stream, with
 * the GIL released: shim_call_run's checks of `buffers` against `backends`, then argv_fn.
 * DECLINED (nothing ran) at exit or without memory; else RAN with the call's status (which
 * may be SHIM_CALL_NEEDS_PREPARATION: then it did not run either) and `report`: NULL when the
 * call succeeded without printing, else what it printed and its failure, taken from the
 * context at once (a new reference, for shim_fast_report). Taken at once because the end of
 * the call's uses may run Python code (runtime.end_call, a finalizer the collector runs
 * then, or work finalizers left for the end of a critical section: shim/base/sections.py), which may make another call on this thread, in the same context.
 * GIL held. */
int shim_fast_run(int (*argv_fn)(void **), void **argv, halide_buffer_t **buffers, int count,
                  unsigned backends, int *status, PyObject **report);

/* After shim_fast_run: hand its `report` (stolen; NULL: nothing to report) to `finish(status,
 * errors, prints, call id, prints dropped)`, which raises for a failure. 0, or -1 with the
 * exception set. */
int shim_fast_report(PyObject *finish, PyObject *report);

/* The end of a tp_dealloc of the fast paths' types (heap types): free the object, drop the
 * type's reference. */
void shim_object_free(PyObject *self);

/* An allocation family's state that the fast paths read (shim.memory.families.Family's base,
 * family_state.c). */
typedef struct {
    PyObject_HEAD
    PyObject *regions; /* Family.regions: a tuple, replaced, never changed in place */
} shim_family_state;

/* A family lock's state that the fast paths read (shim.memory.families.FamilyLock's base). */
typedef struct {
    PyObject_HEAD
    PyObject *owner; /* FamilyLock.owner: the holding thread's id, None or NULL when free */
    int waiting;     /* FamilyLock.waiting: threads in its wait() */
} shim_lock_state;

/* A buffer argument of a call, for its records in its family (call_records.c). */
typedef struct {
    halide_buffer_t *raw;
    PyObject *record; /* the shim.Buffer's call record (shim/memory/families.py, call_record) */
    PyObject *buffer; /* the shim.Buffer */
    PyObject *use;    /* the Use the call records (borrowed: from the record or shared_use) */
    PyObject *shared_use; /* the Use recorded in a shared family (shared_records.c), or NULL */
    bool output;      /* the call writes it */
    bool replaces;    /* ... without reading it first (no input of the call overlaps it) */
    bool array_input; /* it wraps a caller's array: host-dirty before every run */
    bool to_host;     /* an output given as an array: its results go to host memory */
} shim_member;

/* The fields of a call record (a tuple). */
enum {
    RECORD_ADDRESS,       /* the struct's address, an int */
    RECORD_RAW,           /* the struct, a cffi pointer */
    RECORD_FAMILY,        /* its Family */
    RECORD_LOCK,          /* family.lock */
    RECORD_USES,          /* family.uses, a list */
    RECORD_USE_INPUT,     /* the Use of a call reading it */
    RECORD_USE_REPLACING, /* ... of a call writing it without reading it */
    RECORD_USE_UPDATING,  /* ... of a call writing it and reading it */
    RECORD_ARRAY,         /* the Buffer's host memory, a numpy array */
    RECORD_PLANS,         /* what calls do in its family once shared (shared_records.c) */
    RECORD_FIELDS
};

/* A field of a member's record, borrowed. */
static inline PyObject *shim_record_field(const shim_member *m, int index) {
    return PyTuple_GetItem(m->record, index);
}

/* Fill `m` (holding references to the buffer and its record); false with an exception set
 * for a malformed record. shim_member_clear lets go of them. */
bool shim_member_init(shim_member *m, PyObject *buffer, PyObject *record, bool output,
                      bool replaces, bool array_input, bool to_host);
void shim_member_clear(shim_member *m);

/* Record the call's uses in the members' families (`host_write`: the pipeline writes its
 * outputs on the host); false (nothing recorded) where that cannot be done at once: the caller
 * then leaves the call to Python. */
bool shim_members_begin(shim_member *members, int count, PyObject *end_call, bool host_write);
/* The pipeline ran (`host_write`: on the CPU): outputs become host-dirty. */
void shim_members_ran(const shim_member *members, int count, bool host_write);
/* End every use (through `end_call`, runtime.end_call, where that cannot be done at once),
 * then run work deferred to the families; -1 with the first exception set. */
int shim_members_end(const shim_member *members, int count, PyObject *end_call);
/* The Buffers' read state (inputs read, outputs unread) and outputs given as arrays brought
 * to host memory; -1 with an exception set. */
int shim_members_results(const shim_member *members, int count);

/* A call's uses of members of shared families (shared_records.c), for call_records.c, which
 * has checked that no thread holds the family's lock. What these
 * do depends only on the family's state, so they do it from plans remembered by state, made
 * in Python (shim/memory/aliasing.py) the first time: PLANNED when one was just made (Python code
 * ran: the caller checks the lock again, then calls again with `plan` false). */
enum { SHIM_SHARED_DONE, SHIM_SHARED_DECLINED, SHIM_SHARED_PLANNED };
/* The beginning of the use (m->use, m->shared_use set when DONE). */
int shim_shared_begin(shim_member *m, bool host_write, bool plan);
/* The end of a use shim_shared_begin began, when no thread waits on the family's lock;
 * DECLINED: for runtime.end_call. */
int shim_shared_end(const shim_member *m, bool plan);
/* Readies shared_records.c; false with an exception set. */
bool shim_shared_records_ready(void);

/* Readies call_records.c for shim.Buffer and families.FamilyLock, whose slots it reads and
 * writes; false with an exception set. Before any other call here. */
bool shim_call_records_ready(PyObject *buffer_type, PyObject *lock_type);
/* A shim.Buffer's call record (a new reference), NULL with an exception set. */
PyObject *shim_buffer_record(PyObject *buffer);

#endif
