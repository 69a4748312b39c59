/* libFuzzer target: Halide's Vulkan module format as native_stubs/backends/vulkan_module.c reads
 * it, alone (no Vulkan device), built with -fsanitize=fuzzer,address,undefined by fuzz/run.py.
 *
 * Checked for every input: no sanitizer report (out-of-bounds or misaligned read, overflow,
 * leak); a module read or refused, never both or neither; and for a module read, what
 * vulkan_kernels.c later trusts: every entry point named by a string that ends within the
 * source, in its SPIR-V module's range, with counts within the reader's limits, and every
 * SPIR-V module's code inside the source, starting with SPIR-V's magic number and its 5-word
 * header. Every byte of it is read here, so that AddressSanitizer sees a range that is not. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan_module.h"

#define CHECK(condition)                                                          \
    do {                                                                          \
        if (!(condition)) {                                                       \
            fprintf(stderr, "vulkan_module: check failed: %s\n", #condition);     \
            abort();                                                              \
        }                                                                         \
    } while (0)

static volatile uint32_t sink;

static void check_module(const struct shim_vk_module *m, size_t size) {
    CHECK(m->spirv_count > 0 && m->entry_count > 0);
    uint32_t entries = 0;
    for (uint32_t k = 0; k < m->spirv_count; k++) {
        const spirv_module *spirv = &m->spirvs[k];
        CHECK(spirv->code >= m->words && spirv->code_bytes >= 20 && spirv->code_bytes % 4 == 0);
        CHECK((size_t)(spirv->code - m->words) * 4 + spirv->code_bytes <= size);
        CHECK(spirv->code[0] == 0x07230203u);
        uint32_t sum = 0;
        for (size_t w = 0; w < spirv->code_bytes / 4; w++) {
            sum += spirv->code[w];
        }
        sink = sum;
        CHECK(spirv->first == m->entries + entries && spirv->set_count > 0);
        entries += spirv->set_count;
        CHECK(entries <= m->entry_count);
        for (uint32_t n = 0; n < spirv->set_count; n++) {
            const kernel_entry *e = &spirv->first[n];
            CHECK(e->name != NULL && strlen(e->name) < size);
            CHECK(e->set == n && e->spirv == spirv && e->pipelines == NULL);
            CHECK(e->uniform_count <= 1 && e->storage_count <= 4096);
            CHECK(e->spec_count <= 64 && e->shared_count <= 64);
            for (uint32_t c = 0; c < e->spec_count; c++) {
                sink = e->spec_ids[c];
            }
            for (uint32_t a = 0; a < e->shared_count; a++) {
                sink = e->shared[a].constant_id + e->shared[a].type_size + e->shared[a].array_size;
            }
        }
    }
    CHECK(entries == m->entry_count);
    CHECK(m->states[0].module == m && !m->states[0].buffer_offsets);
    CHECK(m->states[1].module == m && m->states[1].buffer_offsets);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    shim_vk_read_result result = (shim_vk_read_result)-1;
    struct shim_vk_module *module = shim_vk_module_read(data, size, &result);
    if (module != NULL) {
        CHECK(result == SHIM_VK_READ_OK);
        check_module(module, size);
        shim_vk_module_discard(module);
    } else {
        CHECK(result == SHIM_VK_READ_MALFORMED || result == SHIM_VK_READ_NO_MEMORY);
    }
    return 0;
}
