/* What a kernel's prototype in a pipeline's OpenCL source says about its parameters.
 *
 * A staged crop (opencl.c) is copied back after the kernel only if the kernel may write it:
 * copying back a crop it only reads would put old values over what another call wrote there
 * meanwhile. A kernel cannot write through a pointer to const, nor to an image it takes
 * __read_only, and Halide declares every buffer and image a kernel does not write so.
 *
 * The source is the pipeline's, read as text to its first NUL; fuzz/c/opencl_prototypes.c runs
 * this alone, under sanitizers. */
#include <ctype.h>
#include <stdbool.h>
#include <string.h>

#include "backends/opencl_prototypes.h"

static bool identifier_char(char c) {
    return c == '_' || isalnum((unsigned char)c);
}

static bool is_word(const char *p, size_t n, const char *word) {
    return strlen(word) == n && strncmp(p, word, n) == 0;
}

/* Reads the parameter list that starts after `p`'s '(': the number of parameters (-1 if the
 * list does not end) and which of them are pointers to const or __constant data, or images
 * taken __read_only. */
static int read_params(const char *p, uint64_t *read_only) {
    int index = 0, depth = 0;
    bool pointer = false, constant = false, read_only_image = false;
    *read_only = 0;
    for (; *p; p++) {
        if (identifier_char(*p)) {
            size_t n = 1;
            while (identifier_char(p[n])) {
                n++;
            }
            constant |= !pointer && (is_word(p, n, "const") || is_word(p, n, "__constant") ||
                                     is_word(p, n, "constant"));
            read_only_image |= is_word(p, n, "__read_only") || is_word(p, n, "read_only");
            p += n - 1;
        } else if (*p == '*') {
            pointer = true;
        } else if (*p == '(') {
            depth++;
        } else if (*p == ')' && depth > 0) {
            depth--;
        } else if ((*p == ',' && depth == 0) || *p == ')') {
            if (((pointer && constant) || read_only_image) && index < 64) {
                *read_only |= (uint64_t)1 << index;
            }
            index++;
            if (*p == ')') {
                return index;
            }
            pointer = constant = read_only_image = false;
        }
    }
    return -1;
}

/* The word that ends before `end`, spaces between skipped: its start, and *n its length. */
static const char *word_before(const char *source, const char *end, size_t *n) {
    while (end > source && isspace((unsigned char)end[-1])) {
        end--;
    }
    const char *start = end;
    while (start > source && identifier_char(start[-1])) {
        start--;
    }
    *n = (size_t)(end - start);
    return start;
}

/* Whether the name at `p` is declared there as a kernel: "__kernel void NAME (". */
static bool kernel_declared_at(const char *source, const char *p, size_t len) {
    const char *after = p + len;
    while (isspace((unsigned char)*after)) {
        after++;
    }
    size_t n;
    const char *word = word_before(source, p, &n);
    if (*after != '(' || (p > source && identifier_char(p[-1])) || !is_word(word, n, "void")) {
        return false;
    }
    word = word_before(source, word, &n);
    return is_word(word, n, "__kernel") || is_word(word, n, "kernel");
}

int shim_cl_kernel_params(const char *source, const char *name, uint64_t *read_only) {
    size_t len = strlen(name);
    *read_only = 0;
    if (len == 0) {
        return -1; /* (no kernel has no name) */
    }
    for (const char *p = strstr(source, name); p; p = strstr(p + 1, name)) {
        if (kernel_declared_at(source, p, len)) {
            return read_params(strchr(p + len, '(') + 1, read_only);
        }
    }
    return -1;
}
