/* Halide's Vulkan module format, read (vulkan_module.c), and the module vulkan_kernels.c makes
 * of it. Reading needs no Vulkan device, nor anything of the library but this header and
 * vulkan_api.h's types: fuzz/c/vulkan_module.c runs it alone, under sanitizers. Nothing outside
 * native_stubs/backends/ (and that harness) includes this. */
#ifndef SHIM_BACKENDS_VULKAN_MODULE_H
#define SHIM_BACKENDS_VULKAN_MODULE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/vulkan_api.h"

/* A compute pipeline made for one entry point and one set of specialization constants. */
typedef struct pipeline_entry {
    struct pipeline_entry *next;
    uint32_t count;
    uint32_t ids[4], values[4];
    VkPipeline pipeline;
} pipeline_entry;

typedef struct shared_allocation {
    uint32_t constant_id; /* 0: a fixed size */
    uint32_t type_size, array_size;
} shared_allocation;

typedef struct kernel_entry {
    char *name;
    uint32_t set; /* its descriptor set: its place among its SPIR-V module's entry points */
    uint32_t uniform_count, storage_count;
    uint32_t spec_count;
    uint32_t *spec_ids;
    uint32_t shared_count;
    shared_allocation *shared;
    uint32_t local_size_ids[3]; /* 0: the workgroup size is fixed in the SPIR-V */
    bool *writes; /* per buffer argument: whether the kernel may write it (vulkan_spirv.c) */
    struct spirv_module *spirv;
    pipeline_entry *pipelines; /* prepended under the module's lock, read without it */
} kernel_entry;

typedef struct spirv_module {
    /* Read: its code (in the module's `words`) and its entry points. */
    const uint32_t *code;
    size_t code_bytes;
    kernel_entry *first;
    uint32_t set_count; /* its entry points, one descriptor set each */
    /* Made (vulkan_kernels.c). */
    VkShaderModule shader;
    VkPipelineLayout layout;
    VkDescriptorSetLayout *sets;
} spirv_module;

/* A module as the code of one release calls it: the state halide_vulkan_initialize_kernels
 * gives a library, which its halide_vulkan_run calls then pass. Libraries of different
 * releases with the same source share the module, each launching by its own convention. */
typedef struct module_state {
    struct shim_vk_module *module;
    bool buffer_offsets; /* Halide 22's kernels: Release.vulkan_buffer_offsets */
} module_state;

struct shim_vk_module {
    uint32_t *words; /* the source, aligned: the SPIR-V modules' code until they are made */
    uint32_t spirv_count, entry_count;
    spirv_module *spirvs;
    kernel_entry *entries;
    pthread_mutex_t lock;
    module_state states[2]; /* [buffer_offsets] */
};

/* Why a module was not read. */
typedef enum { SHIM_VK_READ_OK, SHIM_VK_READ_MALFORMED, SHIM_VK_READ_NO_MEMORY } shim_vk_read_result;

/* Halide's Vulkan module `source` (`size` bytes) read into a new module, its Vulkan objects not
 * made (every handle 0); NULL where it is malformed or memory ran out (`*result` says which),
 * with nothing left allocated. */
struct shim_vk_module *shim_vk_module_read(const void *source, size_t size,
                                           shim_vk_read_result *result);

/* Free a module that was read and of which nothing was made on the device. */
void shim_vk_module_discard(struct shim_vk_module *module);

#endif
