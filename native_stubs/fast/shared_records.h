/* A call's uses of members of shared families (shared_records.c), for call_records.c, which
 * has checked that no thread holds the family's lock. What these do depends only on the
 * family's state, so they do it from plans remembered by state, made in Python
 * (shim/memory/aliasing.py) the first time: PLANNED when one was just made (Python code ran: the
 * caller checks the lock again, then calls again with `plan` false). Include after Python.h
 * and shim_native.h. */
#ifndef SHIM_FAST_SHARED_RECORDS_H
#define SHIM_FAST_SHARED_RECORDS_H

#include "fast/members.h"

enum { SHIM_SHARED_DONE, SHIM_SHARED_DECLINED, SHIM_SHARED_PLANNED };
/* The beginning of the use (m->use, m->shared_use set when DONE). */
int shim_shared_begin(shim_member *m, bool host_write, bool plan);
/* The end of a use shim_shared_begin began, when no thread waits on the family's lock;
 * DECLINED: for runtime.end_call. */
int shim_shared_end(const shim_member *m, bool plan);
/* Readies shared_records.c; false with an exception set. */
bool shim_shared_records_ready(void);

#endif
