/* libFuzzer target: what a kernel's prototype in a pipeline's OpenCL source says about its
 * parameters, as native_stubs/backends/opencl_prototypes.c reads it (for staged crops: which
 * the kernel may write), alone, built with -fsanitize=fuzzer,address,undefined by fuzz/run.py.
 *
 * The input: the kernel's name, up to the first NUL (all of it if there is none), then the
 * source. Checked for every input: no sanitizer report (a read before the source or past its
 * end); a parameter count of -1 or more, -1 where the name does not occur in the source; and
 * no parameter marked read-only or offset beyond the count (nor beyond the 64 a mask holds);
 * and the rewrite of the source (shim_cl_rewrite_offsets) no shorter than the source. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/opencl_prototypes.h"

#define CHECK(condition)                                                          \
    do {                                                                          \
        if (!(condition)) {                                                       \
            fprintf(stderr, "opencl_prototypes: check failed: %s\n", #condition); \
            abort();                                                              \
        }                                                                         \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t name_size = nul ? (size_t)(nul - data) : size;
    size_t source_size = nul ? size - name_size - 1 : 0;
    /* (each exactly its bytes and a NUL, so that AddressSanitizer sees a read past either) */
    char *name = malloc(name_size + 1), *source = malloc(source_size + 1);
    CHECK(name && source);
    memcpy(name, data, name_size);
    name[name_size] = 0;
    if (source_size > 0) {
        memcpy(source, nul + 1, source_size);
    }
    source[source_size] = 0;
    shim_cl_prototype prototype;
    shim_cl_kernel_prototype(source, name, &prototype);
    int params = prototype.params;
    CHECK(params >= -1);
    if (params == -1 || strstr(source, name) == NULL) {
        CHECK(params == -1 && prototype.read_only == 0 && prototype.offset == 0);
    } else if (params < 64) {
        CHECK(prototype.read_only >> params == 0 && prototype.offset >> params == 0);
    }
    /* The rewrite of the whole source: the source's text is all in it, in order. */
    size_t rewritten_size = 0;
    char *rewritten = shim_cl_rewrite_offsets(source, &rewritten_size);
    CHECK(rewritten != NULL && rewritten_size == strlen(rewritten) &&
          rewritten_size >= strlen(source));
    free(rewritten);
    free(name);
    free(source);
    return 0;
}
