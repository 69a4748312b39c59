/* libFuzzer target: which storage buffers a kernel's SPIR-V may write, as
 * native_stubs/backends/vulkan_spirv.c decides it for staged crops, alone, built with
 * -fsanitize=fuzzer,address,undefined by fuzz/run.py.
 *
 * The input: the descriptor set, the first binding and the count of bindings asked about
 * (three little-endian 32-bit words; the count at most 4096, as the module reader allows),
 * then the SPIR-V module's words. Checked for every input: no sanitizer report (reads past the
 * module, overflows, leaks; UndefinedBehaviorSanitizer also checks every bool is 0 or 1), every
 * answer written and the same when asked again, and a module that is not SPIR-V at all (too
 * short for its header, or a bound of 0) answered "may write" for every binding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "backends/vulkan_spirv.h"

#define CHECK(condition)                                                          \
    do {                                                                          \
        if (!(condition)) {                                                       \
            fprintf(stderr, "vulkan_spirv: check failed: %s\n", #condition);      \
            abort();                                                              \
        }                                                                         \
    } while (0)

enum { MAX_BINDINGS = 4096 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t params[3] = {0, 0, 0};
    memcpy(params, data, size < sizeof params ? size : sizeof params);
    size_t rest = size > sizeof params ? size - sizeof params : 0;
    uint32_t set = params[0], first = params[1], count = params[2] % (MAX_BINDINGS + 1);
    size_t word_count = rest / 4;
    /* (exactly the module's words, so that AddressSanitizer sees a read past them) */
    uint32_t *words = malloc(word_count ? word_count * 4 : 1);
    bool *written = malloc(count + 1), *again = malloc(count + 1);
    CHECK(words && written && again);
    memcpy(words, data + sizeof params, word_count * 4);
    memset(written, 0x55, count + 1);
    shim_spirv_written(words, word_count, set, first, count, written);
    shim_spirv_written(words, word_count, set, first, count, again);
    for (uint32_t i = 0; i < count; i++) {
        uint8_t byte;
        memcpy(&byte, &written[i], 1);
        CHECK(byte == 0 || byte == 1);
        CHECK(written[i] == again[i]);
        if (word_count <= 5 || words[3] == 0) {
            CHECK(written[i]);
        }
    }
    free(words);
    free(written);
    free(again);
    return 0;
}
