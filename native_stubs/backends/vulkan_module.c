/* Halide's Vulkan module format, read: the bytes a pipeline hands halide_vulkan_initialize_kernels,
 * which vulkan_kernels.c then makes shader modules and layouts of.
 *
 * Halide's module (src/runtime/vulkan_resources.h: vk_compile_kernel_module,
 * vk_decode_shader_bindings), in 32-bit words: [kernel count] then, per kernel, [its SPIR-V
 * module's bytes, its name's words, its name]; then the SPIR-V modules, each starting with a
 * header of its own: [the header's words, its entry point count] then per entry point [name
 * words, name, uniform buffer count, storage buffer count, specialization constant count, per
 * constant (name words, name, id, type size), shared allocation count, per allocation (name
 * words, name, constant id, type size, array size), the workgroup size's three constant ids].
 *
 * Every count is checked against the words left before anything is allocated for it, and a
 * module that does not parse leaves nothing allocated (fuzz/c/vulkan_module.c runs this alone,
 * under AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer). */
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan_module.h"

enum {
    MAX_KERNELS = 4096,
    MAX_ENTRY_POINTS = 256, /* per SPIR-V module */
    MAX_CONSTANTS = 64,     /* specialization constants, and shared allocations, per entry point */
    MAX_STORAGE_BUFFERS = 4096,
    /* An entry point's fewest words: its name (a count and a word), three counts, the shared
     * allocations' count and three constant ids. */
    ENTRY_MIN_WORDS = 9,
    SPIRV_HEADER_WORDS = 5, /* SPIR-V's own header: magic number, version, generator, bound, 0 */
};
static const uint32_t SPIRV_MAGIC = 0x07230203u;

/* Reads Halide's words, never past the end. */
typedef struct {
    const uint32_t *words;
    size_t count, next;
    bool bad;
} reader;

static uint32_t word(reader *r) {
    if (r->next >= r->count) {
        r->bad = true;
        return 0;
    }
    return r->words[r->next++];
}

/* A string of `n` words (padded with NULs); NULL if it runs past the end or has no NUL. */
static const char *string(reader *r, uint32_t n) {
    if (n == 0 || n > r->count - r->next || r->bad) {
        r->bad = true;
        return NULL;
    }
    const char *s = (const char *)(r->words + r->next);
    r->next += n;
    if (memchr(s, 0, n * sizeof(uint32_t)) == NULL) {
        r->bad = true;
        return NULL;
    }
    return s;
}

/* Reads one SPIR-V module's header of entry points (the words after its first two) into its
 * entries. */
static shim_vk_read_result read_entries(reader *r, spirv_module *spirv) {
    for (uint32_t n = 0; n < spirv->set_count; n++) {
        kernel_entry *e = &spirv->first[n];
        const char *name = string(r, word(r));
        if (name == NULL) {
            return SHIM_VK_READ_MALFORMED;
        }
        if ((e->name = strdup(name)) == NULL) {
            return SHIM_VK_READ_NO_MEMORY;
        }
        e->set = n;
        e->spirv = spirv;
        e->uniform_count = word(r);
        e->storage_count = word(r);
        e->spec_count = word(r);
        if (r->bad || e->spec_count > MAX_CONSTANTS || e->uniform_count > 1 ||
            e->storage_count > MAX_STORAGE_BUFFERS) {
            return SHIM_VK_READ_MALFORMED;
        }
        if ((e->spec_ids = calloc(e->spec_count + 1, sizeof *e->spec_ids)) == NULL) {
            return SHIM_VK_READ_NO_MEMORY;
        }
        for (uint32_t c = 0; c < e->spec_count; c++) {
            string(r, word(r)); /* (its name) */
            e->spec_ids[c] = word(r);
            word(r); /* its type's size: Halide's are 32-bit */
        }
        e->shared_count = word(r);
        if (r->bad || e->shared_count > MAX_CONSTANTS) {
            return SHIM_VK_READ_MALFORMED;
        }
        if ((e->shared = calloc(e->shared_count + 1, sizeof *e->shared)) == NULL) {
            return SHIM_VK_READ_NO_MEMORY;
        }
        for (uint32_t a = 0; a < e->shared_count; a++) {
            string(r, word(r)); /* (its variable's name) */
            e->shared[a].constant_id = word(r);
            e->shared[a].type_size = word(r);
            e->shared[a].array_size = word(r);
        }
        for (int d = 0; d < 3; d++) {
            e->local_size_ids[d] = word(r);
        }
        if (r->bad) {
            return SHIM_VK_READ_MALFORMED;
        }
    }
    return SHIM_VK_READ_OK;
}

/* The SPIR-V module of `words` (its bytes, checked) at words[start]: its header's words and
 * its entry point count, checked against its size; false if they do not fit. */
static bool spirv_header(const uint32_t *words, size_t start, uint32_t module_words,
                         uint32_t *header, uint32_t *entry_points) {
    reader r = {words + start, module_words, 0, false};
    *header = word(&r);
    *entry_points = word(&r);
    /* (Room for the entry points in the header, and for SPIR-V's own header after it.) */
    return !r.bad && *header >= 2 && *header <= module_words &&
           module_words - *header >= SPIRV_HEADER_WORDS && *entry_points > 0 &&
           *entry_points < MAX_ENTRY_POINTS && *entry_points <= (*header - 2) / ENTRY_MIN_WORDS;
}

static shim_vk_read_result read_kernels(struct shim_vk_module *module, size_t count) {
    reader top = {module->words, count, 0, false};
    uint32_t kernel_count = word(&top);
    if (top.bad || kernel_count == 0 || kernel_count >= MAX_KERNELS) {
        return SHIM_VK_READ_MALFORMED;
    }
    /* Each SPIR-V module's words, and the words of its header of entry points. */
    uint32_t sizes[MAX_KERNELS], headers[MAX_KERNELS];
    for (uint32_t k = 0; k < kernel_count; k++) {
        uint32_t bytes = word(&top);
        if (string(&top, word(&top)) == NULL || bytes % 4 != 0) {
            return SHIM_VK_READ_MALFORMED;
        }
        sizes[k] = bytes / 4;
    }
    /* The SPIR-V modules follow, each within the source: count their entry points first, for
     * one array of them. */
    size_t start = top.next, total = 0;
    for (uint32_t k = 0; k < kernel_count; k++) {
        uint32_t entry_points;
        if (sizes[k] > count - start ||
            !spirv_header(module->words, start, sizes[k], &headers[k], &entry_points)) {
            return SHIM_VK_READ_MALFORMED;
        }
        total += entry_points;
        start += sizes[k];
    }
    module->spirvs = calloc(kernel_count, sizeof *module->spirvs);
    module->entries = calloc(total, sizeof *module->entries);
    if (module->spirvs == NULL || module->entries == NULL) {
        return SHIM_VK_READ_NO_MEMORY;
    }
    module->spirv_count = kernel_count;
    module->entry_count = (uint32_t)total; /* (at most MAX_KERNELS * MAX_ENTRY_POINTS) */
    start = top.next;
    kernel_entry *next = module->entries;
    for (uint32_t k = 0; k < kernel_count; k++) {
        uint32_t header = headers[k];
        spirv_module *spirv = &module->spirvs[k];
        spirv->first = next;
        spirv->set_count = module->words[start + 1]; /* (its entry points, as counted) */
        next += spirv->set_count;
        /* The entry points lie within the header, past its first two words. */
        reader r = {module->words + start, header, 2, false};
        shim_vk_read_result result = read_entries(&r, spirv);
        if (result != SHIM_VK_READ_OK) {
            return result;
        }
        /* The SPIR-V after the header must at least look like SPIR-V (its magic number; its
         * 5-word header fits, as spirv_header checked): drivers need not check, and may crash
         * on garbage. */
        spirv->code = module->words + start + header;
        spirv->code_bytes = (size_t)(sizes[k] - header) * 4;
        if (spirv->code[0] != SPIRV_MAGIC) {
            return SHIM_VK_READ_MALFORMED;
        }
        start += sizes[k];
    }
    return SHIM_VK_READ_OK;
}

struct shim_vk_module *shim_vk_module_read(const void *source, size_t size,
                                           shim_vk_read_result *result) {
    size_t count = size / 4; /* (a last partial word is not part of any field) */
    struct shim_vk_module *module = calloc(1, sizeof *module);
    if (module == NULL || (module->words = malloc(count ? count * 4 : 4)) == NULL) {
        free(module);
        *result = SHIM_VK_READ_NO_MEMORY;
        return NULL;
    }
    memcpy(module->words, source, count * 4); /* (aligned for the reads) */
    pthread_mutex_init(&module->lock, NULL);
    module->states[0] = (module_state){module, false};
    module->states[1] = (module_state){module, true};
    *result = read_kernels(module, count);
    if (*result != SHIM_VK_READ_OK) {
        shim_vk_module_discard(module);
        return NULL;
    }
    return module;
}

void shim_vk_module_discard(struct shim_vk_module *module) {
    if (module == NULL) {
        return;
    }
    for (uint32_t i = 0; module->entries != NULL && i < module->entry_count; i++) {
        free(module->entries[i].name);
        free(module->entries[i].spec_ids);
        free(module->entries[i].shared);
        free(module->entries[i].writes);
    }
    for (uint32_t k = 0; module->spirvs != NULL && k < module->spirv_count; k++) {
        free(module->spirvs[k].sets);
    }
    free(module->entries);
    free(module->spirvs);
    free(module->words);
    pthread_mutex_destroy(&module->lock);
    free(module);
}
