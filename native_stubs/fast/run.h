/* A pipeline's run from the fast paths (run.c), for a plain call (fastcall.c) and a prepared
 * call's run (prepared_call.c). Include after Python.h and shim_native.h. */
#ifndef SHIM_FAST_RUN_H
#define SHIM_FAST_RUN_H

enum { SHIM_FAST_RAN, SHIM_FAST_DECLINED };

/* The structs a plain call made over the caller's numpy arrays for a device pipeline
 * (fastcall.c): once the pipeline has run, still in its call context and without the GIL, the
 * outputs' results go to host memory (if it succeeded) and every one's device memory is
 * freed (whatever happened), as the general path does for its temporary Buffers
 * (PreparedCall._results, then free_temporaries). A failure of either is the call's failure,
 * unless the run failed first. NULL or count 0: none. */
typedef struct {
    halide_buffer_t **buffers;
    const bool *to_host; /* per struct: an output, whose results the caller's array receives */
    int count;
    /* The outputs among them: what the call replaces (shim_call_set_replaced). */
    halide_buffer_t **replaced;
    int replaced_count;
} shim_fast_temporaries;

/* Run a pipeline in the calling thread's fast-path call context, on the thread's stream, with
 * the GIL released: shim_call_run's checks of `buffers` against `backends`, then argv_fn, then
 * what `temporaries` need.
 * DECLINED (nothing ran) at exit or without memory; else RAN with the call's status (which
 * may be SHIM_CALL_NEEDS_PREPARATION: then it did not run either) and `report`: NULL when the
 * call succeeded without printing, else what it printed and its failure, taken from the
 * context at once (a new reference, for shim_fast_report). Taken at once because the end of
 * the call's uses may run Python code (runtime.end_call, a finalizer the collector runs
 * then, or work finalizers left for the end of a critical section: shim/base/sections.py), which
 * may make another call on this thread, in the same context.
 * GIL held. */
int shim_fast_run(int (*argv_fn)(void **), void **argv, halide_buffer_t **buffers, int count,
                  unsigned backends, const shim_fast_temporaries *temporaries, int *status,
                  PyObject **report);

/* A pipeline's bounds query (argv's buffers without memory) in the fast paths' call context,
 * with the GIL held: DECLINED (nothing ran) at exit or without memory; else RAN with the
 * query's status and its `report` as shim_fast_run gives them, for shim_fast_report (which
 * takes any exception a device callback of the query left for the call: generated code
 * initializes its GPU kernels before answering a query). GIL held. */
int shim_fast_query(int (*argv_fn)(void **), void **argv, int *status, PyObject **report);

/* After shim_fast_run: hand its `report` (stolen; NULL: nothing to report) to `finish(status,
 * errors, prints, call id, prints dropped)`, which raises for a failure. 0, or -1 with the
 * exception set. */
int shim_fast_report(PyObject *finish, PyObject *report);

#endif
