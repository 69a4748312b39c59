/* Extern stages for the pipelines of generators.py (tests/test_build_flavors*.py): a small
 * library of the tests' own, compiled at test time and linked into the pipelines' libraries.
 * Each handles Halide's bounds query (a buffer with neither host nor device memory) as an
 * extern stage must. Their halide_* calls bind to whichever runtime the process has: the
 * shim's (loaded globally first) or, run with Halide's stock runtime, the one bundled into
 * the pipeline's library. (The one on OpenCL is in externs_opencl.c.)
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "HalideRuntime.h"

static bool is_query(const halide_buffer_t *b) {
    return b->host == NULL && b->device == 0;
}

/* Calls visit(element address, coordinates, state) for every element of b (up to 4-D), in
 * any layout: strides as the buffer says. */
typedef void (*visitor)(void *element, const int *coords, void *state);

static void for_each(const halide_buffer_t *b, visitor visit, void *state) {
    int coords[4] = {0, 0, 0, 0};
    int extents[4] = {1, 1, 1, 1};
    for (int d = 0; d < b->dimensions; d++) {
        extents[d] = b->dim[d].extent;
    }
    int bytes = (b->type.bits + 7) / 8;
    for (int w = 0; w < extents[3]; w++)
        for (int k = 0; k < extents[2]; k++)
            for (int j = 0; j < extents[1]; j++)
                for (int i = 0; i < extents[0]; i++) {
                    int local[4] = {i, j, k, w};
                    int64_t offset = 0;
                    for (int d = 0; d < b->dimensions; d++) {
                        coords[d] = b->dim[d].min + local[d];
                        offset += (int64_t)local[d] * b->dim[d].stride;
                    }
                    visit(b->host + offset * bytes, coords, state);
                }
}

/* --- nested externs: the leaf ---------------------------------------------------------------- */

static void store_float(void *element, const int *coords, void *state) {
    (void)coords;
    *(float *)element = *(const float *)state;
}

/* Fills its output with `level`; a negative level is an error, reported through halide_error
 * with the user_context it was given. */
int flv_leaf(void *user_context, float level, halide_buffer_t *out) {
    if (level < 0) {
        char message[96];
        snprintf(message, sizeof message, "flv_leaf: negative level %g\n", level);
        halide_error(user_context, message);
        return -7;
    }
    if (is_query(out)) {
        return 0;
    }
    for_each(out, store_float, &level);
    return 0;
}

/* --- an extern output ------------------------------------------------------------------------ */

struct add_state {
    const halide_buffer_t *in;
    int32_t addend;
};

static void add_one(void *element, const int *coords, void *state) {
    const struct add_state *s = state;
    int64_t offset = 0;
    for (int d = 0; d < s->in->dimensions; d++) {
        offset += (int64_t)(coords[d] - s->in->dim[d].min) * s->in->dim[d].stride;
    }
    *(int32_t *)element = ((const int32_t *)s->in->host)[offset] + s->addend;
}

/* out = in + addend over out's region; asks for exactly that region of in. Counts its calls. */
static int add_calls;

int flv_add(halide_buffer_t *in, int32_t addend, halide_buffer_t *out) {
    if (is_query(in)) {
        for (int d = 0; d < in->dimensions; d++) {
            in->dim[d].min = out->dim[d].min;
            in->dim[d].extent = out->dim[d].extent;
        }
        return 0;
    }
    if (is_query(out)) {
        return 0;
    }
    __atomic_add_fetch(&add_calls, 1, __ATOMIC_RELAXED);
    struct add_state s = {in, addend};
    for_each(out, add_one, &s);
    return 0;
}

int flv_add_calls(void) {
    return __atomic_exchange_n(&add_calls, 0, __ATOMIC_RELAXED);
}

/* --- async producers: a stage that sleeps where a seed says -------------------------------- */

static uint64_t jitter_seed;
static int jitter_calls, jitter_sleeps;

void flv_jitter_seed(uint64_t seed) {
    jitter_seed = seed;
    jitter_calls = jitter_sleeps = 0;
}

int flv_jitter_calls(void) {
    return __atomic_load_n(&jitter_calls, __ATOMIC_RELAXED);
}

int flv_jitter_sleeps(void) {
    return __atomic_load_n(&jitter_sleeps, __ATOMIC_RELAXED);
}

static void seed_value(void *element, const int *coords, void *state) {
    (void)state;
    *(int32_t *)element = coords[0] * 7 + coords[1] * 3 - coords[2];
}

/* seeds(x, y, z) = 7x + 3y - z; sleeps 0.3 ms on about one call in eight, which ones chosen
 * by the seed and the region's corner. */
int flv_jitter(halide_buffer_t *out) {
    if (is_query(out)) {
        return 0;
    }
    __atomic_add_fetch(&jitter_calls, 1, __ATOMIC_RELAXED);
    uint64_t h = jitter_seed * 0x9E3779B97F4A7C15ull;
    for (int d = 0; d < out->dimensions; d++) {
        h = (h ^ (uint64_t)(uint32_t)out->dim[d].min) * 0xBF58476D1CE4E5B9ull;
    }
    if ((h >> 59) < 4) {
        __atomic_add_fetch(&jitter_sleeps, 1, __ATOMIC_RELAXED);
        struct timespec pause = {0, 300000};
        nanosleep(&pause, NULL);
    }
    for_each(out, seed_value, NULL);
    return 0;
}

