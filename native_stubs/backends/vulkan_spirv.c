/* Which storage buffers a kernel's SPIR-V may write.
 *
 * A staged crop (vulkan_kernels.c) must not be copied back after a kernel that only reads it:
 * the copy would put the crop's old values over whatever the launch wrote there through
 * another argument. Nothing Halide hands the runtime says which buffers a kernel writes:
 * halide_vulkan_run's arguments do not, its module's header of bindings does not, and its
 * SPIR-V decorates no buffer NonWritable (src/CodeGen_Vulkan_Dev.cpp, Halide 19 to 22). The
 * SPIR-V's instructions do: a buffer is a variable of the Uniform or StorageBuffer storage
 * class at a descriptor set and binding, and the kernel reaches its elements only through
 * pointers made from that variable by access chains.
 *
 * So: every pointer made from such a variable (access chains and copies of it, whatever
 * their depth) is followed; the buffer is read-only if each of them is only ever loaded from,
 * chained further, or asked its array's length. Any other use of one - a store through it or
 * of it, an atomic, a copy into it, a function call, a phi or select, an instruction this
 * file does not know - counts as a write. So does anything it cannot follow: a module that
 * does not parse, decoration groups (which could give another variable the same binding), a
 * binding no variable is decorated with. Erring that way costs a copy back, never a byte. */
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "backends/vulkan_spirv.h"

enum {
    OP_NOP = 0, OP_SOURCE_CONTINUED = 2, OP_SOURCE = 3, OP_SOURCE_EXTENSION = 4, OP_NAME = 5,
    OP_MEMBER_NAME = 6, OP_STRING = 7, OP_LINE = 8, OP_EXTENSION = 10, OP_EXT_INST_IMPORT = 11,
    OP_EXT_INST = 12, OP_MEMORY_MODEL = 14, OP_ENTRY_POINT = 15, OP_EXECUTION_MODE = 16,
    OP_CAPABILITY = 17, OP_TYPE_FIRST = 19, OP_TYPE_LAST = 39, OP_CONSTANT_FIRST = 41,
    OP_CONSTANT_LAST = 51, /* (OpSpecConstantOp, 52, is an operation: not among them) */
    OP_FUNCTION = 54, OP_FUNCTION_PARAMETER = 55, OP_FUNCTION_END = 56, OP_VARIABLE = 59,
    OP_LOAD = 61, OP_STORE = 62, OP_COPY_MEMORY = 63, OP_COPY_MEMORY_SIZED = 64,
    OP_ACCESS_CHAIN = 65, OP_IN_BOUNDS_ACCESS_CHAIN = 66, OP_PTR_ACCESS_CHAIN = 67,
    OP_ARRAY_LENGTH = 68, OP_IN_BOUNDS_PTR_ACCESS_CHAIN = 70, OP_DECORATE = 71,
    OP_MEMBER_DECORATE = 72, OP_DECORATION_GROUP = 73, OP_GROUP_DECORATE = 74,
    OP_GROUP_MEMBER_DECORATE = 75, OP_VECTOR_SHUFFLE = 79, OP_COMPOSITE_EXTRACT = 81,
    OP_COMPOSITE_INSERT = 82, OP_COPY_OBJECT = 83, OP_ATOMIC_LOAD = 227, OP_LOOP_MERGE = 246,
    OP_SELECTION_MERGE = 247, OP_LABEL = 248, OP_BRANCH = 249, OP_BRANCH_CONDITIONAL = 250,
    OP_SWITCH = 251, OP_KILL = 252, OP_RETURN = 253, OP_UNREACHABLE = 255, OP_NO_LINE = 317,
    OP_MODULE_PROCESSED = 330, OP_EXECUTION_MODE_ID = 331, OP_DECORATE_ID = 332,
    OP_DECORATE_STRING = 5632, OP_MEMBER_DECORATE_STRING = 5633,
};
enum { DECORATION_BINDING = 33, DECORATION_DESCRIPTOR_SET = 34 };
enum { STORAGE_UNIFORM = 2, STORAGE_STORAGE_BUFFER = 12 };
enum { HEADER_WORDS = 5 };

typedef struct {
    uint32_t bound;    /* ids are below it */
    uint32_t *root;    /* per id: the buffer variable a pointer is made from (0: none) */
    uint32_t *set, *binding; /* per variable: its decorations (UINT32_MAX: none) */
    bool *written;     /* per variable: some use of a pointer made from it may write */
} analysis;

static void may_write(analysis *a, uint32_t id) {
    if (id < a->bound && a->root[id] != 0) {
        a->written[a->root[id]] = true;
    }
}

/* Each operand word from `from` on, as a use that may write. */
static void may_write_all(analysis *a, const uint32_t *w, uint32_t from, uint32_t n) {
    for (uint32_t i = from; i < n; i++) {
        may_write(a, w[i]);
    }
}

/* What never uses a pointer as a value: debug information, annotations, types, constants,
 * control flow (whose operands, labels, booleans and integers aside, are literals). */
static bool no_pointer_use(uint32_t op) {
    switch (op) {
    case OP_NOP: case OP_SOURCE_CONTINUED: case OP_SOURCE: case OP_SOURCE_EXTENSION:
    case OP_NAME: case OP_MEMBER_NAME: case OP_STRING: case OP_LINE: case OP_NO_LINE:
    case OP_EXTENSION: case OP_EXT_INST_IMPORT: case OP_MEMORY_MODEL: case OP_ENTRY_POINT:
    case OP_EXECUTION_MODE: case OP_EXECUTION_MODE_ID: case OP_CAPABILITY:
    case OP_MEMBER_DECORATE: case OP_DECORATE_ID: case OP_DECORATE_STRING:
    case OP_MEMBER_DECORATE_STRING: case OP_MODULE_PROCESSED: case OP_FUNCTION:
    case OP_FUNCTION_PARAMETER: case OP_FUNCTION_END: case OP_LABEL: case OP_BRANCH:
    case OP_BRANCH_CONDITIONAL: case OP_SWITCH: case OP_LOOP_MERGE: case OP_SELECTION_MERGE:
    case OP_KILL: case OP_RETURN: case OP_UNREACHABLE:
        return true;
    default:
        return (op >= OP_TYPE_FIRST && op <= OP_TYPE_LAST) ||
               (op >= OP_CONSTANT_FIRST && op <= OP_CONSTANT_LAST);
    }
}

/* One instruction, of `n` words. The first pass (`uses` false) finds the buffer variables,
 * their decorations and the pointers made from them; the second, every pointer known, the
 * uses (a phi may name a pointer made further down). False where the module cannot be
 * followed. */
static bool visit(analysis *a, const uint32_t *w, uint32_t n, bool uses) {
    uint32_t op = w[0] & 0xFFFF;
    switch (op) {
    case OP_DECORATION_GROUP: case OP_GROUP_DECORATE: case OP_GROUP_MEMBER_DECORATE:
        return false;
    case OP_DECORATE:
        if (!uses && n >= 4 && w[1] < a->bound) {
            if (w[2] == DECORATION_DESCRIPTOR_SET) {
                a->set[w[1]] = w[3];
            } else if (w[2] == DECORATION_BINDING) {
                a->binding[w[1]] = w[3];
            }
        }
        return true;
    case OP_VARIABLE:
        if (n < 4 || w[2] >= a->bound) {
            return false;
        }
        if (!uses && (w[3] == STORAGE_UNIFORM || w[3] == STORAGE_STORAGE_BUFFER)) {
            a->root[w[2]] = w[2];
        }
        if (uses) {
            may_write_all(a, w, 4, n); /* (its initializer) */
        }
        return true;
    case OP_ACCESS_CHAIN: case OP_IN_BOUNDS_ACCESS_CHAIN: case OP_PTR_ACCESS_CHAIN:
    case OP_IN_BOUNDS_PTR_ACCESS_CHAIN: case OP_COPY_OBJECT:
        /* A pointer into what its base points into (the indices are integers). */
        if (n < 4 || w[2] >= a->bound) {
            return false;
        }
        if (!uses && w[3] < a->bound && a->root[w[3]] != 0) {
            a->root[w[2]] = a->root[w[3]];
        }
        return true;
    case OP_LOAD: case OP_ARRAY_LENGTH: case OP_ATOMIC_LOAD:
        return true; /* reads (the words after the pointer: literals, scopes, semantics) */
    case OP_STORE: case OP_COPY_MEMORY: case OP_COPY_MEMORY_SIZED:
        /* A write through the first operand. The second: a pointer stored somewhere (let go,
         * so a write), or a copy's source (read, and counted as a write all the same: rare
         * in kernels, and safe). */
        if (uses) {
            may_write_all(a, w, 1, n < 3 ? n : 3);
        }
        return true;
    case OP_COMPOSITE_EXTRACT:
        if (uses) {
            may_write_all(a, w, 3, n < 4 ? n : 4); /* (the indices after it are literals) */
        }
        return true;
    case OP_COMPOSITE_INSERT: case OP_VECTOR_SHUFFLE:
        if (uses) {
            may_write_all(a, w, 3, n < 5 ? n : 5); /* (then literals) */
        }
        return true;
    case OP_EXT_INST:
        if (uses) {
            may_write_all(a, w, 5, n); /* (after the set and the instruction's number) */
        }
        return true;
    default:
        if (uses && !no_pointer_use(op)) {
            may_write_all(a, w, 1, n);
        }
        return true;
    }
}

/* Both passes over the module's instructions; false where it cannot be followed. */
static bool analyse(analysis *a, const uint32_t *words, size_t word_count) {
    for (int pass = 0; pass < 2; pass++) {
        for (size_t at = HEADER_WORDS; at < word_count;) {
            uint32_t n = words[at] >> 16;
            if (n == 0 || n > word_count - at || !visit(a, words + at, n, pass == 1)) {
                return false;
            }
            at += n;
        }
    }
    return true;
}

void shim_spirv_written(const uint32_t *words, size_t word_count, uint32_t set, uint32_t first,
                        uint32_t count, bool *written) {
    for (uint32_t i = 0; i < count; i++) {
        written[i] = true;
    }
    /* (A module's ids, each defined by an instruction of two words or more, are fewer than
     * its words: a bound above that is not one to allocate for.) */
    uint32_t bound = word_count > HEADER_WORDS ? words[3] : 0;
    if (bound == 0 || bound > word_count) {
        return;
    }
    analysis a = {bound, calloc(bound, sizeof *a.root), malloc(bound * sizeof *a.set),
                  malloc(bound * sizeof *a.binding), calloc(bound, sizeof *a.written)};
    uint8_t *seen = calloc(count + 1, 1); /* per binding: 1, a variable; 2, one that may write */
    if (a.root && a.set && a.binding && a.written && seen) {
        memset(a.set, 0xFF, bound * sizeof *a.set);
        memset(a.binding, 0xFF, bound * sizeof *a.binding);
        if (analyse(&a, words, word_count)) {
            for (uint32_t id = 1; id < bound; id++) {
                uint32_t b = a.binding[id] - first;
                if (a.root[id] == id && a.set[id] == set && a.binding[id] >= first && b < count &&
                    seen[b] < 2) {
                    seen[b] = a.written[id] ? 2 : 1;
                }
            }
            for (uint32_t i = 0; i < count; i++) {
                written[i] = seen[i] != 1;
            }
        }
    }
    free(a.root);
    free(a.set);
    free(a.binding);
    free(a.written);
    free(seen);
}
