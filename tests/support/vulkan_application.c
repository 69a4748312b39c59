/* An application with a Vulkan context of its own (Halide issue 8715's case), for
 * tests/test_vulkan.py: loaded with LD_PRELOAD, so that its halide_vulkan_acquire_context and
 * halide_vulkan_release_context come before the shim's, as an application's own definitions
 * come before Halide's runtime. It makes its instance, device and queue on the first device
 * with a compute queue, with what Halide's kernels need, and VkBuffers in host-visible memory
 * that it reads and writes itself. Built against the shim's own declarations of the API. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan_api.h"

typedef PFN_vkVoidFunction (*get_proc_fn)(void *, const char *);

static struct {
    VkInstance instance;
    VkPhysicalDevice physical;
    VkDevice device;
    VkQueue queue;
    uint32_t family;
    get_proc_fn instance_proc, device_proc;
    pthread_mutex_t lock;
    int acquired, held;
} app = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define INSTANCE_FN(name, type) ((type)app.instance_proc(app.instance, #name))
#define DEVICE_FN(name, type) ((type)app.device_proc(app.device, #name))

static int make_context(void) {
    void *loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (loader == NULL) {
        return -1;
    }
    app.instance_proc = (get_proc_fn)dlsym(loader, "vkGetInstanceProcAddr");
    VkApplicationInfo application = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "the application",
                                     1, NULL, 0, VK_MAKE_API_VERSION(0, 1, 3, 0)};
    VkInstanceCreateInfo info = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &application,
                                 0, NULL, 0, NULL};
    if (((VkResult(*)(const VkInstanceCreateInfo *, const void *, VkInstance *))app.instance_proc(
            NULL, "vkCreateInstance"))(&info, NULL, &app.instance) != VK_SUCCESS) {
        return -2;
    }
    uint32_t count = 1;
    INSTANCE_FN(vkEnumeratePhysicalDevices, VkResult(*)(VkInstance, uint32_t *, VkPhysicalDevice *))(
        app.instance, &count, &app.physical);
    if (count == 0) {
        return -3;
    }
    VkQueueFamilyProperties families[16];
    uint32_t family_count = 16;
    INSTANCE_FN(vkGetPhysicalDeviceQueueFamilyProperties,
                void (*)(VkPhysicalDevice, uint32_t *, VkQueueFamilyProperties *))(
        app.physical, &family_count, families);
    for (app.family = 0; app.family < family_count; app.family++) {
        if (families[app.family].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            break;
        }
    }
    /* What Halide's kernels need: 8- and 16-bit storage, and the features the device has. */
    VkPhysicalDeviceShaderFloat16Int8Features f16 = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, NULL, 0, 0};
    VkPhysicalDevice8BitStorageFeatures s8 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES,
                                              &f16, 0, 0, 0};
    VkPhysicalDevice16BitStorageFeatures s16 = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, &s8, 0, 0, 0, 0};
    VkPhysicalDeviceFeatures2 features = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &s16, {{0}}};
    INSTANCE_FN(vkGetPhysicalDeviceFeatures2, void (*)(VkPhysicalDevice, VkPhysicalDeviceFeatures2 *))(
        app.physical, &features);
    const char *extensions[] = {"VK_KHR_8bit_storage", "VK_KHR_storage_buffer_storage_class",
                                "VK_KHR_16bit_storage", "VK_KHR_shader_float16_int8"};
    float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0,
                                          app.family, 1, &priority};
    VkDeviceCreateInfo device_info = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &features, 0, 1,
                                      &queue_info, 0, NULL, 4, extensions, NULL};
    if (INSTANCE_FN(vkCreateDevice, VkResult(*)(VkPhysicalDevice, const VkDeviceCreateInfo *,
                                                const void *, VkDevice *))(
            app.physical, &device_info, NULL, &app.device) != VK_SUCCESS) {
        return -4;
    }
    app.device_proc = (get_proc_fn)app.instance_proc(app.instance, "vkGetDeviceProcAddr");
    DEVICE_FN(vkGetDeviceQueue, void (*)(VkDevice, uint32_t, uint32_t, VkQueue *))(
        app.device, app.family, 0, &app.queue);
    return 0;
}

/* Halide's hooks, as an application overrides them: the context, under the application's
 * lock until released. */
int halide_vulkan_acquire_context(void *user_context, void **allocator, VkInstance *instance,
                                  VkDevice *device, VkPhysicalDevice *physical, VkQueue *queue,
                                  uint32_t *family, uint64_t *messenger, bool create) {
    (void)user_context;
    (void)create;
    pthread_mutex_lock(&app.lock);
    if (app.device == NULL && make_context() != 0) {
        pthread_mutex_unlock(&app.lock);
        return -1;
    }
    app.acquired++;
    app.held = 1;
    *allocator = NULL;
    *instance = app.instance;
    *device = app.device;
    *physical = app.physical;
    *queue = app.queue;
    *family = app.family;
    *messenger = 0;
    return 0;
}

int halide_vulkan_release_context(void *user_context, VkInstance instance, VkDevice device,
                                  VkQueue queue, uint64_t messenger) {
    (void)user_context;
    (void)instance;
    (void)device;
    (void)queue;
    (void)messenger;
    app.held = 0;
    pthread_mutex_unlock(&app.lock);
    return 0;
}

/* For the test: how often the shim took the context, and the application's device. */
int app_acquired(void) {
    return app.acquired;
}

uint64_t app_device(void) {
    return (uint64_t)(uintptr_t)app.device;
}

/* A VkBuffer of the application's, in host-visible memory it keeps mapped: `size` bytes,
 * filled from `data`. */
static struct {
    VkBuffer buffer;
    void *mapped;
} buffers[16];
static int buffer_count;

uint64_t app_make_buffer(const void *data, uint64_t size) {
    VkBufferCreateInfo info = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, size,
                               VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                   VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                               VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    VkBuffer buffer = 0;
    if (buffer_count == 16 ||
        DEVICE_FN(vkCreateBuffer, VkResult(*)(VkDevice, const VkBufferCreateInfo *, const void *,
                                              VkBuffer *))(app.device, &info, NULL, &buffer) != 0) {
        return 0;
    }
    VkMemoryRequirements needs;
    DEVICE_FN(vkGetBufferMemoryRequirements, void (*)(VkDevice, VkBuffer, VkMemoryRequirements *))(
        app.device, buffer, &needs);
    VkPhysicalDeviceMemoryProperties memory;
    INSTANCE_FN(vkGetPhysicalDeviceMemoryProperties,
                void (*)(VkPhysicalDevice, VkPhysicalDeviceMemoryProperties *))(app.physical, &memory);
    const VkFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = 0;
    while (type < memory.memoryTypeCount &&
           !((needs.memoryTypeBits & (1u << type)) &&
             (memory.memoryTypes[type].propertyFlags & host) == host)) {
        type++;
    }
    VkMemoryAllocateInfo allocate = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, needs.size, type};
    VkDeviceMemory backing = 0;
    void *mapped = NULL;
    if (type == memory.memoryTypeCount ||
        DEVICE_FN(vkAllocateMemory, VkResult(*)(VkDevice, const VkMemoryAllocateInfo *, const void *,
                                                VkDeviceMemory *))(app.device, &allocate, NULL,
                                                                   &backing) != 0 ||
        DEVICE_FN(vkBindBufferMemory, VkResult(*)(VkDevice, VkBuffer, VkDeviceMemory, VkDeviceSize))(
            app.device, buffer, backing, 0) != 0 ||
        DEVICE_FN(vkMapMemory, VkResult(*)(VkDevice, VkDeviceMemory, VkDeviceSize, VkDeviceSize,
                                           VkFlags, void **))(app.device, backing, 0, VK_WHOLE_SIZE,
                                                              0, &mapped) != 0) {
        return 0;
    }
    memcpy(mapped, data, size);
    buffers[buffer_count].buffer = buffer;
    buffers[buffer_count++].mapped = mapped;
    return buffer;
}

/* Read one of them back through the application's own mapping. */
int app_read_buffer(uint64_t buffer, void *out, uint64_t size) {
    for (int i = 0; i < buffer_count; i++) {
        if (buffers[i].buffer == buffer) {
            memcpy(out, buffers[i].mapped, size);
            return 0;
        }
    }
    return -1;
}
