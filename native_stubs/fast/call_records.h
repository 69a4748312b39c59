/* A pipeline call's records in its buffers' families (call_records.c), for the fast paths
 * (fastcall.c, prepared_call.c). Include after Python.h and shim_native.h. */
#ifndef SHIM_FAST_CALL_RECORDS_H
#define SHIM_FAST_CALL_RECORDS_H

#include "fast/members.h"

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

/* Readies call_records.c for shim.Buffer and families.FamilyLock, whose slots it reads and
 * writes; false with an exception set. Before any other call here. */
bool shim_call_records_ready(PyObject *buffer_type, PyObject *lock_type);
/* A shim.Buffer's call record (a new reference), NULL with an exception set. */
PyObject *shim_buffer_record(PyObject *buffer);

#endif
