/* Call contexts, and the halide_error / halide_print overrides that report into them.
 *
 * Halide's default halide_error prints and calls abort(), which would take the Python process
 * down with it. Ours records the message in the calling thread's context and returns, so the
 * pipeline returns its error code and Python raises an exception that carries the message.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "calls/call_context.h"
#include "calls/halide_hooks.h"

/* Error text is short; print text can be large (the `debug` target feature logs every runtime
 * call), so it is capped and the excess counted rather than kept. */
enum { ERROR_TEXT_CAP = 64 * 1024, PRINT_TEXT_CAP = 8 * 1024 * 1024 };

/* Ends error text the cap cut: the text is all the caller gets to see of it. (Print text's
 * excess is reported from its count, shim_call_prints_dropped.) */
static const char ERRORS_CUT_MARKER[] = "\n... (truncated: error text is capped at 64 KiB)\n";

typedef struct {
    char *data;
    size_t len, cap, limit, dropped;
    const char *cut_marker; /* appended, past the limit, where the limit first cuts; or NULL */
} text_buffer;

struct shim_call {
    uint64_t id;
    void *stream; /* CUDA stream for this call's launches, or NULL */
    pthread_mutex_t lock; /* worker threads of one call may report at the same time */
    text_buffer errors;
    text_buffer prints;
    /* Set while a pipeline's code runs in this context (on the caller's thread and Halide's
     * workers): what the Python runtime asks to know whether to wait for the call. */
    int in_pipeline;
    /* shim_call_set_replaced: read by the call's own threads only, while it runs. */
    struct halide_buffer_t *const *replaced;
    int replaced_count;
};

static __thread shim_call *current_call;

/* The thread's stream (shim.stream), kept here so that the fast paths read it without Python. */
static __thread void *thread_stream;

void shim_thread_stream_set(void *stream) {
    thread_stream = stream;
}

void *shim_thread_stream(void) {
    return thread_stream;
}

/* Call ids, for Python's call contexts and the fast path alike (an id names one call). */
static uint64_t last_call_id;

uint64_t shim_next_call_id(void) {
    return __atomic_add_fetch(&last_call_id, 1, __ATOMIC_RELAXED);
}

/* Calls the fast paths (fast/run.c) are running, and the refusal of new ones at exit (see
 * shim/native/__init__.py, close_calls): a call either sees the refusal or is counted running, since
 * it counts itself before it looks. */
static int calls_running;
static int calls_closed;
static __thread int own_calls_running; /* this thread's part of calls_running */

/* In a child of fork (forks/fork.c): the calls the other threads were running never end
 * there, and exit must not wait for them. */
void shim_calls_keep_own(void) {
    __atomic_store_n(&calls_running, own_calls_running, __ATOMIC_SEQ_CST);
}

bool shim_calls_begin(void) {
    own_calls_running++;
    __atomic_add_fetch(&calls_running, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&calls_closed, __ATOMIC_SEQ_CST)) {
        shim_calls_end();
        return false;
    }
    return true;
}

void shim_calls_end(void) {
    own_calls_running--;
    __atomic_sub_fetch(&calls_running, 1, __ATOMIC_SEQ_CST);
}

bool shim_calls_closed(void) {
    return __atomic_load_n(&calls_closed, __ATOMIC_ACQUIRE);
}

int shim_calls_close(void) {
    __atomic_store_n(&calls_closed, 1, __ATOMIC_SEQ_CST);
    return shim_calls_running();
}

int shim_calls_running(void) {
    return __atomic_load_n(&calls_running, __ATOMIC_SEQ_CST);
}

/* Room for n more bytes and the terminating NUL. */
static bool text_reserve(text_buffer *t, size_t n) {
    if (t->len + n + 1 <= t->cap) {
        return true;
    }
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n + 1) {
        cap *= 2;
    }
    char *data = realloc(t->data, cap);
    if (data == NULL) {
        return false;
    }
    t->data = data;
    t->cap = cap;
    return true;
}

static void text_append(text_buffer *t, const char *msg) {
    size_t n = strlen(msg);
    size_t room = t->len < t->limit ? t->limit - t->len : 0;
    const char *marker = NULL;
    if (n > room) {
        if (t->dropped == 0) {
            marker = t->cut_marker; /* the first cut: later text is dropped after it */
        }
        t->dropped += n - room;
        n = room;
    }
    size_t marker_len = marker ? strlen(marker) : 0;
    if (n + marker_len == 0) {
        return;
    }
    if (!text_reserve(t, n + marker_len)) {
        t->dropped += n;
        return;
    }
    memcpy(t->data + t->len, msg, n);
    t->len += n;
    if (marker != NULL) {
        memcpy(t->data + t->len, marker, marker_len);
        t->len += marker_len;
    }
    t->data[t->len] = '\0';
}

static const char *text_get(const text_buffer *t) {
    return t->data ? t->data : "";
}

shim_call *shim_call_new(uint64_t id) {
    shim_call *call = calloc(1, sizeof(shim_call));
    if (call == NULL) {
        return NULL;
    }
    call->id = id;
    pthread_mutex_init(&call->lock, NULL);
    call->errors.limit = ERROR_TEXT_CAP;
    call->errors.cut_marker = ERRORS_CUT_MARKER;
    call->prints.limit = PRINT_TEXT_CAP;
    return call;
}

void shim_call_free(shim_call *call) {
    if (call == NULL) {
        return;
    }
    pthread_mutex_destroy(&call->lock);
    free(call->errors.data);
    free(call->prints.data);
    free(call);
}

void shim_call_reset(shim_call *call, uint64_t id) {
    call->id = id;
    call->stream = NULL;
    call->errors.len = call->errors.dropped = 0;
    call->prints.len = call->prints.dropped = 0;
    if (call->errors.data) {
        call->errors.data[0] = '\0';
    }
    if (call->prints.data) {
        call->prints.data[0] = '\0';
    }
}

uint64_t shim_call_id(const shim_call *call) {
    return call->id;
}

void shim_call_set_replaced(shim_call *call, struct halide_buffer_t *const *buffers, int count) {
    call->replaced = buffers;
    call->replaced_count = buffers ? count : 0;
}

bool shim_call_replaces(const shim_call *call, const struct halide_buffer_t *buf) {
    for (int i = 0; call != NULL && i < call->replaced_count; i++) {
        if (call->replaced[i] == buf) {
            return true;
        }
    }
    return false;
}

void shim_call_set_stream(shim_call *call, void *stream) {
    call->stream = stream;
}

void *shim_call_stream(const shim_call *call) {
    return call->stream;
}

shim_call *shim_call_enter(shim_call *call) {
    shim_call *previous = current_call;
    current_call = call;
    return previous;
}

void shim_call_leave(shim_call *previous) {
    current_call = previous;
}

shim_call *shim_current_call(void) {
    return current_call;
}

bool shim_call_in_pipeline(const shim_call *call) {
    return __atomic_load_n(&call->in_pipeline, __ATOMIC_ACQUIRE);
}

int shim_call_argv(shim_call *call, int (*argv_fn)(void **), void **argv) {
    shim_call *previous = shim_call_enter(call);
    __atomic_store_n(&call->in_pipeline, 1, __ATOMIC_RELEASE);
    int result = argv_fn(argv);
    __atomic_store_n(&call->in_pipeline, 0, __ATOMIC_RELEASE);
    shim_call_leave(previous);
    return result;
}

const char *shim_call_errors(const shim_call *call) {
    return text_get(&call->errors);
}

const char *shim_call_prints(const shim_call *call) {
    return text_get(&call->prints);
}

size_t shim_call_prints_dropped(const shim_call *call) {
    return call->prints.dropped;
}

/* `whole_lines`: end the message with a newline if it lacks one, so that messages from
 * several threads stay apart (each halide_error call is one whole message; print text may
 * come in pieces). */
static void report(text_buffer *(*which)(shim_call *), const char *msg, bool whole_lines,
                   bool handled) {
    size_t n = strlen(msg);
    const char *end = whole_lines && n > 0 && msg[n - 1] != '\n' ? "\n" : "";
    shim_call *call = current_call;
    if (call == NULL) {
        /* Not inside any shim call (a destructor at exit, a thread Halide did not start for
         * us, a program calling a pipeline from C): there is nobody to hand the text to, so do
         * what Halide does, minus the abort; unless an application's handler had it, as
         * Halide then prints nothing. */
        if (!handled) {
            fputs(msg, stderr);
            fputs(end, stderr);
        }
        return;
    }
    pthread_mutex_lock(&call->lock);
    text_append(which(call), msg);
    text_append(which(call), end);
    pthread_mutex_unlock(&call->lock);
}

static text_buffer *errors_of(shim_call *call) {
    return &call->errors;
}

static text_buffer *prints_of(shim_call *call) {
    return &call->prints;
}

/* An error handler an application installed (halide_set_error_handler) is called, as
 * Halide's runtime calls it, and the shim still keeps the message for the call's exception
 * (outside a shim call the handler alone has it, as under Halide). Halide's default handler
 * prints and aborts: in its place, the shim only keeps the message. */
void halide_error(void *user_context, const char *msg) {
    halide_error_handler_t handler = __atomic_load_n(&shim_halide_error_handler, __ATOMIC_ACQUIRE);
    bool handled = handler != NULL && handler != halide_default_error;
    if (handled) {
        handler(user_context, msg);
    }
    report(errors_of, msg, true, handled);
}

/* Halide 22's error of Arm SME2 code (abi/halide22_runtime.h), worded as Halide 22's runtime
 * words it; Halide 21's runtime, linked into this library, has every other halide_error_*. */
int halide_error_streaming_vscale_invalid(void *user_context, const char *func_name,
                                          int runtime_vscale, int compiletime_vscale) {
    char message[512];
    snprintf(message, sizeof message,
             "The function %s is compiled with the assumption that streaming vscale of Scalable "
             "Vector is %d. However, the detected runtime streaming vscale is %d.",
             func_name, compiletime_vscale, runtime_vscale);
    halide_error(user_context, message);
    return halide_error_code_streaming_vscale_invalid;
}

/* A print function an application installed (halide_set_custom_print) gets the text instead
 * of the shim, which otherwise hands it to Python's stderr when the call returns. */
void halide_print(void *user_context, const char *msg) {
    halide_print_t print = __atomic_load_n(&shim_halide_custom_print, __ATOMIC_ACQUIRE);
    if (print != NULL && print != halide_default_print) {
        print(user_context, msg);
        return;
    }
    report(prints_of, msg, false, false);
}
