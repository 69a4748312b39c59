/* A pipeline the shim must refuse at load, clearly, never run wrongly: one whose metadata
 * shows a Halide release the shim does not serve, or whose code calls its runtime by other
 * names than halide_* (Halide 22's runtime prefixes). Built at test time with macros:
 * - TARGET: the target string its metadata gives (a feature no served release knows: a newer
 *   Halide's library);
 * - LANES: the third field of its argument types (1 until Halide 22, 0 from it; anything else
 *   no release writes);
 * - PREFIX: the prefix its runtime calls carry instead of halide_ (acme_: Halide 22 built with
 *   runtime_prefixes), its runtime then either needed from elsewhere (a no_runtime build) or,
 *   with BUNDLED, defined here weak as a bundled runtime's are.
 * It exports `unservable` (argv and metadata): out(x) = in(x) + 1 over int32. */
#include <stdint.h>
#include <string.h>

#include "HalideRuntime.h"

#ifndef TARGET
#define TARGET "x86-64-linux-no_runtime"
#endif
#ifndef LANES
#define LANES 1
#endif

#ifdef PREFIX
#define PASTE(prefix, name) prefix##name
#define EXPAND(prefix, name) PASTE(prefix, name)
#define RUNTIME(name) EXPAND(PREFIX, name)
int RUNTIME(error_buffer_argument_is_null)(void *uc, const char *name);
int RUNTIME(do_par_for)(void *uc, halide_task_t task, int min, int size, uint8_t *closure);
#ifdef BUNDLED
__attribute__((weak)) int RUNTIME(error_buffer_argument_is_null)(void *uc, const char *name) {
    (void)uc;
    (void)name;
    return halide_error_code_buffer_argument_is_null;
}
__attribute__((weak)) int RUNTIME(do_par_for)(void *uc, halide_task_t task, int min, int size,
                                              uint8_t *closure) {
    for (int i = min; i < min + size; i++) {
        int result = task(uc, i, closure);
        if (result != 0) {
            return result;
        }
    }
    return 0;
}
#endif
#else
#define RUNTIME(name) halide_##name
#endif

typedef struct {
    halide_buffer_t *in, *out;
} closure_t;

static int element(void *uc, int x, uint8_t *closure) {
    (void)uc;
    const closure_t *c = (const closure_t *)closure;
    ((int32_t *)c->out->host)[x] = ((const int32_t *)c->in->host)[x] + 1;
    return 0;
}

int unservable(halide_buffer_t *in, halide_buffer_t *out) {
    if (in == NULL || out == NULL) {
        return RUNTIME(error_buffer_argument_is_null)(NULL, in == NULL ? "in" : "out");
    }
    if (in->host == NULL || out->host == NULL) {
        in->dim[0] = out->dim[0];
        return 0;
    }
    closure_t c = {in, out};
    return RUNTIME(do_par_for)(NULL, element, 0, out->dim[0].extent, (uint8_t *)&c);
}

int unservable_argv(void **args) {
    return unservable((halide_buffer_t *)args[0], (halide_buffer_t *)args[1]);
}

static const struct halide_filter_argument_t arguments[] = {
    {"in", halide_argument_kind_input_buffer, 1, {halide_type_int, 32, LANES}, NULL, NULL, NULL,
     NULL, NULL},
    {"out", halide_argument_kind_output_buffer, 1, {halide_type_int, 32, LANES}, NULL, NULL, NULL,
     NULL, NULL},
};
static const struct halide_filter_metadata_t metadata = {1, 2, arguments, TARGET, "unservable"};

const struct halide_filter_metadata_t *unservable_metadata(void) {
    return &metadata;
}
