/* Halide's Vulkan kernels: its module format, shader modules and compute pipelines, and the
 * launches (halide_vulkan_run), all in C on the device vulkan.c makes.
 *
 * A module is made once per source for the process (shim/backends/vulkan.py keeps them by
 * digest): every SPIR-V module in it becomes a VkShaderModule with its pipeline layout, and
 * every entry point a descriptor set layout. A compute pipeline is made once per entry point
 * and specialization (the workgroup size and dynamic shared memory Halide binds to
 * specialization constants), where Halide's runtime remakes it at every launch that has any.
 * A launch records into a submission of its own (vulkan_memory.c): descriptor sets, scalar
 * arguments and staging are the submission's, so any number of threads launch at once.
 *
 * Crops at any offset. A kernel takes each buffer as a storage-buffer descriptor, and how it
 * finds a crop's elements there depends on the release that built it
 * (Release.vulkan_buffer_offsets, recorded in the state each library's code gets):
 * - Halide 19's and 21's SPIR-V indexes a buffer from the descriptor's start with no offset of
 *   its own; Vulkan takes a descriptor offset only at a multiple of
 *   minStorageBufferOffsetAlignment (16 bytes on lavapipe, up to 256 on GPUs), and Halide's
 *   runtime fails a crop anywhere else (Halide issue 8944). A launch therefore binds an aligned
 *   crop in place and stages any other: the crop's span is copied to a buffer of its own, the
 *   kernel runs on that, and, if the kernel may write the crop (its SPIR-V says: see
 *   vulkan_spirv.c), the crop's elements (not the gaps between its rows, which other buffers
 *   may own) are copied back, all in the launch's one submission, which runs after
 *   everything submitted before it and before everything after, so no other work sees the
 *   staged copy.
 * - Halide 22's (PR 8954) reads an int32 element offset per buffer from its uniform buffer,
 *   after the scalar arguments, and adds it to every index: every buffer is bound whole from
 *   the start of its VkBuffer and its offset passed, so a crop anywhere is used in place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "shim_native.h"
#include "calls/releases.h"
#include "profiling/profile.h"
#include "backends/vulkan_api.h"
#include "backends/vulkan_device.h"
#include "backends/vulkan_module.h"
#include "backends/vulkan_spirv.h"
#include "devices/element_layout.h"

/* --- modules (read by vulkan_module.c) ---------------------------------------------------- */

static VkResult make_layouts(spirv_module *spirv, const kernel_entry *entries) {
    VkDevice device = shim_vk.device;
    VkResult result = VK_SUCCESS;
    for (uint32_t n = 0; n < spirv->set_count && result == VK_SUCCESS; n++) {
        const kernel_entry *e = &entries[n];
        uint32_t count = e->uniform_count + e->storage_count;
        VkDescriptorSetLayoutBinding *bindings = calloc(count + 1, sizeof *bindings);
        if (bindings == NULL) {
            return VK_ERROR_OUT_OF_HOST_MEMORY;
        }
        /* As Halide: the scalar arguments' uniform buffer first, then one storage buffer per
         * buffer argument, in order. */
        for (uint32_t b = 0; b < count; b++) {
            bindings[b] = (VkDescriptorSetLayoutBinding){
                b, b < e->uniform_count ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
                                        : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                1, VK_SHADER_STAGE_COMPUTE_BIT, NULL};
        }
        VkDescriptorSetLayoutCreateInfo info = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                                NULL, 0, count, bindings};
        result = VK(vkCreateDescriptorSetLayout,
                    VkResult (*)(VkDevice, const VkDescriptorSetLayoutCreateInfo *, const void *,
                                 VkDescriptorSetLayout *),
                    device, &info, NULL, &spirv->sets[n]);
        free(bindings);
    }
    if (result == VK_SUCCESS) {
        /* Every entry point's set in one layout: entry point n binds set n, as Halide's code
         * expects. */
        VkPipelineLayoutCreateInfo info = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0,
                                           spirv->set_count, spirv->sets, 0, NULL};
        result = VK(vkCreatePipelineLayout, VkResult (*)(VkDevice, const VkPipelineLayoutCreateInfo *,
                                                         const void *, VkPipelineLayout *),
                    device, &info, NULL, &spirv->layout);
    }
    return result;
}

shim_vk_module *shim_vk_module_new(const void *source, size_t size, char *message,
                                   size_t message_size) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
        (void)shim_vk_say(message, message_size, 0, "no Vulkan device");
        return NULL;
    }
    shim_vk_read_result read;
    shim_vk_module *module = shim_vk_module_read(source, size, &read);
    if (module == NULL) {
        (void)shim_vk_say(message, message_size, 0,
                          read == SHIM_VK_READ_NO_MEMORY
                              ? "out of memory reading the module (%zu bytes)"
                              : "not a Halide Vulkan module: its header of entry points does "
                                "not parse (%zu bytes)",
                          size);
        return NULL;
    }
    VkResult result = VK_SUCCESS;
    /* Which buffers each entry point may write, from its SPIR-V (vulkan_spirv.c). */
    for (uint32_t i = 0; i < module->entry_count && result == VK_SUCCESS; i++) {
        kernel_entry *e = &module->entries[i];
        e->writes = malloc((e->storage_count + 1) * sizeof *e->writes);
        if (e->writes == NULL) {
            result = VK_ERROR_OUT_OF_HOST_MEMORY;
        } else {
            shim_spirv_written(e->spirv->code, e->spirv->code_bytes / 4, e->set,
                               e->uniform_count, e->storage_count, e->writes);
        }
    }
    for (uint32_t k = 0; k < module->spirv_count && result == VK_SUCCESS; k++) {
        spirv_module *spirv = &module->spirvs[k];
        VkShaderModuleCreateInfo info = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0,
                                         spirv->code_bytes, spirv->code};
        result = VK(vkCreateShaderModule, VkResult (*)(VkDevice, const VkShaderModuleCreateInfo *,
                                                       const void *, VkShaderModule *),
                    shim_vk.device, &info, NULL, &spirv->shader);
        spirv->sets = calloc(spirv->set_count, sizeof *spirv->sets);
        if (result == VK_SUCCESS) {
            result = spirv->sets ? make_layouts(spirv, spirv->first) : VK_ERROR_OUT_OF_HOST_MEMORY;
        }
    }
    /* The code is the driver's now. */
    for (uint32_t k = 0; k < module->spirv_count; k++) {
        module->spirvs[k].code = NULL;
    }
    free(module->words);
    module->words = NULL;
    if (result != VK_SUCCESS) {
        (void)shim_vk_say(message, message_size, 0,
                          "making the module's shader modules and layouts failed: %s",
                          shim_vk_result_name(result));
        /* What was made stays: a module is made once per source, and a failed one is rare. */
        return NULL;
    }
    return module;
}

/* --- pipelines ----------------------------------------------------------------------------- */

/* The specialization constants a launch sets (Halide's vk_setup_compute_pipeline): the
 * dynamic shared memory's array size, then the workgroup size; -1 after halide_error where
 * the kernel cannot take them. */
static int dispatch_constants(void *user_context, const kernel_entry *e, int shared_mem_bytes,
                              const int threads[3], uint32_t ids[4], uint32_t values[4]) {
    uint32_t count = 0;
    const VkPhysicalDeviceLimits *limits = &shim_vk.properties.limits;
    if (e->shared_count > 0 && shared_mem_bytes > 0) {
        uint32_t fixed = 0, dynamic_id = 0, dynamic_size = 0;
        for (uint32_t a = 0; a < e->shared_count; a++) {
            if (e->shared[a].constant_id == 0) {
                fixed += e->shared[a].type_size * e->shared[a].array_size;
            } else if (dynamic_id != 0) {
                halide_error(user_context, "Vulkan: a kernel with more than one dynamic shared "
                                           "memory allocation\n");
                return -1;
            } else {
                dynamic_id = e->shared[a].constant_id;
                dynamic_size = e->shared[a].type_size;
            }
        }
        if ((uint32_t)shared_mem_bytes > limits->maxComputeSharedMemorySize ||
            fixed > limits->maxComputeSharedMemorySize) {
            halide_error(user_context, "Vulkan: the kernel needs more shared memory than the "
                                       "device has\n");
            return -1;
        }
        if (dynamic_id != 0 && (uint32_t)shared_mem_bytes > fixed && dynamic_size > 0) {
            ids[count] = dynamic_id;
            values[count++] = ((uint32_t)shared_mem_bytes - fixed) / dynamic_size;
        }
    }
    if (e->local_size_ids[0] != 0) {
        for (int d = 0; d < 3; d++) {
            ids[count] = e->local_size_ids[d];
            values[count++] = (uint32_t)threads[d];
        }
    }
    for (uint32_t c = 0; c < count; c++) {
        bool found = false;
        for (uint32_t k = 0; k < e->spec_count && !found; k++) {
            found = e->spec_ids[k] == ids[c];
        }
        if (!found) {
            halide_error(user_context, "Vulkan: the kernel's module does not declare the "
                                       "specialization constant its launch sets\n");
            return -1;
        }
    }
    return (int)count;
}

static pipeline_entry *find_pipeline(pipeline_entry *p, uint32_t count, const uint32_t *ids,
                                     const uint32_t *values) {
    for (; p != NULL; p = p->next) {
        if (p->count == count && memcmp(p->ids, ids, count * 4) == 0 &&
            memcmp(p->values, values, count * 4) == 0) {
            return p;
        }
    }
    return NULL;
}

/* The entry point's pipeline for these constants, made once. */
static VkPipeline pipeline_for(shim_vk_module *module, kernel_entry *e, uint32_t count,
                               const uint32_t *ids, const uint32_t *values, VkResult *result) {
    *result = VK_SUCCESS;
    pipeline_entry *p = find_pipeline(__atomic_load_n(&e->pipelines, __ATOMIC_ACQUIRE), count,
                                      ids, values);
    if (p != NULL) {
        return p->pipeline;
    }
    pthread_mutex_lock(&module->lock);
    p = find_pipeline(e->pipelines, count, ids, values);
    if (p == NULL && (p = calloc(1, sizeof *p)) == NULL) {
        *result = VK_ERROR_OUT_OF_HOST_MEMORY;
    } else if (p->pipeline == 0) {
        VkSpecializationMapEntry map[4];
        for (uint32_t c = 0; c < count; c++) {
            map[c] = (VkSpecializationMapEntry){ids[c], c * 4, 4};
        }
        p->count = count;
        memcpy(p->ids, ids, count * 4);
        memcpy(p->values, values, count * 4);
        VkSpecializationInfo specialization = {count, map, count * 4, p->values};
        VkComputePipelineCreateInfo info = {
            VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, NULL, 0,
            {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, NULL, 0,
             VK_SHADER_STAGE_COMPUTE_BIT, e->spirv->shader, e->name,
             count ? &specialization : NULL},
            e->spirv->layout, 0, -1};
        *result = VK(vkCreateComputePipelines,
                     VkResult (*)(VkDevice, VkPipelineCache, uint32_t,
                                  const VkComputePipelineCreateInfo *, const void *, VkPipeline *),
                     shim_vk.device, 0, 1, &info, NULL, &p->pipeline);
        if (*result == VK_SUCCESS) {
            p->next = e->pipelines;
            __atomic_store_n(&e->pipelines, p, __ATOMIC_RELEASE);
        } else {
            free(p);
            p = NULL;
        }
    }
    pthread_mutex_unlock(&module->lock);
    return p ? p->pipeline : 0;
}

/* --- a submission's descriptors and arguments ---------------------------------------------- */

static VkResult descriptor_set_for(shim_vk_submission *s, const kernel_entry *e, VkDescriptorSet *set) {
    VkDevice device = shim_vk.device;
    VkResult result = VK_SUCCESS;
    if (s->descriptors == 0 || s->uniform_capacity < e->uniform_count ||
        s->storage_capacity < e->storage_count) {
        if (s->descriptors != 0) {
            VK(vkDestroyDescriptorPool, void (*)(VkDevice, VkDescriptorPool, const void *), device,
               s->descriptors, NULL);
            s->descriptors = 0;
        }
        uint32_t uniform = e->uniform_count > 1 ? e->uniform_count : 1;
        uint32_t storage = e->storage_count > 16 ? e->storage_count : 16;
        VkDescriptorPoolSize sizes[2] = {{VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, uniform},
                                         {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, storage}};
        VkDescriptorPoolCreateInfo info = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, NULL, 0,
                                           1, 2, sizes};
        result = VK(vkCreateDescriptorPool, VkResult (*)(VkDevice, const VkDescriptorPoolCreateInfo *,
                                                         const void *, VkDescriptorPool *),
                    device, &info, NULL, &s->descriptors);
        if (result != VK_SUCCESS) {
            s->descriptors = 0;
            return result;
        }
        s->uniform_capacity = uniform;
        s->storage_capacity = storage;
    } else {
        /* (the set of the submission's last launch, which has completed) */
        result = VK(vkResetDescriptorPool, VkResult (*)(VkDevice, VkDescriptorPool, VkFlags),
                    device, s->descriptors, 0);
    }
    if (result == VK_SUCCESS) {
        VkDescriptorSetAllocateInfo info = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, NULL,
                                            s->descriptors, 1, &e->spirv->sets[e->set]};
        result = VK(vkAllocateDescriptorSets, VkResult (*)(VkDevice,
                                                           const VkDescriptorSetAllocateInfo *,
                                                           VkDescriptorSet *),
                    device, &info, set);
    }
    return result;
}

/* The submission's scalar-argument buffer, of at least `size` bytes. */
static VkResult arguments_for(shim_vk_submission *s, size_t size) {
    if (s->arguments != NULL && s->arguments->size >= size) {
        return VK_SUCCESS;
    }
    shim_vk_memory_delete(s->arguments);
    VkResult result;
    s->arguments = shim_vk_memory_new(size > 256 ? size : 256, SHIM_VK_UNIFORM, &result);
    return s->arguments ? VK_SUCCESS : result;
}

/* --- staging misaligned crops ---------------------------------------------------------------- */

typedef struct {
    const shim_vk_handle *handle;
    shim_vk_memory *copy;
    shim_layout layout;
    bool written; /* given as an argument the kernel may write: copied back */
} staged_buffer;

/* Staging buffers, kept for the next launches: a few, of bounded size, so that a crop staged at
 * every launch does not allocate at every launch. */
enum { SPARE_STAGING = 8 };
static const VkDeviceSize SPARE_STAGING_BYTES = 64 << 20;
static shim_vk_memory *spare_staging[SPARE_STAGING];
static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;

static shim_vk_memory *take_staging(VkDeviceSize size, VkResult *result) {
    shim_vk_memory *best = NULL;
    int at = -1;
    pthread_mutex_lock(&spare_lock);
    for (int i = 0; i < SPARE_STAGING; i++) { /* the smallest that fits */
        shim_vk_memory *m = spare_staging[i];
        if (m != NULL && m->size >= size && (best == NULL || m->size < best->size)) {
            best = m;
            at = i;
        }
    }
    if (at >= 0) {
        spare_staging[at] = NULL;
    }
    pthread_mutex_unlock(&spare_lock);
    *result = VK_SUCCESS;
    return best ? best : shim_vk_memory_new(size, SHIM_VK_DEVICE, result);
}

static void give_staging(shim_vk_memory *memory) {
    if (memory == NULL) {
        return;
    }
    pthread_mutex_lock(&spare_lock);
    int smallest = -1;
    for (int i = 0; i < SPARE_STAGING && memory != NULL; i++) {
        if (spare_staging[i] == NULL) {
            if (memory->size <= SPARE_STAGING_BYTES) {
                spare_staging[i] = memory;
                memory = NULL;
            }
        } else if (smallest < 0 || spare_staging[i]->size < spare_staging[smallest]->size) {
            smallest = i;
        }
    }
    if (memory != NULL && memory->size <= SPARE_STAGING_BYTES && smallest >= 0 &&
        spare_staging[smallest]->size < memory->size) {
        shim_vk_memory *evicted = spare_staging[smallest]; /* bigger ones serve more crops */
        spare_staging[smallest] = memory;
        memory = evicted;
    }
    pthread_mutex_unlock(&spare_lock);
    shim_vk_memory_delete(memory);
}

/* Where a buffer's elements lie around its min element, in bytes: from `*low` (below 0 where a
 * stride is negative) to `*high`, just past the highest; both 0 where it has none. */
static void extent_of(const halide_buffer_t *buf, int64_t *low, int64_t *high) {
    int64_t below = 0, above = 0;
    *low = *high = 0;
    for (int d = 0; d < buf->dimensions; d++) {
        if (buf->dim[d].extent <= 0) {
            return;
        }
        int64_t reach = (int64_t)(buf->dim[d].extent - 1) * buf->dim[d].stride;
        below += reach < 0 ? reach : 0;
        above += reach > 0 ? reach : 0;
    }
    *low = below * shim_element_bytes(buf);
    *high = (above + 1) * shim_element_bytes(buf);
}

/* The range of a storage-buffer descriptor from byte `from` of a handle's VkBuffer: the rest of
 * it, or the most one descriptor may span (maxStorageBufferRange) where the rest is more. */
static VkDeviceSize range_from(const shim_vk_handle *handle, VkDeviceSize from) {
    VkDeviceSize max_range = shim_vk.properties.limits.maxStorageBufferRange;
    if (handle->memory != NULL && handle->memory->size > 0 &&
        ((handle->memory->size + 3) & ~(VkDeviceSize)3) - from > max_range) {
        return max_range & ~(VkDeviceSize)3;
    }
    return VK_WHOLE_SIZE;
}

/* The copies of a staged crop's elements, only those, back from its staging buffer to where
 * the crop is: one region per run (the elements of a row, or more where rows follow each
 * other), recorded a batch of regions at a time as the walk finds them. */
enum { REGION_BATCH = 128 };

typedef struct {
    VkCommandBuffer commands;
    VkBuffer from, to;
    VkDeviceSize to_offset, run;
    uint32_t used;
    VkBufferCopy regions[REGION_BATCH];
} region_batch;

static void record_regions(region_batch *batch) {
    if (batch->used > 0) {
        VK(vkCmdCopyBuffer, void (*)(VkCommandBuffer, VkBuffer, VkBuffer, uint32_t,
                                     const VkBufferCopy *),
           batch->commands, batch->from, batch->to, batch->used, batch->regions);
        batch->used = 0;
    }
}

static bool add_run(int64_t at, int64_t to, void *context) {
    (void)to; /* (the same layout on both sides) */
    region_batch *batch = context;
    batch->regions[batch->used++] = (VkBufferCopy){(VkDeviceSize)at,
                                                   batch->to_offset + (VkDeviceSize)at, batch->run};
    if (batch->used == REGION_BATCH) {
        record_regions(batch);
    }
    return true;
}

static void copy_back(VkCommandBuffer commands, staged_buffer *b) {
    region_batch batch = {commands, b->copy->buffer, b->handle->buffer, b->handle->offset,
                          (VkDeviceSize)b->layout.run, 0, {{0}}};
    shim_layout_walk(&b->layout, 0, add_run, &batch);
    record_regions(&batch);
}

/* --- launches -------------------------------------------------------------------------------- */

static int failed(void *user_context, const char *what, const char *entry, VkResult result) {
    char msg[256];
    snprintf(msg, sizeof msg, "Vulkan: %s failed for kernel %s: %s\n", what, entry,
             shim_vk_result_name(result));
    halide_error(user_context, msg);
    return halide_error_code_gpu_device_error;
}

static kernel_entry *find_entry(shim_vk_module *module, const char *name) {
    for (uint32_t i = 0; i < module->entry_count; i++) {
        if (strcmp(module->entries[i].name, name) == 0) {
            return &module->entries[i];
        }
    }
    return NULL;
}

/* Halide 22's kernels index a buffer from the start of its VkBuffer plus the element offset
 * of its min element, an int32 the launch passes. A handle's offset is where the min element
 * is, in bytes, whatever the buffer is a crop of (Halide 22's own runtime counts a crop of a
 * crop from the owner, losing the intermediate crop's offset). False after halide_error where
 * the kernel cannot reach the buffer that way. */
static bool element_offset(void *user_context, const char *entry, int number,
                           const halide_buffer_t *buf, int32_t *offset) {
    const shim_vk_handle *handle = (const shim_vk_handle *)buf->device;
    uint64_t elem = (uint64_t)shim_element_bytes(buf);
    int64_t low, high;
    extent_of(buf, &low, &high);
    const char *why = NULL;
    if (elem == 0 || handle->offset % elem != 0) {
        why = "does not start a whole number of elements of its type in (memory taken at an odd "
              "byte offset)";
    } else if (handle->offset / elem > INT32_MAX ||
               (handle->offset + (uint64_t)high) / elem > (uint64_t)INT32_MAX + 1) {
        why = "lies beyond the int32 element indices the kernel addresses its VkBuffer with";
    } else if ((int64_t)handle->offset + low < 0) {
        why = "reaches below the start of its VkBuffer";
    } else if (range_from(handle, 0) != VK_WHOLE_SIZE &&
               handle->offset + (uint64_t)high > range_from(handle, 0)) {
        why = "reaches past the bytes one descriptor may span from the start of its VkBuffer "
              "(maxStorageBufferRange)";
    }
    if (why != NULL) {
        char msg[512];
        snprintf(msg, sizeof msg, "Vulkan: kernel %s takes buffer argument %d whole, at an element "
                 "offset, and the buffer (%llu bytes into its VkBuffer) %s\n", entry, number,
                 (unsigned long long)handle->offset, why);
        halide_error(user_context, msg);
        return false;
    }
    *offset = (int32_t)(handle->offset / elem);
    return true;
}

/* One launch's submission: its descriptor set and arguments, the misaligned crops staged in,
 * the dispatch, the elements of the staged crops it may write back; submitted, and left
 * running where the device allows. `offsets`: each buffer's element offset, for Halide 22's
 * kernels (NULL: Halide 19's and 21's, which stage). `staged` receives the staging buffers and
 * their layouts, which the caller keeps for later launches, and frees, once this one is
 * submitted. */
static int record_and_run(void *user_context, kernel_entry *e,
                          VkPipeline pipeline, int count, size_t arg_sizes[], void *args[],
                          int8_t arg_is_buffer[], const int32_t *offsets, const int blocks[3],
                          staged_buffer *staged, int *staged_count) {
    VkResult result;
    shim_vk_submission *s = shim_vk_begin(&result);
    if (s == NULL) {
        return failed(user_context, "starting a command buffer", e->name, result);
    }
    VkDescriptorSet set = 0;
    result = descriptor_set_for(s, e, &set);
    if (result != VK_SUCCESS) {
        shim_vk_abandon(s);
        return failed(user_context, "allocating a descriptor set", e->name, result);
    }
    size_t scalar_bytes = 0, buffers = 0;
    for (int i = 0; i < count; i++) {
        scalar_bytes += arg_is_buffer[i] ? 0 : arg_sizes[i];
        buffers += arg_is_buffer[i] ? 1 : 0;
    }
    /* Halide 22's uniform buffer: the scalars, zeros to a multiple of 4 bytes, the offsets. */
    size_t offsets_at = (scalar_bytes + 3) & ~(size_t)3;
    size_t uniform_bytes = offsets != NULL ? offsets_at + 4 * buffers : scalar_bytes;
    VkDescriptorBufferInfo infos[count + 1];
    VkWriteDescriptorSet writes[count + 1];
    uint32_t binding = 0;
    if (e->uniform_count > 0) {
        result = arguments_for(s, uniform_bytes);
        if (result != VK_SUCCESS) {
            shim_vk_abandon(s);
            return failed(user_context, "allocating the scalar arguments' buffer", e->name, result);
        }
        /* Packed in order, as Halide's kernels read them. */
        size_t at = 0;
        for (int i = 0; i < count; i++) {
            if (!arg_is_buffer[i]) {
                memcpy(s->arguments->mapped + at, args[i], arg_sizes[i]);
                at += arg_sizes[i];
            }
        }
        if (offsets != NULL) {
            memset(s->arguments->mapped + at, 0, offsets_at - at);
            memcpy(s->arguments->mapped + offsets_at, offsets, 4 * buffers);
        }
        infos[binding] = (VkDescriptorBufferInfo){s->arguments->buffer, 0, VK_WHOLE_SIZE};
        writes[binding] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, set,
                                                 binding, 0, 1, VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER,
                                                 NULL, &infos[binding], NULL};
        binding++;
    }
    VkDeviceSize alignment = shim_vk.properties.limits.minStorageBufferOffsetAlignment;
    bool copies_back = false;
    for (int i = 0, n = -1; i < count; i++) {
        if (!arg_is_buffer[i]) {
            continue;
        }
        n++; /* (its place among the buffers: binding uniform_count + n) */
        const halide_buffer_t *buf = args[i];
        const shim_vk_handle *handle = (const shim_vk_handle *)buf->device;
        VkDescriptorBufferInfo info;
        if (offsets != NULL) {
            info = (VkDescriptorBufferInfo){handle->buffer, 0, range_from(handle, 0)};
        } else if (alignment > 1 && handle->offset % alignment != 0) {
            staged_buffer *b = NULL;
            for (int k = 0; k < *staged_count && b == NULL; k++) {
                b = staged[k].handle == handle ? &staged[k] : NULL; /* a crop given twice */
            }
            if (b == NULL) {
                b = &staged[(*staged_count)++];
                *b = (staged_buffer){handle, NULL, {0}, false};
                shim_layout_outcome made = shim_layout_of(buf, &b->layout);
                if (made == SHIM_LAYOUT_NEGATIVE) {
                    shim_vk_abandon(s);
                    halide_error(user_context, "Vulkan: a crop at an offset the device cannot "
                                               "bind, with a negative stride, is not supported\n");
                    return halide_error_code_gpu_device_error;
                }
                VkDeviceSize span = (VkDeviceSize)b->layout.span;
                b->copy = made == SHIM_LAYOUT_MADE ? take_staging(span, &result) : NULL;
                if (b->copy == NULL) {
                    shim_vk_abandon(s);
                    return failed(user_context, "allocating a misaligned crop's staging buffer",
                                  e->name, made == SHIM_LAYOUT_MADE ? result
                                                                    : VK_ERROR_OUT_OF_HOST_MEMORY);
                }
                /* In: the whole span, gaps and all, in one copy (the kernel sees only the
                 * crop's elements); back: the elements alone (below). */
                if (span > 0) {
                    VkBufferCopy region = {handle->offset, 0, span};
                    VK(vkCmdCopyBuffer, void (*)(VkCommandBuffer, VkBuffer, VkBuffer, uint32_t,
                                                 const VkBufferCopy *),
                       s->commands, handle->buffer, b->copy->buffer, 1, &region);
                }
            }
            /* Back only if the kernel may write it: a crop it only reads, copied back, would
             * put its old values over what the launch wrote there through another argument. */
            b->written |= e->writes[n];
            copies_back |= b->written;
            info = (VkDescriptorBufferInfo){b->copy->buffer, 0, VK_WHOLE_SIZE};
        } else {
            info = (VkDescriptorBufferInfo){handle->buffer, handle->offset,
                                            range_from(handle, handle->offset)};
        }
        infos[binding] = info;
        writes[binding] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, set,
                                                 binding, 0, 1, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 NULL, &infos[binding], NULL};
        binding++;
    }
    VK(vkUpdateDescriptorSets, void (*)(VkDevice, uint32_t, const VkWriteDescriptorSet *, uint32_t,
                                        const void *),
       shim_vk.device, binding, writes, 0, NULL);
    if (*staged_count > 0) {
        shim_vk_barrier(s->commands);
    }
    VK(vkCmdBindPipeline, void (*)(VkCommandBuffer, int32_t, VkPipeline), s->commands,
       VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    VK(vkCmdBindDescriptorSets, void (*)(VkCommandBuffer, int32_t, VkPipelineLayout, uint32_t,
                                         uint32_t, const VkDescriptorSet *, uint32_t,
                                         const uint32_t *),
       s->commands, VK_PIPELINE_BIND_POINT_COMPUTE, e->spirv->layout, e->set, 1, &set, 0, NULL);
    VK(vkCmdDispatch, void (*)(VkCommandBuffer, uint32_t, uint32_t, uint32_t), s->commands,
       (uint32_t)blocks[0], (uint32_t)blocks[1], (uint32_t)blocks[2]);
    if (copies_back) {
        shim_vk_barrier(s->commands);
        for (int k = 0; k < *staged_count; k++) {
            if (staged[k].written) {
                copy_back(s->commands, &staged[k]);
            }
        }
    }
    /* Not waited for (where the device has timeline semaphores): whoever next touches device
     * memory from the host, or frees it, waits first (vulkan_memory.c, shim_vk_drain). */
    result = shim_vk_submit(s);
    if (result != VK_SUCCESS) {
        return failed(user_context, "running the kernel", e->name, result);
    }
    return halide_error_code_success;
}

static int launch(SHIM_RUN_PARAMS) {
    const module_state *state = state_ptr;
    if (state == NULL) {
        halide_error(user_context, "Vulkan: kernel launched before its module was initialized\n");
        return halide_error_code_gpu_device_error;
    }
    int count = 0, buffers = 0, scalars = 0;
    const struct halide_device_interface_t *vulkan = shim_backend_interface(SHIM_BACKEND_VULKAN);
    while (arg_sizes[count] != 0) {
        if (arg_is_buffer[count]) {
            const halide_buffer_t *buf = args[count];
            if (buf->device == 0 || buf->device_interface != vulkan) {
                halide_error(user_context, "Vulkan: a kernel argument is not on the Vulkan device\n");
                return halide_error_code_gpu_device_error;
            }
            buffers++;
        } else {
            scalars++;
        }
        count++;
    }
    kernel_entry *e = find_entry(state->module, entry_name);
    char msg[256];
    if (e == NULL) {
        snprintf(msg, sizeof msg, "Vulkan: the module has no entry point %s\n", entry_name);
    } else if ((uint32_t)buffers != e->storage_count) {
        snprintf(msg, sizeof msg, "Vulkan: kernel %s takes %u buffers, and was given %d\n",
                 entry_name, e->storage_count, buffers);
    } else if (e->uniform_count == 0 && (state->buffer_offsets ? count : scalars) > 0) {
        /* (Halide 22's kernels take their buffers' offsets there, Halide 21's their scalars.) */
        snprintf(msg, sizeof msg, "Vulkan: kernel %s declares no uniform buffer for its "
                 "arguments\n", entry_name);
    } else {
        msg[0] = 0;
    }
    if (msg[0] != 0) {
        halide_error(user_context, msg);
        return halide_error_code_gpu_device_error;
    }
    int32_t offsets[buffers + 1];
    for (int i = 0, n = 0; state->buffer_offsets && i < count; i++) {
        if (arg_is_buffer[i]) {
            if (!element_offset(user_context, entry_name, n, args[i], &offsets[n])) {
                return halide_error_code_gpu_device_error;
            }
            n++;
        }
    }
    uint32_t ids[4], values[4];
    const int threads[3] = {threadsX, threadsY, threadsZ};
    int constants = dispatch_constants(user_context, e, shared_mem_bytes, threads, ids, values);
    if (constants < 0) {
        return halide_error_code_gpu_device_error;
    }
    VkResult result;
    VkPipeline pipeline = pipeline_for(state->module, e, (uint32_t)constants, ids, values, &result);
    if (pipeline == 0) {
        return failed(user_context, "vkCreateComputePipelines", entry_name, result);
    }
    const int blocks[3] = {blocksX, blocksY, blocksZ};
    staged_buffer staged[buffers + 1];
    int staged_count = 0;
    int code = record_and_run(user_context, e, pipeline, count, arg_sizes, args, arg_is_buffer,
                              state->buffer_offsets ? offsets : NULL, blocks, staged,
                              &staged_count);
    for (int k = 0; k < staged_count; k++) {
        give_staging(staged[k].copy); /* (its submission has finished or was never made) */
        shim_layout_free(&staged[k].layout);
    }
    if (shim_profile_on()) {
        shim_profile_launch_staged(staged_count); /* (a profile says which launches staged) */
    }
    return code;
}

int halide_vulkan_initialize_kernels(void *user_context, void **state_ptr, const char *src,
                                     int size) {
    int result = shim_vk_usable(user_context);
    if (result) {
        return result;
    }
    /* Every pipeline call starts here; after the first, the library has its state. */
    if (__atomic_load_n(state_ptr, __ATOMIC_ACQUIRE) != NULL) {
        return halide_error_code_success;
    }
    /* How the caller's kernels take buffers is its release's: the state it gets says which,
     * published only once whole (another thread's call may be launching from it). */
    bool buffer_offsets = SHIM_CALLER_RELEASE()->vulkan_buffer_offsets;
    void *module = NULL;
    /* (Halide's Vulkan module is binary: `size` is its length, with no terminating NUL, and
     * the Python core drops one byte; it gets one more to drop.) */
    result = shim_py_initialize_kernels(user_context, &module, src, size + 1,
                                        shim_backend_interface(SHIM_BACKEND_VULKAN));
    if (result == halide_error_code_success) {
        __atomic_store_n(state_ptr, &((shim_vk_module *)module)->states[buffer_offsets],
                         __ATOMIC_RELEASE);
    }
    return result;
}

void halide_vulkan_finalize_kernels(void *user_context, void *state_ptr) {
    /* Modules stay made for the life of the process, shared by every pipeline with the same
     * source. */
    (void)user_context;
    (void)state_ptr;
}

int halide_vulkan_run(SHIM_RUN_PARAMS) {
    int refused = shim_vk_usable(user_context);
    if (refused) {
        return refused;
    }
    if (shim_profile_on()) {
        return shim_profile_run(SHIM_BACKEND_VULKAN, NULL, launch, SHIM_RUN_ARGS);
    }
    return launch(SHIM_RUN_ARGS);
}
