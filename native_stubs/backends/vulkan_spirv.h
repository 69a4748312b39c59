/* Which storage buffers a kernel's SPIR-V may write (vulkan_spirv.c), for the launches in
 * vulkan_kernels.c: a staged crop the kernel only reads is not copied back. */
#ifndef SHIM_BACKENDS_VULKAN_SPIRV_H
#define SHIM_BACKENDS_VULKAN_SPIRV_H

#include "shim_native.h"

/* For each of the `count` bindings from `first` of descriptor set `set`, whether the code in
 * the SPIR-V module of `word_count` words (header included) may write the buffer bound there:
 * written[i] for binding first + i. True wherever it cannot tell. */
void shim_spirv_written(const uint32_t *words, size_t word_count, uint32_t set, uint32_t first,
                        uint32_t count, bool *written);

#endif
