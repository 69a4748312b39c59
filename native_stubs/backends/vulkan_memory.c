/* The Vulkan device's memory, submissions and copies (the device is vulkan.c's).
 *
 * Work is submitted to one queue. Each submission begins with a barrier that orders it after
 * everything submitted before, so the device runs the shim's work in submission order, as one
 * in-order queue, whichever thread submitted it. Copies return once their bytes are where they
 * go, as the backend contract asks; launches (vulkan_kernels.c) are left running where the
 * device has timeline semaphores, and whatever next touches device memory from the host, or
 * gives it back to the driver, waits for them first (shim_vk_drain). Threads record and wait
 * concurrently: only vkQueueSubmit itself takes a lock.
 *
 * Memory: a Buffer's allocation is device-local; where the device-local memory is also
 * host-visible (integrated GPUs, lavapipe) it stays mapped and copies are memcpy, else they go
 * through a host-visible staging buffer and vkCmdCopyBuffer. Pipelines' own allocations are
 * served here without Python (devices/served.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "devices/served.h"
#include "forks/fork.h"
#include "backends/vulkan_api.h"
#include "backends/vulkan_device.h"

/* --- memory -------------------------------------------------------------------------------- */

/* The memory type for `purpose` among `allowed` (a memoryTypeBits), by preference: for a
 * Buffer's memory device-local, best also host-visible, coherent and cached (memory the host
 * reads as fast as its own: integrated GPUs, lavapipe); for staging and arguments host-visible
 * and coherent, best cached (reads back fast). `skip`: types already tried. -1 if none. */
static int memory_type(uint32_t allowed, enum shim_vk_purpose purpose, uint32_t skip) {
    const VkPhysicalDeviceMemoryProperties *memory = &shim_vk.memory_properties;
    const VkFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    VkFlags preferences[3][2] = {
        /* (required flags, rank among them) */
        {VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | host | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0},
        {VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0},
        {0, 0},
    };
    if (purpose != SHIM_VK_DEVICE) {
        preferences[0][0] = host | VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
        preferences[1][0] = host;
        preferences[2][0] = host;
    }
    for (int p = 0; p < 3; p++) {
        for (uint32_t i = 0; i < memory->memoryTypeCount; i++) {
            VkFlags flags = memory->memoryTypes[i].propertyFlags;
            if ((allowed & (1u << i)) && !(skip & (1u << i)) &&
                (flags & preferences[p][0]) == preferences[p][0]) {
                return (int)i;
            }
        }
    }
    return -1;
}

shim_vk_memory *shim_vk_memory_new(VkDeviceSize size, enum shim_vk_purpose purpose,
                                   VkResult *result) {
    VkDevice device = shim_vk.device;
    shim_vk_memory *memory = calloc(1, sizeof *memory);
    if (memory == NULL) {
        *result = VK_ERROR_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    VkFlags usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                    (purpose == SHIM_VK_UNIFORM ? VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT
                                                : VK_BUFFER_USAGE_STORAGE_BUFFER_BIT);
    /* Sizes round up to 4 bytes: vkCmdFillBuffer and storage-buffer ranges work in words. */
    VkDeviceSize rounded = ((size ? size : 1) + 3) & ~(VkDeviceSize)3;
    VkBufferCreateInfo info = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, rounded, usage,
                               VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    *result = VK(vkCreateBuffer, VkResult (*)(VkDevice, const VkBufferCreateInfo *, const void *,
                                              VkBuffer *), device, &info, NULL, &memory->buffer);
    if (*result != VK_SUCCESS) {
        free(memory);
        return NULL;
    }
    VkMemoryRequirements needs;
    VK(vkGetBufferMemoryRequirements, void (*)(VkDevice, VkBuffer, VkMemoryRequirements *),
       device, memory->buffer, &needs);
    uint32_t tried = 0;
    int type;
    *result = VK_ERROR_OUT_OF_DEVICE_MEMORY;
    /* A type whose heap is full: the next one the purpose accepts. */
    while (*result != VK_SUCCESS && (type = memory_type(needs.memoryTypeBits, purpose, tried)) >= 0) {
        tried |= 1u << type;
        VkMemoryAllocateInfo allocate = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, needs.size,
                                         (uint32_t)type};
        *result = VK(vkAllocateMemory, VkResult (*)(VkDevice, const VkMemoryAllocateInfo *,
                                                    const void *, VkDeviceMemory *),
                     device, &allocate, NULL, &memory->memory);
        if (*result != VK_SUCCESS) {
            continue;
        }
        VkFlags flags = shim_vk.memory_properties.memoryTypes[type].propertyFlags;
        const VkFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
        *result = VK(vkBindBufferMemory, VkResult (*)(VkDevice, VkBuffer, VkDeviceMemory,
                                                      VkDeviceSize),
                     device, memory->buffer, memory->memory, 0);
        if (*result == VK_SUCCESS && (flags & host) == host &&
            (purpose != SHIM_VK_DEVICE || shim_vk.map_device_memory)) {
            void *mapped = NULL;
            *result = VK(vkMapMemory, VkResult (*)(VkDevice, VkDeviceMemory, VkDeviceSize,
                                                   VkDeviceSize, VkFlags, void **),
                         device, memory->memory, 0, VK_WHOLE_SIZE, 0, &mapped);
            memory->mapped = mapped;
        }
        if (*result != VK_SUCCESS) {
            VK(vkFreeMemory, void (*)(VkDevice, VkDeviceMemory, const void *), device,
               memory->memory, NULL);
            memory->memory = 0;
            memory->mapped = NULL;
        }
    }
    if (*result != VK_SUCCESS) {
        VK(vkDestroyBuffer, void (*)(VkDevice, VkBuffer, const void *), device, memory->buffer, NULL);
        free(memory);
        return NULL;
    }
    if (purpose != SHIM_VK_DEVICE && memory->mapped == NULL) {
        shim_vk_memory_delete(memory);
        *result = VK_ERROR_MEMORY_MAP_FAILED;
        return NULL;
    }
    memory->size = size;
    return memory;
}

void shim_vk_memory_delete(shim_vk_memory *memory) {
    if (memory == NULL) {
        return;
    }
    if (memory->memory != 0) { /* (0: an application's VkBuffer, which it frees) */
        /* Launches still running may use it: they finish first (a failure to wait leaves
         * nothing better to do than wait for the whole device). */
        if (shim_vk_drain() != VK_SUCCESS) {
            VK(vkDeviceWaitIdle, VkResult (*)(VkDevice), shim_vk.device);
        }
        VkDevice device = shim_vk.device;
        VK(vkDestroyBuffer, void (*)(VkDevice, VkBuffer, const void *), device, memory->buffer, NULL);
        VK(vkFreeMemory, void (*)(VkDevice, VkDeviceMemory, const void *), device, memory->memory,
           NULL); /* (unmaps it) */
    }
    free(memory);
}

shim_vk_memory *shim_vk_allocate(uint64_t size, char *message, size_t message_size) {
    VkResult result;
    shim_vk_memory *memory = shim_vk_memory_new(size, SHIM_VK_DEVICE, &result);
    if (memory == NULL) {
        shim_vk_say(message, message_size, 0, "allocating %llu bytes of Vulkan device memory failed: %s",
            (unsigned long long)size, shim_vk_result_name(result));
    }
    return memory;
}

void shim_vk_free(shim_vk_memory *memory) {
    shim_vk_memory_delete(memory);
}

shim_vk_memory *shim_vk_wrap(uint64_t buffer) {
    shim_vk_memory *memory = calloc(1, sizeof *memory);
    if (memory != NULL) {
        memory->buffer = buffer;
    }
    return memory;
}

uint64_t shim_vk_buffer_of(const shim_vk_memory *memory) {
    return memory->buffer;
}

/* --- submissions ------------------------------------------------------------------------- */

static shim_vk_submission *free_submissions;
static pthread_mutex_t submissions_lock = PTHREAD_MUTEX_INITIALIZER;

static shim_vk_submission *new_submission(VkResult *result) {
    VkDevice device = shim_vk.device;
    shim_vk_submission *s = calloc(1, sizeof *s);
    if (s == NULL) {
        *result = VK_ERROR_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    VkCommandPoolCreateInfo pool_info = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL,
                                         VK_COMMAND_POOL_CREATE_TRANSIENT_BIT, shim_vk.queue_family};
    *result = VK(vkCreateCommandPool, VkResult (*)(VkDevice, const VkCommandPoolCreateInfo *,
                                                   const void *, VkCommandPool *),
                 device, &pool_info, NULL, &s->pool);
    if (*result == VK_SUCCESS) {
        VkCommandBufferAllocateInfo info = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL,
                                            s->pool, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
        *result = VK(vkAllocateCommandBuffers, VkResult (*)(VkDevice,
                                                            const VkCommandBufferAllocateInfo *,
                                                            VkCommandBuffer *),
                     device, &info, &s->commands);
    }
    if (*result == VK_SUCCESS) {
        VkFenceCreateInfo fence_info = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, NULL, 0};
        *result = VK(vkCreateFence, VkResult (*)(VkDevice, const VkFenceCreateInfo *,
                                                 const void *, VkFence *),
                     device, &fence_info, NULL, &s->fence);
    }
    if (*result != VK_SUCCESS) {
        if (s->pool) {
            VK(vkDestroyCommandPool, void (*)(VkDevice, VkCommandPool, const void *), device,
               s->pool, NULL);
        }
        free(s);
        return NULL;
    }
    return s;
}

/* The free submissions, oldest first (the one likeliest to have completed), and how many
 * exist: a thread makes a new one rather than wait for one still running, up to a bound. */
static shim_vk_submission *free_tail;
static int submission_count;
enum { MAX_SUBMISSIONS = 16 };

static void put_back(shim_vk_submission *s) {
    pthread_mutex_lock(&submissions_lock);
    s->next_free = NULL;
    if (free_tail != NULL) {
        free_tail->next_free = s;
    } else {
        free_submissions = s;
    }
    free_tail = s;
    pthread_mutex_unlock(&submissions_lock);
}

/* The timeline's value now, remembered as `completed` (which only grows). */
static uint64_t completed_now(void) {
    uint64_t value = 0;
    if (VK(vkGetSemaphoreCounterValue, VkResult (*)(VkDevice, VkSemaphore, uint64_t *),
           shim_vk.device, shim_vk.timeline, &value) != VK_SUCCESS) {
        return __atomic_load_n(&shim_vk.completed, __ATOMIC_ACQUIRE);
    }
    uint64_t seen = __atomic_load_n(&shim_vk.completed, __ATOMIC_ACQUIRE);
    while (seen < value && !__atomic_compare_exchange_n(&shim_vk.completed, &seen, value, true,
                                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return value > seen ? value : seen;
}

/* Wait until the timeline reaches `value`: all work submitted up to it has completed. */
static VkResult wait_for(uint64_t value) {
    if (shim_vk.timeline == 0 || value <= __atomic_load_n(&shim_vk.completed, __ATOMIC_ACQUIRE)) {
        return VK_SUCCESS;
    }
    VkSemaphoreWaitInfo info = {VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, NULL, 0, 1,
                                &shim_vk.timeline, &value};
    VkResult result = VK(vkWaitSemaphores, VkResult (*)(VkDevice, const VkSemaphoreWaitInfo *,
                                                        uint64_t),
                         shim_vk.device, &info, UINT64_MAX);
    if (result == VK_SUCCESS) {
        completed_now();
    }
    return result;
}

VkResult shim_vk_drain(void) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL || shim_vk.timeline == 0) {
        return VK_SUCCESS; /* (nothing is ever left running) */
    }
    return wait_for(__atomic_load_n(&shim_vk.submitted, __ATOMIC_ACQUIRE));
}

void shim_vk_barrier(VkCommandBuffer commands) {
    VkMemoryBarrier barrier = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_MEMORY_WRITE_BIT,
                               VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT};
    VK(vkCmdPipelineBarrier, void (*)(VkCommandBuffer, VkFlags, VkFlags, VkFlags, uint32_t,
                                      const VkMemoryBarrier *, uint32_t, const void *, uint32_t,
                                      const void *),
       commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1,
       &barrier, 0, NULL, 0, NULL);
}

/* A free submission, whose last use has completed (waited for if it must be), or a new one. */
static shim_vk_submission *take_submission(VkResult *result) {
    pthread_mutex_lock(&submissions_lock);
    shim_vk_submission *s = free_submissions;
    bool make = s == NULL;
    if (s != NULL && shim_vk.timeline != 0 && submission_count < MAX_SUBMISSIONS &&
        s->value > __atomic_load_n(&shim_vk.completed, __ATOMIC_ACQUIRE) &&
        s->value > completed_now()) {
        make = true; /* the oldest is still running: a new one rather than wait */
        s = NULL;
    }
    if (s != NULL) {
        free_submissions = s->next_free;
        if (free_submissions == NULL) {
            free_tail = NULL;
        }
    } else if (make) {
        submission_count++;
    }
    pthread_mutex_unlock(&submissions_lock);
    if (s == NULL) {
        s = new_submission(result);
        if (s == NULL) {
            pthread_mutex_lock(&submissions_lock);
            submission_count--;
            pthread_mutex_unlock(&submissions_lock);
        }
        return s;
    }
    *result = wait_for(s->value);
    if (*result != VK_SUCCESS) {
        put_back(s);
        return NULL;
    }
    return s;
}

shim_vk_submission *shim_vk_begin(VkResult *result) {
    shim_vk_submission *s = take_submission(result);
    if (s == NULL) {
        return NULL;
    }
    *result = VK(vkResetCommandPool, VkResult (*)(VkDevice, VkCommandPool, VkFlags),
                 shim_vk.device, s->pool, 0);
    VkCommandBufferBeginInfo begin = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                      VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    if (*result == VK_SUCCESS) {
        *result = VK(vkBeginCommandBuffer, VkResult (*)(VkCommandBuffer,
                                                        const VkCommandBufferBeginInfo *),
                     s->commands, &begin);
    }
    if (*result != VK_SUCCESS) {
        put_back(s);
        return NULL;
    }
    /* Everything submitted before, by any thread, happens before this submission's work. */
    shim_vk_barrier(s->commands);
    return s;
}

void shim_vk_abandon(shim_vk_submission *s) {
    VK(vkEndCommandBuffer, VkResult (*)(VkCommandBuffer), s->commands);
    put_back(s);
}

/* End and submit: signalling the timeline's next value where there is one (taken and rolled
 * back under the queue's lock, so values follow submission order and none is left that no
 * submission signals), else the submission's fence. */
static VkResult submit(shim_vk_submission *s) {
    /* The work's writes made visible to the host, which reads mapped memory next. */
    VkMemoryBarrier barrier = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_MEMORY_WRITE_BIT,
                               VK_ACCESS_HOST_READ_BIT | VK_ACCESS_HOST_WRITE_BIT};
    VK(vkCmdPipelineBarrier, void (*)(VkCommandBuffer, VkFlags, VkFlags, VkFlags, uint32_t,
                                      const VkMemoryBarrier *, uint32_t, const void *, uint32_t,
                                      const void *),
       s->commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
       &barrier, 0, NULL, 0, NULL);
    VkResult result = VK(vkEndCommandBuffer, VkResult (*)(VkCommandBuffer), s->commands);
    if (result != VK_SUCCESS) {
        return result;
    }
    uint64_t value = 0;
    VkTimelineSemaphoreSubmitInfo timeline = {VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                              NULL, 0, NULL, 1, &value};
    VkSubmitInfo info = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &s->commands, 0,
                         NULL};
    if (shim_vk.timeline != 0) {
        info.pNext = &timeline;
        info.signalSemaphoreCount = 1;
        info.pSignalSemaphores = &shim_vk.timeline;
    }
    pthread_mutex_lock(&shim_vk.queue_lock);
    shim_vk_hold_queue();
    value = shim_vk.submitted + 1;
    result = VK(vkQueueSubmit, VkResult (*)(VkQueue, uint32_t, const VkSubmitInfo *, VkFence),
                shim_vk.queue, 1, &info, shim_vk.timeline != 0 ? 0 : s->fence);
    shim_vk_release_queue();
    if (result == VK_SUCCESS && shim_vk.timeline != 0) {
        __atomic_store_n(&shim_vk.submitted, value, __ATOMIC_RELEASE);
        s->value = value;
    }
    pthread_mutex_unlock(&shim_vk.queue_lock);
    return result;
}

static VkResult wait_submission(shim_vk_submission *s) {
    if (shim_vk.timeline != 0) {
        return wait_for(s->value);
    }
    VkResult result = VK(vkWaitForFences, VkResult (*)(VkDevice, uint32_t, const VkFence *,
                                                       VkBool32, uint64_t),
                         shim_vk.device, 1, &s->fence, 1, UINT64_MAX);
    VK(vkResetFences, VkResult (*)(VkDevice, uint32_t, const VkFence *), shim_vk.device, 1,
       &s->fence);
    return result;
}

VkResult shim_vk_finish(shim_vk_submission *s) {
    VkResult result = submit(s);
    if (result == VK_SUCCESS) {
        result = wait_submission(s);
    }
    put_back(s);
    return result;
}

VkResult shim_vk_submit(shim_vk_submission *s) {
    if (shim_vk.timeline == 0) {
        return shim_vk_finish(s);
    }
    VkResult result = submit(s);
    put_back(s); /* (reused once the timeline reaches its value: take_submission) */
    return result;
}

int shim_vk_sync(void) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
        return VK_SUCCESS;
    }
    if (shim_vk.timeline != 0) {
        return shim_vk_drain();
    }
    pthread_mutex_lock(&shim_vk.queue_lock); /* (vkQueueWaitIdle synchronizes the queue too) */
    shim_vk_hold_queue();
    VkResult result = VK(vkQueueWaitIdle, VkResult (*)(VkQueue), shim_vk.queue);
    shim_vk_release_queue();
    pthread_mutex_unlock(&shim_vk.queue_lock);
    return result;
}

/* --- timestamps, for profiles ------------------------------------------------------------------ */

int shim_vk_timestamp(uint64_t *ns) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL || shim_vk.timestamp_bits == 0) {
        return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    VkDevice device = shim_vk.device;
    VkQueryPool pool = 0;
    VkQueryPoolCreateInfo info = {VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, NULL, 0,
                                  VK_QUERY_TYPE_TIMESTAMP, 1, 0};
    VkResult result = VK(vkCreateQueryPool, VkResult (*)(VkDevice, const VkQueryPoolCreateInfo *,
                                                         const void *, VkQueryPool *),
                         device, &info, NULL, &pool);
    if (result != VK_SUCCESS) {
        return result;
    }
    /* A submission of its own, which (as every submission) runs after all work submitted
     * before it: its timestamp is when the device got there. */
    shim_vk_submission *s = shim_vk_begin(&result);
    if (s != NULL) {
        VK(vkCmdResetQueryPool, void (*)(VkCommandBuffer, VkQueryPool, uint32_t, uint32_t),
           s->commands, pool, 0, 1);
        VK(vkCmdWriteTimestamp, void (*)(VkCommandBuffer, VkFlags, VkQueryPool, uint32_t),
           s->commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 0);
        result = shim_vk_finish(s);
    }
    uint64_t ticks = 0;
    if (result == VK_SUCCESS) {
        result = VK(vkGetQueryPoolResults, VkResult (*)(VkDevice, VkQueryPool, uint32_t, uint32_t,
                                                        size_t, void *, VkDeviceSize, VkFlags),
                    device, pool, 0, 1, sizeof ticks, &ticks, sizeof ticks,
                    VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    }
    VK(vkDestroyQueryPool, void (*)(VkDevice, VkQueryPool, const void *), device, pool, NULL);
    if (shim_vk.timestamp_bits < 64) {
        ticks &= (1ULL << shim_vk.timestamp_bits) - 1;
    }
    *ns = (uint64_t)((double)ticks * shim_vk.properties.limits.timestampPeriod);
    return result;
}

/* --- copies ------------------------------------------------------------------------------ */

/* Calls `each(src offset, dst offset, bytes, context)` for every chunk of a copy plan. */
static void for_each_chunk(const int64_t *shape, const int64_t *src_strides,
                           const int64_t *dst_strides, int outer, int64_t src_offset,
                           int64_t dst_offset,
                           void (*each)(int64_t, int64_t, int64_t, void *), void *context) {
    int64_t index[16] = {0};
    for (int d = 0; d < outer; d++) {
        if (shape[d] <= 0) {
            return;
        }
    }
    for (;;) {
        int64_t src = src_offset, dst = dst_offset;
        for (int d = 0; d < outer; d++) {
            src += index[d] * src_strides[d];
            dst += index[d] * dst_strides[d];
        }
        each(src, dst, shape[outer], context);
        int d = outer - 1;
        for (; d >= 0; d--) {
            if (++index[d] < shape[d]) {
                break;
            }
            index[d] = 0;
        }
        if (d < 0) {
            return;
        }
    }
}

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    VkBufferCopy *regions; /* device side: one region per chunk */
    size_t count;
    int64_t packed;        /* bytes of staging used so far */
    int side;              /* for regions: 0 staging -> dst, 1 src -> staging, 2 src -> dst */
} chunk_walk;

static void move_bytes(int64_t src, int64_t dst, int64_t n, void *context) {
    chunk_walk *walk = context;
    memmove(walk->dst + dst, walk->src + src, (size_t)n);
}

/* Host side of a staged copy: chunks between host memory and the packed staging buffer. */
static void pack(int64_t src, int64_t dst, int64_t n, void *context) {
    chunk_walk *walk = context;
    (void)dst;
    memcpy(walk->dst + walk->packed, walk->src + src, (size_t)n);
    walk->packed += n;
}

static void unpack(int64_t src, int64_t dst, int64_t n, void *context) {
    chunk_walk *walk = context;
    (void)src;
    memcpy(walk->dst + dst, walk->src + walk->packed, (size_t)n);
    walk->packed += n;
}

static void add_region(int64_t src, int64_t dst, int64_t n, void *context) {
    chunk_walk *walk = context;
    VkBufferCopy *r = &walk->regions[walk->count++];
    r->size = (VkDeviceSize)n;
    r->srcOffset = (VkDeviceSize)(walk->side == 0 ? walk->packed : src);
    r->dstOffset = (VkDeviceSize)(walk->side == 1 ? walk->packed : dst);
    walk->packed += n;
}

static int transfer(int direction, shim_vk_memory *src, shim_vk_memory *dst, uint8_t *host,
                    const int64_t *shape, const int64_t *src_strides, const int64_t *dst_strides,
                    int outer, int64_t src_offset, int64_t dst_offset, char *message, size_t size) {
    if (outer < 0 || outer > 15) {
        return shim_vk_say(message, size, VK_ERROR_UNKNOWN, "a copy of over 16 dimensions");
    }
    size_t chunks = 1;
    int64_t nbytes = shape[outer];
    for (int d = 0; d < outer; d++) {
        chunks *= (size_t)shape[d];
        nbytes *= shape[d];
    }
    if (nbytes <= 0) {
        return VK_SUCCESS;
    }
    chunk_walk walk = {0};
    /* Memory the host maps: the bytes move by memcpy (the submissions before have finished:
     * every one is waited for). */
    uint8_t *src_host = direction == 0 ? host : src->mapped;
    uint8_t *dst_host = direction == 1 ? host : dst->mapped;
    if (src_host != NULL && dst_host != NULL) {
        /* The host touches device memory directly: launches still running finish first. */
        VkResult drained = shim_vk_drain();
        if (drained != VK_SUCCESS) {
            return shim_vk_say(message, size, drained, "waiting for the device's work failed: %s",
                       shim_vk_result_name(drained));
        }
        walk.src = src_host;
        walk.dst = dst_host;
        for_each_chunk(shape, src_strides, dst_strides, outer, src_offset, dst_offset, move_bytes,
                       &walk);
        return VK_SUCCESS;
    }
    /* Else a staging buffer (where one side is the host) and vkCmdCopyBuffer. */
    VkResult result = VK_SUCCESS;
    shim_vk_memory *staging = NULL;
    if (direction != 2) {
        staging = shim_vk_memory_new((VkDeviceSize)nbytes, SHIM_VK_STAGING, &result);
        if (staging == NULL) {
            return shim_vk_say(message, size, result, "a Vulkan staging buffer of %lld bytes: %s",
                       (long long)nbytes, shim_vk_result_name(result));
        }
    }
    if (direction == 0) {
        walk.src = host;
        walk.dst = staging->mapped;
        for_each_chunk(shape, src_strides, dst_strides, outer, src_offset, dst_offset, pack, &walk);
    }
    walk.regions = calloc(chunks, sizeof *walk.regions);
    if (walk.regions == NULL) {
        shim_vk_memory_delete(staging);
        return shim_vk_say(message, size, VK_ERROR_OUT_OF_HOST_MEMORY, "out of memory for a copy's regions");
    }
    walk.side = direction;
    walk.packed = 0;
    for_each_chunk(shape, src_strides, dst_strides, outer, src_offset, dst_offset, add_region, &walk);
    shim_vk_submission *s = shim_vk_begin(&result);
    if (s != NULL) {
        VkBuffer from = direction == 0 ? staging->buffer : src->buffer;
        VkBuffer to = direction == 1 ? staging->buffer : dst->buffer;
        VK(vkCmdCopyBuffer, void (*)(VkCommandBuffer, VkBuffer, VkBuffer, uint32_t,
                                     const VkBufferCopy *),
           s->commands, from, to, (uint32_t)walk.count, walk.regions);
        result = shim_vk_finish(s);
    }
    free(walk.regions);
    if (result == VK_SUCCESS && direction == 1) {
        walk.src = staging->mapped;
        walk.dst = host;
        walk.packed = 0;
        for_each_chunk(shape, src_strides, dst_strides, outer, src_offset, dst_offset, unpack, &walk);
    }
    shim_vk_memory_delete(staging);
    if (result != VK_SUCCESS) {
        return shim_vk_say(message, size, result, "a Vulkan copy failed: %s", shim_vk_result_name(result));
    }
    return VK_SUCCESS;
}

int shim_vk_transfer(int direction, shim_vk_memory *src, shim_vk_memory *dst, void *host,
                     const int64_t *shape, const int64_t *src_strides, const int64_t *dst_strides,
                     int outer, int64_t src_offset, int64_t dst_offset, char *message,
                     size_t message_size) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
        return shim_vk_say(message, message_size, VK_ERROR_INITIALIZATION_FAILED, "no Vulkan device");
    }
    return transfer(direction, src, dst, host, shape, src_strides, dst_strides, outer, src_offset,
                    dst_offset, message, message_size);
}

/* --- served allocations (devices/served.c) ------------------------------------------------ */

/* A pipeline's own device buffers (a compute_root stage's, the arrays of a fast call) are
 * allocated, copied and freed here without Python, from the backend's pool; Python adopts one
 * where it needs it (shim/backends/vulkan.py, adopt_served). Native values are shim_vk_memory
 * pointers, in the pool as in the Python backend's into_pool. */

static bool driver_usable(void) {
    return __atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) != NULL &&
           shim_vk.process == shim_bound_process();
}

static uint64_t create_allocation(uint64_t size) {
    VkResult result;
    return (uint64_t)(uintptr_t)shim_vk_memory_new(size, SHIM_VK_DEVICE, &result);
}

static void release_allocation(uint64_t native) {
    shim_vk_memory_delete((shim_vk_memory *)(uintptr_t)native);
}

/* A handle at the start of the allocation, as the Python backend's handle() makes for offset
 * 0: always bindable in place. */
static uint64_t make_served_handle(uint64_t native, uint64_t nbytes, uint64_t capacity) {
    shim_vk_handle *handle = calloc(1, sizeof *handle);
    if (handle == NULL) {
        return 0;
    }
    handle->memory = (shim_vk_memory *)(uintptr_t)native;
    handle->buffer = handle->memory->buffer;
    handle->native_made = 1;
    handle->nbytes = nbytes;
    handle->capacity = capacity;
    shim_served_mark(&handle->served);
    return (uint64_t)(uintptr_t)handle;
}

static bool claim_served(uint64_t value, uint64_t *native, uint64_t *nbytes, uint64_t *capacity) {
    shim_vk_handle *handle = (shim_vk_handle *)(uintptr_t)value;
    if (!shim_served_take(&handle->served)) {
        return false;
    }
    *native = (uint64_t)(uintptr_t)handle->memory;
    *nbytes = handle->nbytes;
    *capacity = handle->capacity;
    return true;
}

void shim_vk_handle_release(shim_vk_handle *handle) {
    if (handle != NULL && handle->native_made) {
        free(handle);
    }
}

static void release_served_handle(uint64_t handle) {
    shim_vk_handle_release((shim_vk_handle *)(uintptr_t)handle);
}

static bool served_native(uint64_t value, uint64_t *native, uint64_t *nbytes) {
    const shim_vk_handle *handle = (const shim_vk_handle *)(uintptr_t)value;
    if (!shim_served_marked(&handle->served)) {
        return false;
    }
    *native = (uint64_t)(uintptr_t)handle->memory;
    *nbytes = handle->nbytes;
    return true;
}

/* The first `nbytes` of an allocation, complete when they return, as the Python backend's
 * write and read. */
static int write_allocation(uint64_t native, uint64_t offset, const void *host, uint64_t nbytes) {
    int64_t shape[1] = {(int64_t)nbytes}, none[1] = {0};
    return transfer(0, NULL, (shim_vk_memory *)(uintptr_t)native, (uint8_t *)host, shape, none,
                    none, 0, 0, (int64_t)offset, NULL, 0);
}

static int read_allocation(uint64_t native, uint64_t offset, void *host, uint64_t nbytes) {
    int64_t shape[1] = {(int64_t)nbytes}, none[1] = {0};
    return transfer(1, (shim_vk_memory *)(uintptr_t)native, NULL, host, shape, none, none, 0,
                    (int64_t)offset, 0, NULL, 0);
}

static int copy_allocation(uint64_t src, uint64_t src_offset, uint64_t dst, uint64_t dst_offset,
                           uint64_t nbytes) {
    int64_t shape[1] = {(int64_t)nbytes}, none[1] = {0};
    return transfer(2, (shim_vk_memory *)(uintptr_t)src, (shim_vk_memory *)(uintptr_t)dst, NULL,
                    shape, none, none, 0, (int64_t)src_offset, (int64_t)dst_offset, NULL, 0);
}

static bool locate_handle(uint64_t value, uint64_t *native, uint64_t *offset, uint64_t *nbytes) {
    const shim_vk_handle *handle = (const shim_vk_handle *)(uintptr_t)value;
    *native = (uint64_t)(uintptr_t)handle->memory;
    *offset = handle->offset;
    *nbytes = handle->nbytes;
    return true;
}

static shim_served_link *served_link(uint64_t handle) {
    return &((shim_vk_handle *)(uintptr_t)handle)->link;
}

/* A crop's handle as the Python backend's handle() makes it: the allocation's buffer and the
 * crop's offset, which launches bind (or stage) as they do any crop's. */
static uint64_t make_crop_handle(uint64_t native, uint64_t offset, uint64_t nbytes) {
    (void)nbytes; /* (the launch binds the crop's range from its own layout) */
    shim_vk_handle *handle = calloc(1, sizeof *handle);
    if (handle == NULL) {
        return 0;
    }
    handle->memory = (shim_vk_memory *)(uintptr_t)native;
    handle->buffer = handle->memory->buffer;
    handle->offset = offset;
    handle->native_made = 1;
    return (uint64_t)(uintptr_t)handle;
}

static const shim_allocator allocator = {
    driver_usable, create_allocation, release_allocation, make_served_handle, claim_served,
    release_served_handle, served_native, locate_handle, write_allocation, read_allocation,
    copy_allocation, served_link,
    make_crop_handle, shim_vk_sync,
};

void shim_vk_serve_allocations(shim_pool *pool) {
    shim_served_register(SHIM_BACKEND_VULKAN, &allocator, pool);
}
