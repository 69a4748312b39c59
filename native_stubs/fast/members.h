/* A buffer argument of a fast call and its call record (members.c): what the call's records in
 * its family (call_records.c, and shared_records.c for a shared family) work on. Include after
 * Python.h and shim_native.h. */
#ifndef SHIM_FAST_MEMBERS_H
#define SHIM_FAST_MEMBERS_H

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

#endif
