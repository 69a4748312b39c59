/* The fast path of a pipeline call (shim/calls/pipeline.py): a pipeline called with shim.Buffers,
 * numpy arrays and Python numbers runs from here, with no per-argument Python
 * work: the arrays' buffer views become halide_buffer_t structs on the stack, Buffers give
 * their own struct and have the call recorded in their families (call_records.c), scalars
 * are converted and range-checked, the bounds check is a lookup in the pipeline's cache of
 * argument shapes that passed it (a new shape runs the bounds query here, and joins the cache
 * if it passes), and the pipeline runs with the GIL released, in the calling
 * thread's call context. On a device pipeline the arrays' structs are what the general path's
 * temporary Buffers are: inputs host-dirty, uploaded by the pipeline; once it has run, the
 * outputs' results copied to the arrays and every struct's device memory freed (fast/run.h),
 * all in C where the backend serves the allocations (devices/served.c).
 *
 * Whatever it does not handle exactly as the general path would (another kind of argument, a
 * value out of range, a shape the bounds query refuses, profiling) it declines before
 * anything has run, returning NotImplemented: the general path then takes the call, with its
 * messages for bad input. So the rules here are a subset of the general path's, never others.
 *
 * This translation unit uses Python's C API (the limited API of 3.11, which has the buffer
 * protocol); the rest of the library is plain C behind cffi. Python reaches it through
 * shim_fastcall_plan_type(), which shim/native/__init__.py calls with the GIL held (ctypes).
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include <float.h>
#include <math.h>
#include <string.h>

#include "shim_native.h"
#include "calls/call_context.h"
#include "calls/releases.h"
#include "calls/signals_held.h"
#include "profiling/profile.h"
#include "fast/call_records.h"
#include "fast/objects.h"
#include "fast/run.h"

enum role { ROLE_SCALAR, ROLE_INPUT, ROLE_OUTPUT, ROLE_USER_CONTEXT };
enum { MAX_ARGUMENTS = 64, MAX_DIMENSIONS = 16, BOUNDS_CACHE = 64 };

typedef struct {
    PyObject *name; /* str */
    int role, code, bits, dimensions;
    /* scalars: the declared range, where the argument has one (as the type's C value) */
    bool has_min, has_max, has_default;
    struct halide_scalar_value_t min, max, value_default;
    PyObject *dtype; /* buffers: the numpy dtype of memory the shim allocates for it; else None */
} argument_spec;

typedef struct {
    size_t size;
    unsigned char *bytes;
} bounds_key;

typedef struct {
    PyObject_HEAD
    int (*argv_fn)(void **);
    int count;
    argument_spec arguments[MAX_ARGUMENTS];
    int outputs;
    bool fast;             /* whether calls may take this path at all */
    bool host_write;       /* a CPU pipeline: numpy arrays welcome, outputs written on the host */
    unsigned backends;     /* the device backends the pipeline runs on (enum shim_backend bits) */
    PyObject *array_type;  /* numpy.ndarray */
    PyObject *buffer_type; /* shim.Buffer */
    PyObject *finish;      /* finish(result, errors, prints, call id, prints dropped): raises */
    PyObject *end_call;    /* runtime.end_call, for uses the fast path cannot end itself */
    PyObject *general_name; /* "_call_in_python" */
    PyObject *output_of_shape; /* Signature.output_of_shape(name, shape): a new shim.Buffer */
    /* A CPU pipeline's outputs given as shapes: numpy.zeros(shape, dtype) (as few bytes as
     * host_memory_limit at most: more is the general path's to refuse), run as arrays, then
     * returned as a result_type over the array (made here: make_result): PipelineResult
     * (shim/buffers/pipeline_result.py), of which one given back to a call is made a
     * shim.Buffer first (by reading its ``raw``), as the general path's first look at it
     * would. result_fresh: its FRESH, the other slots' first values. */
    PyObject *zeros, *result_type, *result_fresh, *raw_name, *array_name, *pending_name;
    long long host_memory_limit;
    bool made;              /* __init__ was called: never again (it may have failed halfway) */
    void *user_context;    /* what __user_context points to */
    /* Argument shapes and scalar values the bounds query accepted, most recent first. */
    bounds_key known[BOUNDS_CACHE];
    int known_count;
    size_t key_room;      /* see key_room() */
    int array_dimensions; /* the buffer arguments' dimensions, all told (up to 16 each) */
} plan_object;

/* --- the bounds cache: keys from the argv a call passes ---------------------------------- */

static size_t scalar_size(const argument_spec *a) {
    return a->bits <= 8 ? 1 : (size_t)a->bits / 8;
}

/* The key of a call's argv: every buffer's dimensions (min and extent: what the bounds query
 * looks at) and every scalar's bytes. NULL size 0 when it does not fit `room`. */
static size_t key_of(const plan_object *plan, void **argv, unsigned char *out, size_t room) {
    size_t n = 0;
#define PUT(ptr, len)                       \
    do {                                    \
        if (n + (len) > room) {             \
            return 0;                       \
        }                                   \
        memcpy(out + n, (ptr), (len));      \
        n += (len);                         \
    } while (0)
    for (int i = 0; i < plan->count; i++) {
        const argument_spec *a = &plan->arguments[i];
        if (a->role == ROLE_INPUT || a->role == ROLE_OUTPUT) {
            const halide_buffer_t *buf = argv[i];
            PUT(&buf->dimensions, sizeof buf->dimensions);
            for (int d = 0; d < buf->dimensions; d++) {
                PUT(&buf->dim[d].min, sizeof buf->dim[d].min);
                PUT(&buf->dim[d].extent, sizeof buf->dim[d].extent);
            }
        } else if (a->role == ROLE_SCALAR) {
            PUT(argv[i], scalar_size(a));
        }
    }
#undef PUT
    return n;
}

/* The most bytes a key of this plan's calls takes (plan_init): keys are built on the stack,
 * in no more room than that. */
static size_t key_room(const plan_object *plan) {
    size_t room = 1;
    for (int i = 0; i < plan->count; i++) {
        const argument_spec *a = &plan->arguments[i];
        if (a->role == ROLE_INPUT || a->role == ROLE_OUTPUT) {
            int dims = a->dimensions < MAX_DIMENSIONS ? a->dimensions : MAX_DIMENSIONS;
            room += sizeof(int32_t) + (size_t)dims * 2 * sizeof(int32_t);
        } else if (a->role == ROLE_SCALAR) {
            room += scalar_size(a);
        }
    }
    return room;
}

static bool known(plan_object *plan, void **argv) {
    unsigned char key[plan->key_room > 0 ? plan->key_room : 1]; /* (0: an unmade plan) */
    size_t size = key_of(plan, argv, key, sizeof key);
    for (int i = 0; size && i < plan->known_count; i++) {
        bounds_key *k = &plan->known[i];
        if (k->size == size && memcmp(k->bytes, key, size) == 0) {
            if (i > 0) { /* most recent first */
                bounds_key hit = *k;
                memmove(&plan->known[1], &plan->known[0], (size_t)i * sizeof hit);
                plan->known[0] = hit;
            }
            return true;
        }
    }
    return false;
}

static void remember(plan_object *plan, void **argv) {
    unsigned char key[plan->key_room > 0 ? plan->key_room : 1]; /* (0: an unmade plan) */
    size_t size = key_of(plan, argv, key, sizeof key);
    unsigned char *bytes = size ? PyMem_Malloc(size) : NULL;
    if (bytes == NULL) {
        return; /* unremembered: the next call runs the query again */
    }
    memcpy(bytes, key, size);
    if (plan->known_count == BOUNDS_CACHE) {
        PyMem_Free(plan->known[BOUNDS_CACHE - 1].bytes);
        plan->known_count--;
    }
    memmove(&plan->known[1], &plan->known[0], (size_t)plan->known_count * sizeof plan->known[0]);
    plan->known[0] = (bounds_key){size, bytes};
    plan->known_count++;
}

static void **argv_at(PyObject *address) {
    void *argv = PyLong_AsVoidPtr(address);
    if (argv == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "argv is NULL");
    }
    return argv;
}

static PyObject *plan_known(plan_object *plan, PyObject *address) {
    void **argv = argv_at(address);
    return argv == NULL ? NULL : PyBool_FromLong(known(plan, argv));
}

static PyObject *plan_remember(plan_object *plan, PyObject *address) {
    void **argv = argv_at(address);
    if (argv == NULL) {
        return NULL;
    }
    remember(plan, argv);
    Py_RETURN_NONE;
}

/* A 0-D input goes into the bounds query as itself (_queried_as_itself, shim/calls/binding.py):
 * it has no region to report, and the query may load its value (an extern stage's argument). */
static bool queried_as_itself(const argument_spec *a, const halide_buffer_t *given) {
    return a->role == ROLE_INPUT && given->dimensions == 0;
}

/* Whether the bounds query accepts this argv, as the general path runs it (Runner.run_query:
 * a failure raised, what it printed printed) and checks it (check_bounds, shim/calls/binding.py):
 * 1 if each input covers the region the pipeline reads and each output is the region it
 * writes; 0 to decline (the general path then runs it again and says why); -1 with the query's
 * failure raised. Signal handlers held (the general path's query defers them). */
static int bounds_accepted(plan_object *plan, void **argv) {
    const int n = plan->count > 0 ? plan->count : 1;
    void *query_argv[n];
    halide_buffer_t queries[n];
    halide_dimension_t dims[plan->array_dimensions > 0 ? plan->array_dimensions : 1];
    int used = 0;
    for (int i = 0; i < plan->count; i++) {
        const argument_spec *a = &plan->arguments[i];
        query_argv[i] = argv[i];
        if (a->role != ROLE_INPUT && a->role != ROLE_OUTPUT) {
            continue;
        }
        const halide_buffer_t *given = argv[i];
        if (queried_as_itself(a, given)) {
            continue;
        }
        if (given->dimensions > MAX_DIMENSIONS || used + given->dimensions > plan->array_dimensions) {
            return 0;
        }
        /* Halide's bounds-query form: the shape and type, no memory (_bounds_query_buffer). */
        memset(&queries[i], 0, sizeof queries[i]);
        /* Code and bits only: another thread calling with this Buffer may be storing its
         * lanes (shim_call_run), and copying the whole type would read them unordered
         * (ThreadSanitizer's report); the query's lanes are the pipeline's release's anyway. */
        queries[i].type.code = given->type.code;
        queries[i].type.bits = given->type.bits;
        queries[i].type.lanes = shim_release_of((const void *)plan->argv_fn)->scalar_lanes;
        queries[i].dimensions = given->dimensions;
        queries[i].dim = &dims[used];
        memcpy(&dims[used], given->dim, (size_t)given->dimensions * sizeof *dims);
        used += given->dimensions;
        query_argv[i] = &queries[i];
    }
    /* The shapes as they are now: a device callback of the query may run Python code, and
     * another thread may crop one of the call's Buffers in place meanwhile. */
    unsigned char key[plan->key_room > 0 ? plan->key_room : 1], again[sizeof key];
    size_t size = key_of(plan, argv, key, sizeof key);
    int status = 0;
    PyObject *report;
    if (size == 0 || shim_fast_query(plan->argv_fn, query_argv, &status, &report) != SHIM_FAST_RAN) {
        return 0;
    }
    if (shim_fast_report(plan->finish, report) < 0) {
        return -1;
    }
    if (status != 0 || key_of(plan, argv, again, sizeof again) != size ||
        memcmp(key, again, size) != 0) {
        return 0;
    }
    for (int i = 0; i < plan->count; i++) {
        const argument_spec *a = &plan->arguments[i];
        if (a->role != ROLE_INPUT && a->role != ROLE_OUTPUT) {
            continue;
        }
        const halide_buffer_t *given = argv[i];
        if (queried_as_itself(a, given)) {
            continue;
        }
        for (int d = 0; d < queries[i].dimensions; d++) {
            int64_t want_min = queries[i].dim[d].min, want_extent = queries[i].dim[d].extent;
            int64_t have_min = given->dim[d].min, have_extent = given->dim[d].extent;
            if (a->role == ROLE_OUTPUT ? want_min != have_min || want_extent != have_extent
                                       : want_extent > 0 && (want_min < have_min ||
                                                             want_min + want_extent >
                                                                 have_min + have_extent)) {
                return 0;
            }
        }
    }
    return 1;
}

/* --- scalars ---------------------------------------------------------------------------- */

static bool is_integer_type(const argument_spec *a) {
    return a->code == halide_type_int || a->code == halide_type_uint;
}

/* `value` as the argument's C value, within its type and declared range; false to decline. */
static bool convert_scalar(const argument_spec *a, PyObject *value, struct halide_scalar_value_t *out) {
    memset(out, 0, sizeof *out);
    if (a->code == halide_type_uint && a->bits == 1) {
        if (!PyBool_Check(value)) {
            return false;
        }
        out->u.b = value == Py_True;
        return true;
    }
    if (is_integer_type(a)) {
        if (!PyLong_CheckExact(value)) {
            return false; /* (bool is a subclass of int: refused by the general path) */
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return false;
        }
        long long lo, hi;
        if (a->code == halide_type_int) {
            lo = a->bits == 64 ? LLONG_MIN : -(1LL << (a->bits - 1));
            hi = a->bits == 64 ? LLONG_MAX : (1LL << (a->bits - 1)) - 1;
        } else {
            lo = 0;
            hi = a->bits == 64 ? LLONG_MAX : (long long)((1ULL << a->bits) - 1);
        }
        if (v < lo || v > hi || (a->has_min && v < a->min.u.i64) ||
            (a->has_max && v > a->max.u.i64)) {
            return false;
        }
        switch (a->bits) {
        case 8: out->u.i8 = (int8_t)v; break;
        case 16: out->u.i16 = (int16_t)v; break;
        case 32: out->u.i32 = (int32_t)v; break;
        default: out->u.i64 = v; break;
        }
        return true;
    }
    if (a->code == halide_type_float && (a->bits == 32 || a->bits == 64)) {
        double v;
        if (PyFloat_CheckExact(value)) {
            v = PyFloat_AsDouble(value);
        } else if (PyLong_CheckExact(value)) {
            v = PyLong_AsDouble(value);
            if (v == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return false;
            }
        } else {
            return false;
        }
        double largest = a->bits == 32 ? FLT_MAX : DBL_MAX;
        if ((isfinite(v) && fabs(v) > largest) || (a->has_min && v < a->min.u.f64) ||
            (a->has_max && v > a->max.u.f64)) {
            return false;
        }
        if (a->bits == 32) {
            out->u.f32 = (float)v;
        } else {
            out->u.f64 = v;
        }
        return true;
    }
    return false; /* float16, bfloat16, handles: the general path */
}

/* --- buffers ---------------------------------------------------------------------------- */

/* The buffer-protocol format of numpy's native arrays of the argument's element type. */
static bool format_matches(const argument_spec *a, const char *format, Py_ssize_t itemsize) {
    if (format == NULL) {
        return false;
    }
    if (format[0] == '@') {
        format++;
    }
    if (format[0] == '\0' || format[1] != '\0') {
        return false;
    }
    char c = format[0];
    if (itemsize * 8 != (a->bits == 1 ? 8 : a->bits)) {
        return false;
    }
    switch (a->code) {
    case halide_type_float:
        return (a->bits == 32 && c == 'f') || (a->bits == 64 && c == 'd');
    case halide_type_int:
        return strchr("bhilq", c) != NULL;
    case halide_type_uint:
        return a->bits == 1 ? c == '?' : strchr("BHILQ", c) != NULL;
    default:
        return false;
    }
}

/* A halide_buffer_t over `view`, as the general path would make it (Halide's x is the last
 * numpy axis); false to decline: what Halide cannot address as it is, empty or huge arrays. */
static bool describe(const argument_spec *a, const Py_buffer *view, halide_buffer_t *buf,
                     halide_dimension_t *dims) {
    if (view->ndim != a->dimensions || view->ndim > MAX_DIMENSIONS || view->suboffsets != NULL ||
        !format_matches(a, view->format, view->itemsize)) {
        return false;
    }
    if (view->ndim > 1 && PyBuffer_IsContiguous(view, 'F') && !PyBuffer_IsContiguous(view, 'C')) {
        return false; /* Fortran order: the general path warns (shim.LayoutWarning) */
    }
    long long elements = 1;
    for (int d = 0; d < view->ndim; d++) {
        int axis = view->ndim - 1 - d;
        Py_ssize_t extent = view->shape[axis], stride = view->strides[axis];
        if (extent <= 0 || extent > INT32_MAX || stride < 0 || stride % view->itemsize ||
            stride / view->itemsize > INT32_MAX) {
            return false;
        }
        if (d == 0 && extent != 1 && stride != view->itemsize) {
            return false; /* Halide wants unit stride in x */
        }
        elements *= extent;
        if (elements > INT32_MAX) {
            return false;
        }
        dims[d] = (halide_dimension_t){0, (int32_t)extent, (int32_t)(stride / view->itemsize), 0};
    }
    memset(buf, 0, sizeof *buf);
    buf->host = view->buf;
    buf->type.code = (uint8_t)a->code;
    buf->type.bits = (uint8_t)a->bits;
    buf->dimensions = view->ndim;
    buf->dim = dims;
    buf->flags = a->role == ROLE_INPUT ? halide_buffer_flag_host_dirty : 0;
    return true;
}

/* After a Python call of the fast path's failed: an Exception is the general path's to meet
 * again and report (decline: NotImplemented, error cleared); anything else (a
 * KeyboardInterrupt raised in there) goes to the caller (NULL, error kept). */
static PyObject *declined(void) {
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return Py_NotImplemented;
    }
    return NULL;
}

static bool is_shape(PyObject *value) {
    return PyTuple_CheckExact(value) || PyList_CheckExact(value);
}

/* The memory a CPU pipeline's output given as the shape `value` (numpy order) gets, as the
 * general path allocates it (shim/calls/arguments.py, output_of_shape): a new, zeroed numpy
 * array. NULL with no error set for a shape the general path must judge (not one Python int
 * per dimension, each at least 1, more elements or bytes than surely fit); NULL with numpy's
 * error where making it failed. */
static PyObject *array_of_shape(plan_object *plan, const argument_spec *a, PyObject *value) {
    Py_ssize_t count = PySequence_Size(value);
    if (count != a->dimensions || count > MAX_DIMENSIONS || a->dtype == Py_None) {
        return NULL;
    }
    PyObject *shape = PySequence_Tuple(value);
    if (shape == NULL) {
        PyErr_Clear();
        return NULL;
    }
    long long elements = 1;
    for (Py_ssize_t d = 0; d < count; d++) {
        PyObject *extent = PyTuple_GetItem(shape, d); /* borrowed */
        int overflow = 0;
        long long n = PyLong_CheckExact(extent) ? PyLong_AsLongLongAndOverflow(extent, &overflow) : 0;
        if (n < 1 || n > INT32_MAX || overflow) {
            PyErr_Clear();
            Py_DECREF(shape);
            return NULL;
        }
        elements *= n;
        if (elements > INT32_MAX) {
            Py_DECREF(shape);
            return NULL;
        }
    }
    if (elements * (a->bits <= 8 ? 1 : a->bits / 8) > plan->host_memory_limit) {
        Py_DECREF(shape);
        return NULL;
    }
    PyObject *array = PyObject_CallFunctionObjArgs(plan->zeros, shape, a->dtype, NULL);
    Py_DECREF(shape);
    return array;
}

/* The result for the output `name` over `array`, which the pipeline wrote: a result_type whose
 * slots are as its FRESH says, with `array` and `name` (shim/buffers/pipeline_result.py). Made
 * here rather than by a Python classmethod: a call that returns one costs 0.3 us less. */
static PyObject *make_result(plan_object *plan, PyObject *array, PyObject *name) {
    PyTypeObject *type = (PyTypeObject *)plan->result_type;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    PyObject *result = alloc(type, 0);
    if (result == NULL) {
        return NULL;
    }
    /* _pending last: a result whose finalizer runs on a failure halfway finds it unset, which
     * ManagedBuffer._finalize takes as a construction that failed. */
    bool made = PyObject_SetAttr(result, plan->array_name, array) == 0;
    Py_ssize_t count = made ? PyTuple_Size(plan->result_fresh) : 0;
    for (Py_ssize_t j = 0; made && j < count; j++) {
        PyObject *pair = PyTuple_GetItem(plan->result_fresh, j); /* borrowed */
        made = pair != NULL && PyTuple_Size(pair) == 2 &&
               PyObject_SetAttr(result, PyTuple_GetItem(pair, 0), PyTuple_GetItem(pair, 1)) == 0;
    }
    if (!made || PyObject_SetAttr(result, plan->pending_name, name) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "PipelineResult.FRESH: expected (slot, value) pairs");
        }
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

/* A shim.Buffer argument: its own struct, if it is what the argument takes (as the general
 * path checks it) and, for an output, over writable memory; false to decline. `m` holds the
 * Buffer and its record when this returns true. */
static bool buffer_argument(plan_object *plan, const argument_spec *a, PyObject *value,
                            shim_member *m) {
    PyObject *record = shim_buffer_record(value);
    bool made = record != NULL &&
                shim_member_init(m, value, record, a->role == ROLE_OUTPUT, false, false, false);
    Py_XDECREF(record);
    if (!made) {
        PyErr_Clear();
        return false;
    }
    const halide_buffer_t *buf = m->raw;
    bool fits = buf->type.code == a->code && buf->type.bits == a->bits &&
                buf->dimensions == a->dimensions;
    long long elements = 1;
    for (int d = 0; fits && d < buf->dimensions; d++) {
        elements *= buf->dim[d].extent;
        fits = buf->dim[d].extent > 0 && elements <= INT32_MAX;
    }
    if (fits && a->role == ROLE_OUTPUT) {
        Py_buffer view; /* Halide writes there: the memory must be writable now */
        fits = PyObject_GetBuffer(PyTuple_GetItem(m->record, RECORD_ARRAY), &view,
                                  PyBUF_STRIDES | PyBUF_WRITABLE) == 0;
        if (fits) {
            PyBuffer_Release(&view);
        } else {
            PyErr_Clear(); /* read-only: refused, with its name, by the general path */
        }
    }
    if (!fits) {
        shim_member_clear(m);
    }
    return fits;
}

/* An output no input of the call is: its results replace what either side held. False
 * (decline) for an output and an input that are different members of one shared family: whether
 * they overlap is for the general path to work out (runtime.begin_call). */
static bool mark_replacing(shim_member *members, int count) {
    for (int i = 0; i < count; i++) {
        members[i].replaces = members[i].output;
        for (int k = 0; members[i].output && k < count; k++) {
            if (members[k].output) {
                continue;
            }
            if (members[k].raw == members[i].raw) {
                members[i].replaces = false;
            } else if (shim_record_field(&members[k], RECORD_FAMILY) ==
                       shim_record_field(&members[i], RECORD_FAMILY)) {
                return false;
            }
        }
    }
    return true;
}

/* --- the call --------------------------------------------------------------------------- */

/* The call: NotImplemented when the general path must take it (nothing has run then). */
static PyObject *fast_call(plan_object *plan, PyObject *positional, PyObject *named) {
    if (!plan->fast || shim_profile_on() || shim_calls_closed()) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    /* The call's arrays are as long as the plan's arguments (not MAX_ARGUMENTS): a thread
     * may have as little as 32 KiB of stack (threading.stack_size). */
    const int n = plan->count > 0 ? plan->count : 1;
    Py_ssize_t given = PyTuple_Size(positional), used_names = 0;
    PyObject *values[n];
    int user_index = 0;
    for (int i = 0; i < plan->count; i++) {
        const argument_spec *a = &plan->arguments[i];
        values[i] = NULL;
        if (a->role == ROLE_USER_CONTEXT) {
            continue;
        }
        PyObject *by_name = named ? PyDict_GetItemWithError(named, a->name) : NULL; /* borrowed */
        if (by_name == NULL && PyErr_Occurred()) {
            PyErr_Clear(); /* (a str key's lookup cannot fail; the general path would say why) */
            Py_RETURN_NOTIMPLEMENTED;
        }
        if (user_index < given) {
            if (by_name != NULL) {
                Py_RETURN_NOTIMPLEMENTED; /* given twice: the general path says so */
            }
            values[i] = PyTuple_GetItem(positional, user_index);
        } else if (by_name != NULL) {
            values[i] = by_name;
            used_names++;
        }
        user_index++;
        if (values[i] == NULL && !(a->role == ROLE_SCALAR && a->has_default)) {
            Py_RETURN_NOTIMPLEMENTED; /* missing: estimates or an error, the general path's */
        }
    }
    if (given > user_index || (named && PyDict_Size(named) != used_names)) {
        Py_RETURN_NOTIMPLEMENTED; /* too many, or unknown names */
    }

    void *argv[n];
    struct halide_scalar_value_t scalars[n];
    halide_buffer_t buffers[n];
    halide_dimension_t dims[plan->array_dimensions > 0 ? plan->array_dimensions : 1];
    Py_buffer views[n];
    int viewed[n], nviews = 0, ndims = 0;
    shim_member members[n];
    halide_buffer_t *member_buffers[n];
    int nmembers = 0;
    /* Outputs given as a shape: the Buffers made for them, or a CPU pipeline's arrays (new
     * references), returned. */
    PyObject *made[n];
    int nmade = 0, made_index[n];
    /* A device pipeline's array arguments: uploaded, allocated and freed around the run. */
    halide_buffer_t *array_buffers[n], *array_replaced[n];
    bool array_outputs[n];
    shim_fast_temporaries temporaries = {array_buffers, array_outputs, 0, array_replaced, 0};
    PyObject *result = Py_NotImplemented;
    bool held = false;
    for (int i = 0; i < plan->count; i++) {
        const argument_spec *a = &plan->arguments[i];
        PyObject *value = values[i];
        if (a->role == ROLE_USER_CONTEXT) {
            argv[i] = &plan->user_context;
            continue;
        }
        if (a->role == ROLE_SCALAR) {
            if (value == NULL) {
                scalars[i] = a->value_default;
            } else if (!convert_scalar(a, value, &scalars[i])) {
                goto done;
            }
            argv[i] = &scalars[i];
            continue;
        }
        if ((PyObject *)Py_TYPE(value) == plan->result_type) {
            PyObject *raw = PyObject_GetAttr(value, plan->raw_name);
            if (raw == NULL) {
                result = declined();
                goto done;
            }
            Py_DECREF(raw);
        }
        if ((PyObject *)Py_TYPE(value) == plan->buffer_type ||
            (a->role == ROLE_OUTPUT && !plan->host_write && is_shape(value))) {
            if ((PyObject *)Py_TYPE(value) != plan->buffer_type) {
                /* A shape: the general path's Buffer for it (shim/calls/arguments.py). A shape
                 * it refuses is refused by the general path, with its message. */
                PyObject *buffer = PyObject_CallFunctionObjArgs(plan->output_of_shape, a->name,
                                                                value, NULL);
                if (buffer == NULL) {
                    result = declined();
                    goto done;
                }
                made[nmade] = value = buffer;
                made_index[nmade++] = i;
            }
            if (!buffer_argument(plan, a, value, &members[nmembers])) {
                goto done;
            }
            argv[i] = member_buffers[nmembers] = members[nmembers].raw;
            nmembers++;
        } else {
            if (a->role == ROLE_OUTPUT && is_shape(value)) {
                /* A CPU pipeline's output given as a shape: computed in a new array, then
                 * returned as the Buffer the general path's would be. */
                PyObject *array = array_of_shape(plan, a, value);
                if (array == NULL) {
                    result = PyErr_Occurred() ? declined() : result;
                    goto done;
                }
                made[nmade] = value = array;
                made_index[nmade++] = i;
            } else if ((PyObject *)Py_TYPE(value) != plan->array_type) {
                goto done; /* other array-likes */
            }
            int flags = PyBUF_RECORDS_RO | (a->role == ROLE_OUTPUT ? PyBUF_WRITABLE : 0);
            if (PyObject_GetBuffer(value, &views[i], flags) != 0) {
                PyErr_Clear(); /* read-only output: refused, with its name, by the general path */
                goto done;
            }
            viewed[nviews++] = i;
            if (a->dimensions > MAX_DIMENSIONS ||
                !describe(a, &views[i], &buffers[i], &dims[ndims])) {
                goto done;
            }
            ndims += a->dimensions;
            buffers[i].type.lanes = shim_release_of((const void *)plan->argv_fn)->scalar_lanes;
            argv[i] = &buffers[i];
            if (!plan->host_write) {
                array_buffers[temporaries.count] = &buffers[i];
                array_outputs[temporaries.count++] = a->role == ROLE_OUTPUT;
                if (a->role == ROLE_OUTPUT) {
                    array_replaced[temporaries.replaced_count++] = &buffers[i];
                }
            }
        }
    }
    /* From here to the end, signal handlers wait (calls/signals_held.h): a new shape's bounds
     * query, the call's records and run. */
    shim_signals_hold();
    held = true;
    if (!known(plan, argv)) {
        int accepted = bounds_accepted(plan, argv);
        if (accepted <= 0) {
            result = accepted < 0 ? NULL : result;
            goto done; /* 0: the general path runs the bounds query again, and says why */
        }
        remember(plan, argv);
    }
    if (!mark_replacing(members, nmembers) ||
        !shim_members_begin(members, nmembers, plan->end_call, plan->host_write)) {
        goto done;
    }
    int status = 0;
    PyObject *report;
    int outcome = shim_fast_run(plan->argv_fn, argv, member_buffers, nmembers, plan->backends,
                                &temporaries, &status, &report);
    bool ran = outcome == SHIM_FAST_RAN && status != SHIM_CALL_NEEDS_PREPARATION;
    if (ran) {
        shim_members_ran(members, nmembers, plan->host_write);
    }
    if (shim_members_end(members, nmembers, plan->end_call) < 0) {
        Py_XDECREF(report);
        result = NULL;
        goto done;
    }
    if (!ran) {
        goto done; /* nothing ran: the general path prepares the buffers, then runs */
    }
    if (shim_fast_report(plan->finish, report) < 0 ||
        shim_members_results(members, nmembers) < 0) {
        result = NULL;
        goto done;
    }
    for (int k = 0; k < nmade; k++) {
        int i = made_index[k];
        if (plan->host_write) { /* the array the pipeline wrote becomes its Buffer */
            PyObject *buffer = make_result(plan, made[k], plan->arguments[i].name);
            if (buffer == NULL) {
                result = NULL;
                goto done;
            }
            Py_DECREF(made[k]);
            made[k] = buffer;
        }
        values[i] = made[k]; /* (borrowed: made[] holds them until done) */
    }
    if (plan->outputs == 1) {
        for (int i = 0; i < plan->count; i++) {
            if (plan->arguments[i].role == ROLE_OUTPUT) {
                result = values[i];
            }
        }
        Py_INCREF(result);
    } else {
        result = PyTuple_New(plan->outputs);
        for (int i = 0, k = 0; result && i < plan->count; i++) {
            if (plan->arguments[i].role == ROLE_OUTPUT) {
                Py_INCREF(values[i]);
                PyTuple_SetItem(result, k++, values[i]);
            }
        }
    }
done:
    for (int k = 0; k < nviews; k++) {
        PyBuffer_Release(&views[viewed[k]]);
    }
    for (int k = 0; k < nmembers; k++) {
        shim_member_clear(&members[k]);
    }
    for (int k = 0; k < nmade; k++) {
        Py_DECREF(made[k]);
    }
    if (held) {
        shim_signals_release();
    }
    if (result == Py_NotImplemented) {
        Py_INCREF(result);
    }
    return result;
}

/* --- the plan object ------------------------------------------------------------------------ */

static int read_bound(PyObject *value, const argument_spec *a, struct halide_scalar_value_t *out) {
    if (value == Py_None) {
        return 0;
    }
    memset(out, 0, sizeof *out);
    if (is_integer_type(a) && !(a->bits == 1)) {
        int overflow = 0;
        out->u.i64 = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (PyErr_Occurred()) {
            return -1;
        }
        return overflow ? 0 : 1; /* a bound beyond int64 bounds nothing an int64 can hold */
    }
    out->u.f64 = PyFloat_AsDouble(value);
    return PyErr_Occurred() ? -1 : 1;
}

/* Plan(argv_fn address, arguments, fast, host_write, backends, numpy.ndarray, shim.Buffer,
 * families.FamilyLock, finish, end_call, output_of_shape, numpy.zeros, host memory limit,
 * PipelineResult): ``arguments`` is a sequence of (name, role, type code, bits,
 * dimensions, min, max, default C value as bytes or None, dtype or None). */
static int plan_init(plan_object *plan, PyObject *args, PyObject *kwargs) {
    PyObject *address, *specs, *array_type, *buffer_type, *lock_type, *finish, *end_call,
        *output_of_shape, *zeros, *result_type;
    int fast, host_write, backends;
    long long host_memory_limit;
    if (!PyArg_ParseTuple(args, "OOppiOOOOOOOLO", &address, &specs, &fast, &host_write, &backends,
                          &array_type, &buffer_type, &lock_type, &finish, &end_call,
                          &output_of_shape, &zeros, &host_memory_limit, &result_type)) {
        return -1;
    }
    if (plan->made) {
        PyErr_SetString(PyExc_TypeError, "a CallPlan is made once");
        return -1;
    }
    plan->made = true; /* even if this fails halfway: what it took would be taken twice */
    if (!shim_call_records_ready(buffer_type, lock_type) ||
        (plan->general_name = PyUnicode_InternFromString("_call_in_python")) == NULL ||
        (plan->raw_name = PyUnicode_InternFromString("raw")) == NULL ||
        (plan->array_name = PyUnicode_InternFromString("_array")) == NULL ||
        (plan->pending_name = PyUnicode_InternFromString("_pending")) == NULL ||
        (plan->result_fresh = PyObject_GetAttrString(result_type, "FRESH")) == NULL) {
        return -1;
    }
    plan->host_write = host_write;
    plan->backends = (unsigned)backends;
    plan->buffer_type = Py_NewRef(buffer_type);
    plan->end_call = Py_NewRef(end_call);
    plan->output_of_shape = Py_NewRef(output_of_shape);
    plan->zeros = Py_NewRef(zeros);
    plan->result_type = Py_NewRef(result_type);
    plan->host_memory_limit = host_memory_limit;
    plan->argv_fn = (int (*)(void **))PyLong_AsVoidPtr(address);
    if (PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t count = PySequence_Size(specs);
    if (count < 0 || count > MAX_ARGUMENTS) {
        if (count > MAX_ARGUMENTS) {
            fast = 0; /* more arguments than the stack arrays hold: the general path always */
            count = 0;
        } else {
            return -1;
        }
    }
    plan->count = (int)count;
    plan->fast = fast;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *spec = PySequence_GetItem(specs, i);
        argument_spec *a = &plan->arguments[i];
        PyObject *name, *lo, *hi, *value_default, *dtype;
        if (spec == NULL || !PyArg_ParseTuple(spec, "UiiiiOOOO", &name, &a->role, &a->code,
                                              &a->bits, &a->dimensions, &lo, &hi, &value_default,
                                              &dtype)) {
            Py_XDECREF(spec);
            return -1;
        }
        a->dtype = Py_NewRef(dtype);
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name); /* keyword lookups then match by identity */
        a->name = name;
        int has_min = read_bound(lo, a, &a->min), has_max = read_bound(hi, a, &a->max);
        Py_DECREF(spec);
        if (has_min < 0 || has_max < 0) {
            return -1;
        }
        a->has_min = has_min, a->has_max = has_max;
        if (value_default != Py_None) {
            char *bytes;
            Py_ssize_t size;
            if (PyBytes_AsStringAndSize(value_default, &bytes, &size) < 0) {
                return -1;
            }
            memset(&a->value_default, 0, sizeof a->value_default);
            memcpy(&a->value_default, bytes, (size_t)size < sizeof a->value_default
                                                 ? (size_t)size : sizeof a->value_default);
            a->has_default = true;
        }
        plan->outputs += a->role == ROLE_OUTPUT;
    }
    if (plan->outputs == 0) {
        plan->fast = false;
    }
    plan->key_room = key_room(plan);
    for (int i = 0; i < plan->count; i++) {
        const argument_spec *a = &plan->arguments[i];
        if (a->role == ROLE_INPUT || a->role == ROLE_OUTPUT) {
            plan->array_dimensions += a->dimensions < MAX_DIMENSIONS ? a->dimensions : MAX_DIMENSIONS;
        }
    }
    Py_INCREF(array_type);
    Py_INCREF(finish);
    plan->array_type = array_type;
    plan->finish = finish;
    return 0;
}

static void plan_dealloc(plan_object *plan) {
    for (int i = 0; i < plan->count; i++) {
        Py_XDECREF(plan->arguments[i].name);
        Py_XDECREF(plan->arguments[i].dtype);
    }
    for (int i = 0; i < plan->known_count; i++) {
        PyMem_Free(plan->known[i].bytes);
    }
    Py_XDECREF(plan->array_type);
    Py_XDECREF(plan->buffer_type);
    Py_XDECREF(plan->finish);
    Py_XDECREF(plan->end_call);
    Py_XDECREF(plan->general_name);
    Py_XDECREF(plan->output_of_shape);
    Py_XDECREF(plan->zeros);
    Py_XDECREF(plan->result_fresh);
    Py_XDECREF(plan->array_name);
    Py_XDECREF(plan->pending_name);
    Py_XDECREF(plan->result_type);
    Py_XDECREF(plan->raw_name);
    shim_object_free((PyObject *)plan);
}

/* Calling a Pipeline (CallPlan is its base class): the fast path, else the general path,
 * the Pipeline's _call_in_python(*args, **kwargs), with no Python frame in between. */
static PyObject *plan_tp_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    plan_object *plan = (plan_object *)self;
    PyObject *result = plan->fast ? fast_call(plan, args, kwargs) : Py_NewRef(Py_NotImplemented);
    if (result != Py_NotImplemented) {
        return result;
    }
    Py_DECREF(result);
    PyObject *general = PyObject_GetAttr(self, plan->general_name);
    if (general == NULL) {
        return NULL;
    }
    result = PyObject_Call(general, args, kwargs);
    Py_DECREF(general);
    return result;
}

static PyMethodDef plan_methods[] = {
    {"_known", (PyCFunction)plan_known, METH_O,
     "_known(argv address): whether these shapes and scalars passed the bounds query"},
    {"_remember", (PyCFunction)plan_remember, METH_O,
     "_remember(argv address): these shapes and scalars passed the bounds query"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_init, plan_init},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_call, plan_tp_call},
    {Py_tp_methods, plan_methods},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "The base of shim.Pipeline: its fast path and its bounds cache."},
    {0, NULL},
};

static PyType_Spec plan_spec = {
    "shim._native.CallPlan", sizeof(plan_object), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    plan_slots,
};

void *shim_fastcall_plan_type(void) {
    static PyObject *type;
    if (type == NULL) {
        type = PyType_FromSpec(&plan_spec);
    }
    return type; /* borrowed: the caller (ctypes, GIL held) takes its own reference */
}
