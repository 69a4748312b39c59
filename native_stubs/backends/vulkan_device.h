/* The Vulkan device as the backends layer's Vulkan files share it: vulkan.c makes it (the
 * loader, instance, device, queue, Halide's context entry points), vulkan_memory.c gives it
 * memory, submissions and copies, and vulkan_kernels.c launches kernels on it (Halide's module
 * format as vulkan_module.c reads it, shader modules, compute pipelines, halide_vulkan_run). Nothing outside
 * native_stubs/backends/ includes this. */
#ifndef SHIM_BACKENDS_VULKAN_DEVICE_H
#define SHIM_BACKENDS_VULKAN_DEVICE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "shim_native.h"
#include "backends/vulkan_api.h"

/* Every Vulkan function the backend calls, from vkGetInstanceProcAddr/vkGetDeviceProcAddr. */
#define SHIM_VK_DEVICE_FUNCTIONS(X)                                                             \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkQueueSubmit) X(vkQueueWaitIdle)                 \
    X(vkDeviceWaitIdle) X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements)  \
    X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) X(vkUnmapMemory)  \
    X(vkCreateCommandPool) X(vkDestroyCommandPool) X(vkResetCommandPool)                       \
    X(vkAllocateCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer)                  \
    X(vkCmdCopyBuffer) X(vkCmdPipelineBarrier) X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets) \
    X(vkCmdDispatch) X(vkCmdFillBuffer) X(vkCreateFence) X(vkDestroyFence) X(vkWaitForFences)  \
    X(vkResetFences) X(vkCreateShaderModule) X(vkDestroyShaderModule)                          \
    X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout)   \
    X(vkDestroyPipelineLayout) X(vkCreateComputePipelines) X(vkDestroyPipeline)                \
    X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool) X(vkResetDescriptorPool)              \
    X(vkAllocateDescriptorSets) X(vkUpdateDescriptorSets) X(vkCreateQueryPool)                 \
    X(vkDestroyQueryPool) X(vkCmdResetQueryPool) X(vkCmdWriteTimestamp)                        \
    X(vkGetQueryPoolResults)

/* Vulkan 1.2's, for submissions that are not waited for (timeline semaphores): absent on an
 * older device, whose launches are then each waited for. */
#define SHIM_VK_TIMELINE_FUNCTIONS(X)                                                           \
    X(vkCreateSemaphore) X(vkDestroySemaphore) X(vkWaitSemaphores) X(vkGetSemaphoreCounterValue)

#define SHIM_VK_DECLARE(name) void *name;

typedef struct {
    /* The device's functions, called through casts to their prototypes (vulkan_api.h keeps
     * the types; the pointers are stored untyped so that one macro lists them). */
    struct {
        SHIM_VK_DEVICE_FUNCTIONS(SHIM_VK_DECLARE)
        SHIM_VK_TIMELINE_FUNCTIONS(SHIM_VK_DECLARE)
    } fn;
    VkInstance instance;
    VkPhysicalDevice physical_device;
    VkDevice device; /* non-NULL once the device is made (acquire load) */
    VkQueue queue;
    uint32_t queue_family;
    VkPhysicalDeviceProperties properties;
    VkPhysicalDeviceMemoryProperties memory_properties;
    uint32_t timestamp_bits; /* of the queue family; 0: no timestamps */
    /* Whether a Buffer's memory is mapped where the device allows it: off with
     * $HALIDE_SHIM_VULKAN_STAGED_COPIES=1, so that every copy takes the staged path a discrete
     * GPU's takes (tests/test_vulkan.py runs the suite that way on lavapipe). */
    bool map_device_memory;
    pthread_mutex_t queue_lock; /* vkQueueSubmit needs the queue externally synchronized */
    /* Launches not waited for: each submission signals the next value of `timeline`, so
     * `submitted` (taken under queue_lock) is the value all work submitted so far reaches, and
     * `completed` the highest value seen reached. 0: every submission is waited for (no
     * timeline semaphores, or $HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH=1). */
    VkSemaphore timeline;
    uint64_t submitted, completed;
    /* An application's halide_vulkan_acquire_context and release_context, where the device is
     * the application's (vulkan.c): taken around every submission. NULL: the shim's own. */
    void *application_acquire, *application_release;
    pid_t process;              /* where it was made (forks/fork.c) */
} shim_vk_state;

extern shim_vk_state shim_vk;

/* Call a device function with its prototype from vulkan_api.h's types. */
#define VK(name, type, ...) (((type)shim_vk.fn.name)(__VA_ARGS__))

const char *shim_vk_result_name(VkResult result);

/* Write the reason into the caller's buffer (none: NULL); returns `code`. */
__attribute__((format(printf, 4, 5))) static inline int shim_vk_say(char *message, size_t size,
                                                                    int code,
                                                                    const char *format, ...) {
    if (message != NULL && size > 0) {
        va_list args;
        va_start(args, format);
        vsnprintf(message, size, format, args);
        va_end(args);
    }
    return code;
}

/* Device memory: a VkBuffer over its own VkDeviceMemory (`memory` 0 for a VkBuffer the
 * application made and wrapped), mapped for the process where it is host-visible. */
struct shim_vk_memory {
    VkBuffer buffer;
    VkDeviceMemory memory;
    VkDeviceSize size;  /* the VkBuffer's size; 0 where unknown (wrapped) */
    uint8_t *mapped;    /* where the host reads and writes it directly; NULL: through copies */
};

enum shim_vk_purpose {
    SHIM_VK_DEVICE,  /* a Buffer's memory: device-local where the device has it */
    SHIM_VK_STAGING, /* host-visible, for copies to and from memory that is not */
    SHIM_VK_UNIFORM, /* host-visible, a kernel's scalar arguments */
};
/* A new allocation, or NULL with *result set. */
shim_vk_memory *shim_vk_memory_new(VkDeviceSize size, enum shim_vk_purpose purpose,
                                   VkResult *result);
void shim_vk_memory_delete(shim_vk_memory *memory);

/* A command buffer being recorded, with what one submission needs; taken from a free list,
 * so that threads record and wait for their own work concurrently. */
typedef struct shim_vk_submission {
    struct shim_vk_submission *next_free;
    VkCommandPool pool;
    VkCommandBuffer commands;
    VkFence fence;
    /* A launch's descriptors (vulkan_kernels.c): one set at a time, reset per use. */
    VkDescriptorPool descriptors;
    uint32_t uniform_capacity, storage_capacity;
    shim_vk_memory *arguments; /* scalar arguments, mapped; grown as needed */
    /* The timeline value its last submission signals (its uniform buffer and descriptors are
     * free again once the timeline reaches it). */
    uint64_t value;
} shim_vk_submission;

/* A submission with recording begun, after a barrier that orders it after all work submitted
 * before (so submissions from many threads run one after another, as one in-order queue). */
shim_vk_submission *shim_vk_begin(VkResult *result);
/* End recording (with a barrier making its writes visible to the host), submit, wait, and put
 * the submission back; returns the first failure. */
VkResult shim_vk_finish(shim_vk_submission *submission);
/* The same without waiting, where the device has timeline semaphores (a launch: whoever next
 * touches memory from the host drains first); else as shim_vk_finish. */
VkResult shim_vk_submit(shim_vk_submission *submission);
/* Wait until all work submitted so far has completed. */
VkResult shim_vk_drain(void);
/* Put back a submission whose recording failed, without submitting it. */
void shim_vk_abandon(shim_vk_submission *submission);
/* A barrier between commands recorded in one submission: every write before it is visible
 * to every read and write after it. */
void shim_vk_barrier(VkCommandBuffer commands);

/* Around every use of the queue: the application's hooks, where the device is the
 * application's (nothing otherwise). */
void shim_vk_hold_queue(void);
void shim_vk_release_queue(void);

/* Whether the device is usable from this process (made, and not in a forked child), after
 * halide_error where it is not; a Halide error code. */
int shim_vk_usable(void *user_context);

#endif
