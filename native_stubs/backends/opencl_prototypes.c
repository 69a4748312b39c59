/* What a kernel's prototype and body in a pipeline's OpenCL source say about its parameters,
 * and the source rewritten to give buffers offsets.
 *
 * Which parameters a kernel may write: a staged crop (opencl.c) is copied back after the kernel
 * only if the kernel may write it: copying back a crop it only reads would put old values over
 * what another call wrote there meanwhile. A kernel cannot write through a pointer to const,
 * nor to an image it takes __read_only, and Halide declares every buffer and image a kernel
 * does not write so.
 *
 * Offsets: Halide's kernels take each buffer as a bare pointer, and OpenCL makes sub-buffers only
 * at offsets aligned to the device's base address alignment (CL_DEVICE_MEM_BASE_ADDR_ALIGN). So
 * the shim builds the source with an element offset per buffer, applied at the kernel's entry
 * (`T *restrict _p = shim_base_i + shim_offset_i;` over the renamed parameter), and a crop at any
 * offset is launched as its allocation plus that offset. Only where the kernel makes no
 * assumption about its buffer's base beyond the element's alignment: Halide indexes aligned
 * vectors through a pointer cast to the vector type (`((__global float4 *)_p)[i]`), which needs
 * the base aligned to the vector. A parameter is given an offset only if every use of it in the
 * kernel's body is one of Halide's element-aligned forms: `_p[i]`; `((T *)_p)[i]` and
 * `vloadN(0, (T *)_p + i)` / `vstoreN(v, 0, (T *)_p + i)` with T a scalar no larger than the
 * element. Any other use, or a type this does not know, keeps the buffer's staging.
 *
 * The source is the pipeline's, read as text to its first NUL; fuzz/c/opencl_prototypes.c runs
 * this alone, under sanitizers. */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/opencl_prototypes.h"

static bool identifier_char(char c) {
    return c == '_' || isalnum((unsigned char)c);
}

static bool is_word(const char *p, size_t n, const char *word) {
    return strlen(word) == n && strncmp(p, word, n) == 0;
}

static const char *skip_spaces(const char *p) {
    while (isspace((unsigned char)*p)) {
        p++;
    }
    return p;
}

/* The size of OpenCL's scalar type `word` (0 for any other: vectors, structs, unknown). */
static size_t scalar_size(const char *word, size_t n) {
    static const struct {
        const char *name;
        size_t size;
    } types[] = {{"char", 1},  {"uchar", 1}, {"short", 2}, {"ushort", 2},
                 {"half", 2},  {"int", 4},   {"uint", 4},  {"float", 4},
                 {"long", 8},  {"ulong", 8}, {"double", 8}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        if (is_word(word, n, types[i].name)) {
            return types[i].size;
        }
    }
    return 0;
}

/* One parameter as its declaration reads. */
typedef struct {
    const char *start, *end; /* its text, spaces around it left out */
    const char *name;        /* its last identifier */
    size_t name_len;
    size_t pointee_size;     /* of a pointer's scalar type (the word before '*'); 0: unknown */
    bool pointer, constant, read_only_image, local;
} param_text;

/* Reads the parameter list that starts after `p`'s '(': the number of parameters (-1 if the
 * list does not end), the first `max` of them into `params`, and where its ')' is. */
static int read_params(const char *p, param_text *params, int max, const char **close) {
    int index = 0, depth = 0;
    param_text cur = {0};
    const char *last_word = NULL;
    size_t last_len = 0;
    for (; *p; p++) {
        if (identifier_char(*p)) {
            size_t n = 1;
            while (identifier_char(p[n])) {
                n++;
            }
            cur.start = cur.start ? cur.start : p;
            cur.end = p + n;
            cur.constant |= !cur.pointer && (is_word(p, n, "const") ||
                                             is_word(p, n, "__constant") ||
                                             is_word(p, n, "constant"));
            cur.local |= is_word(p, n, "__local") || is_word(p, n, "local");
            cur.read_only_image |= is_word(p, n, "__read_only") || is_word(p, n, "read_only");
            last_word = p;
            last_len = n;
            p += n - 1;
        } else if (*p == '*') {
            if (!cur.pointer && last_word != NULL) {
                cur.pointee_size = scalar_size(last_word, last_len);
            }
            cur.pointer = true;
            cur.end = p + 1;
        } else if (*p == '(') {
            depth++;
        } else if (*p == ')' && depth > 0) {
            depth--;
        } else if ((*p == ',' && depth == 0) || *p == ')') {
            cur.name = last_word;
            cur.name_len = last_len;
            if (index < max) {
                params[index] = cur;
            }
            index++;
            if (*p == ')') {
                *close = p;
                return index;
            }
            cur = (param_text){0};
            last_word = NULL;
            last_len = 0;
        } else if (!isspace((unsigned char)*p)) {
            cur.end = p + 1;
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
    const char *after = skip_spaces(p + len);
    size_t n;
    const char *word = word_before(source, p, &n);
    if (*after != '(' || (p > source && identifier_char(p[-1])) || !is_word(word, n, "void")) {
        return false;
    }
    word = word_before(source, word, &n);
    return is_word(word, n, "__kernel") || is_word(word, n, "kernel");
}

/* The last character before `p` that is not a space, at or after `start`; 0 if none. */
static char char_before(const char *start, const char *p, const char **at) {
    while (p > start && isspace((unsigned char)p[-1])) {
        p--;
    }
    *at = p > start ? p - 1 : start;
    return p > start ? p[-1] : 0;
}

/* Whether the text before `use` (the name, in a body starting at `body`) is a cast to a pointer
 * to a scalar no larger than `element` bytes, "( words... scalar * )": its '(' in *open. */
static bool scalar_cast_before(const char *body, const char *use, size_t element,
                               const char **open) {
    const char *at;
    if (char_before(body, use, &at) != ')') {
        return false;
    }
    const char *p = at;
    int stars = 0;
    size_t type_size = 0;
    bool type_seen = false;
    while (p > body) {
        p--;
        if (*p == '(') {
            *open = p;
            return stars == 1 && type_size > 0 && type_size <= element;
        }
        if (*p == '*') {
            if (type_seen) {
                return false; /* a '*' before the type: a pointer to pointer */
            }
            stars++;
        } else if (identifier_char(*p)) {
            const char *end = p + 1;
            while (p > body && identifier_char(p[-1])) {
                p--;
            }
            if (!type_seen) {
                type_seen = true;
                type_size = scalar_size(p, (size_t)(end - p));
            }
        } else if (!isspace((unsigned char)*p)) {
            return false;
        }
    }
    return false;
}

/* Whether the use of a buffer's name at `use` (`len` bytes) in the body from `body` is one of
 * the element-aligned forms (see the top of this file). */
static bool element_aligned_use(const char *body, const char *use, size_t len, size_t element) {
    const char *after = skip_spaces(use + len);
    if (*after == '[') {
        return true; /* _p[i] */
    }
    const char *open;
    if (!scalar_cast_before(body, use, element, &open)) {
        return false;
    }
    const char *at;
    char before = char_before(body, open, &at);
    if (before == '(' && *after == ')') {
        return *skip_spaces(after + 1) == '['; /* ((T *)_p)[i] */
    }
    return before == ',' && *after == '+'; /* vloadN(0, (T *)_p + i), vstoreN(v, 0, (T *)_p + i) */
}

/* The end of a comment starting at `p`, or `p` if none starts there. */
static const char *past_comment(const char *p) {
    if (p[0] == '/' && p[1] == '/') {
        const char *end = strchr(p, '\n');
        return end ? end : p + strlen(p);
    }
    if (p[0] == '/' && p[1] == '*') {
        const char *end = strstr(p + 2, "*/");
        return end ? end + 2 : p + strlen(p);
    }
    return p;
}

/* The '}' that closes the body opening at `open` ('{'), or NULL. */
static const char *body_end(const char *open) {
    int depth = 0;
    for (const char *p = open; *p; p++) {
        const char *past = past_comment(p);
        if (past != p) {
            p = past - 1;
            if (!*past) {
                return NULL;
            }
        } else if (*p == '{') {
            depth++;
        } else if (*p == '}' && --depth == 0) {
            return p;
        }
    }
    return NULL;
}

/* Whether every use of `param` in the body [open, close) is element-aligned. */
static bool uses_element_aligned(const char *open, const char *close, const param_text *param) {
    for (const char *p = open; p < close; p++) {
        const char *past = past_comment(p);
        if (past != p) {
            p = past - 1;
        } else if (identifier_char(*p)) {
            size_t n = 1;
            while (p + n < close && identifier_char(p[n])) {
                n++;
            }
            if (n == param->name_len && strncmp(p, param->name, n) == 0 &&
                !element_aligned_use(open, p, n, param->pointee_size)) {
                return false;
            }
            p += n - 1;
        }
    }
    return true;
}

/* A kernel declared with its name at `name`: its parameters, and its body's braces (NULL
 * where it has none the reader can find). */
typedef struct {
    shim_cl_prototype prototype;
    param_text params[SHIM_CL_MASKED_PARAMS];
    const char *close; /* the parameter list's ')' */
    const char *open, *end; /* the body's '{' and '}' */
} kernel_text;

static void read_kernel(const char *name, size_t len, kernel_text *k) {
    memset(k, 0, sizeof *k);
    k->prototype.params = read_params(strchr(name + len, '(') + 1, k->params,
                                      SHIM_CL_MASKED_PARAMS, &k->close);
    if (k->prototype.params < 0) {
        return;
    }
    int masked = k->prototype.params < SHIM_CL_MASKED_PARAMS ? k->prototype.params
                                                              : SHIM_CL_MASKED_PARAMS;
    const char *open = skip_spaces(k->close + 1);
    const char *end = *open == '{' ? body_end(open) : NULL;
    if (end != NULL) {
        k->open = open;
        k->end = end;
    }
    for (int i = 0; i < masked; i++) {
        const param_text *p = &k->params[i];
        if ((p->pointer && p->constant) || p->read_only_image) {
            k->prototype.read_only |= (uint64_t)1 << i;
        }
        if (end != NULL && p->pointer && !p->local && p->pointee_size > 0 && p->name != NULL &&
            uses_element_aligned(open, end, p)) {
            k->prototype.offset |= (uint64_t)1 << i;
            k->prototype.element_size[i] = (uint8_t)p->pointee_size;
        }
    }
}

/* The next kernel declared at or after `from`: its name, or NULL. */
static const char *next_kernel(const char *source, const char *from, size_t *len) {
    for (const char *p = from; (p = strstr(p, "kernel")) != NULL; p += 6) {
        const char *start = p >= source + 2 && p[-1] == '_' && p[-2] == '_' ? p - 2 : p;
        if ((start > source && identifier_char(start[-1])) || identifier_char(p[6])) {
            continue;
        }
        const char *word = skip_spaces(p + 6);
        if (strncmp(word, "void", 4) != 0 || identifier_char(word[4])) {
            continue;
        }
        const char *name = skip_spaces(word + 4);
        size_t n = 0;
        while (identifier_char(name[n])) {
            n++;
        }
        if (n > 0 && kernel_declared_at(source, name, n)) {
            *len = n;
            return name;
        }
    }
    return NULL;
}

void shim_cl_kernel_prototype(const char *source, const char *name, shim_cl_prototype *out) {
    size_t len = strlen(name);
    memset(out, 0, sizeof *out);
    out->params = -1;
    if (len == 0) {
        return; /* (no kernel has no name) */
    }
    for (const char *p = strstr(source, name); p; p = strstr(p + 1, name)) {
        if (kernel_declared_at(source, p, len)) {
            kernel_text *k = malloc(sizeof *k);
            if (k != NULL) {
                read_kernel(p, len, k);
                *out = k->prototype;
                free(k);
            }
            return;
        }
    }
}

/* --- the rewrite -------------------------------------------------------------------------- */

typedef struct {
    char *text;
    size_t size, capacity;
    bool failed;
} text_out;

static void put(text_out *out, const char *p, size_t n) {
    if (out->failed) {
        return;
    }
    if (out->size + n + 1 > out->capacity) {
        size_t capacity = (out->size + n + 1) * 2;
        char *grown = realloc(out->text, capacity);
        if (grown == NULL) {
            out->failed = true;
            return;
        }
        out->text = grown;
        out->capacity = capacity;
    }
    memcpy(out->text + out->size, p, n);
    out->size += n;
    out->text[out->size] = 0;
}

static void put_str(text_out *out, const char *s) {
    put(out, s, strlen(s));
}

/* The source from `from` up to the kernel's body rewritten: each parameter with an offset
 * renamed, the offsets appended, and at the entry the names declared as before, offset. */
static const char *rewrite_kernel(text_out *out, const char *from, const kernel_text *k) {
    char word[64];
    const param_text *params = k->params;
    uint64_t offset = k->prototype.offset;
    for (int i = 0; i < SHIM_CL_MASKED_PARAMS; i++) {
        if (offset >> i & 1) {
            put(out, from, (size_t)(params[i].name - from));
            snprintf(word, sizeof word, "shim_base_%d", i);
            put_str(out, word);
            from = params[i].name + params[i].name_len;
        }
    }
    put(out, from, (size_t)(k->close - from));
    for (int i = 0; i < SHIM_CL_MASKED_PARAMS; i++) {
        if (offset >> i & 1) {
            snprintf(word, sizeof word, ",\n const ulong shim_offset_%d", i);
            put_str(out, word);
        }
    }
    put(out, k->close, (size_t)(k->open + 1 - k->close));
    for (int i = 0; i < SHIM_CL_MASKED_PARAMS; i++) {
        if (offset >> i & 1) {
            put_str(out, "\n ");
            put(out, params[i].start, (size_t)(params[i].end - params[i].start));
            snprintf(word, sizeof word, " = shim_base_%d + shim_offset_%d;", i, i);
            put_str(out, word);
        }
    }
    return k->open + 1;
}

char *shim_cl_rewrite_offsets(const char *source, size_t *size) {
    text_out out = {0};
    kernel_text *k = malloc(sizeof *k);
    const char *from = source;
    size_t len;
    put(&out, "", 0);
    for (const char *name = next_kernel(source, source, &len); k && name;
         name = next_kernel(source, name + len, &len)) {
        if (name < from) {
            /* Declared inside the prototype just rewritten (its parameters, or before its '{'):
             * not OpenCL, which the build refuses; its text is already copied. */
            continue;
        }
        read_kernel(name, len, k);
        if (k->prototype.params >= 0 && k->prototype.offset != 0) {
            from = rewrite_kernel(&out, from, k);
        }
    }
    put_str(&out, from);
    free(k);
    if (k == NULL || out.failed) {
        free(out.text);
        return NULL;
    }
    *size = out.size;
    return out.text;
}
