/* Halide's Vulkan entry points and the Vulkan device, served by the shim's Vulkan backend
 * (shim/backends/vulkan.py).
 *
 * Unlike OpenCL and CUDA, whose Python packages own the driver, the whole Vulkan device lives
 * in C, against the loader (libvulkan.so.1, opened with dlopen at first use), and Python calls
 * down into it. This file makes the device: the instance, physical device, device and queue,
 * chosen as Halide's runtime chooses them (HL_VK_DEVICE_TYPE, HL_VK_LAYERS, HL_VK_EXTENSIONS
 * or halide_vulkan_set_*), and Halide's entry points around it (the context hooks, the VkBuffer
 * helpers, the preferences). Its memory, submissions and copies are vulkan_memory.c's; Halide's
 * kernels and launches vulkan_kernels.c's. No Python package is needed, and the paths every
 * launch and copy takes never enter Python.
 */
#define _GNU_SOURCE /* dladdr, RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "devices/device_generic.h"
#include "forks/fork.h"
#include "backends/vulkan_api.h"
#include "backends/vulkan_device.h"

shim_vk_state shim_vk = {.queue_lock = PTHREAD_MUTEX_INITIALIZER};

typedef PFN_vkVoidFunction (*get_instance_proc_fn)(VkInstance, const char *);
typedef PFN_vkVoidFunction (*get_device_proc_fn)(VkDevice, const char *);

/* The loader and the instance-level functions the backend needs (made by load_loader). */
static struct {
    void *library;
    get_instance_proc_fn get_instance_proc;
    get_device_proc_fn get_device_proc;
    VkResult (*create_instance)(const VkInstanceCreateInfo *, const void *, VkInstance *);
    VkResult (*enumerate_instance_extensions)(const char *, uint32_t *, VkExtensionProperties *);
    void (*destroy_instance)(VkInstance, const void *);
    VkResult (*enumerate_physical_devices)(VkInstance, uint32_t *, VkPhysicalDevice *);
    void (*get_properties)(VkPhysicalDevice, VkPhysicalDeviceProperties *);
    void (*get_queue_families)(VkPhysicalDevice, uint32_t *, VkQueueFamilyProperties *);
    void (*get_memory_properties)(VkPhysicalDevice, VkPhysicalDeviceMemoryProperties *);
    void (*get_features)(VkPhysicalDevice, VkPhysicalDeviceFeatures *);
    void (*get_features2)(VkPhysicalDevice, VkPhysicalDeviceFeatures2 *);
    VkResult (*enumerate_device_extensions)(VkPhysicalDevice, const char *, uint32_t *,
                                            VkExtensionProperties *);
    VkResult (*create_device)(VkPhysicalDevice, const VkDeviceCreateInfo *, const void *,
                              VkDevice *);
} loader;

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;

const char *shim_vk_result_name(VkResult result) {
    switch (result) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_INCOMPLETE: return "VK_INCOMPLETE";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    default: return "VK_ERROR_UNKNOWN";
    }
}

/* --- Halide's preferences: halide_vulkan_set_* or, until set, its environment variables ---- */

enum { PREF_LAYERS, PREF_EXTENSIONS, PREF_DEVICE_TYPE, PREF_BUILD_OPTIONS, PREF_ALLOC_CONFIG,
       PREF_COUNT };
static const char *const preference_variables[PREF_COUNT] = {
    "HL_VK_LAYERS", "HL_VK_EXTENSIONS", "HL_VK_DEVICE_TYPE", "HL_VK_BUILD_OPTIONS",
    "HL_VK_ALLOC_CONFIG"};
static char *preferences[PREF_COUNT];
static bool preference_set[PREF_COUNT];
static pthread_mutex_t preference_lock = PTHREAD_MUTEX_INITIALIZER;

static void set_preference(int which, const char *value) {
    char *copy = value ? strdup(value) : NULL;
    pthread_mutex_lock(&preference_lock);
    /* The old string is kept: a getter's caller may still read it, as Halide's runtime keeps
     * its own buffer. */
    preferences[which] = copy;
    preference_set[which] = true;
    pthread_mutex_unlock(&preference_lock);
}

/* As Halide: the value set, else the environment variable's (read once), else "". */
static const char *get_preference(int which) {
    pthread_mutex_lock(&preference_lock);
    if (!preference_set[which]) {
        const char *value = getenv(preference_variables[which]);
        if (value == NULL && which == PREF_LAYERS) {
            value = getenv("VK_INSTANCE_LAYERS");
        }
        preferences[which] = value ? strdup(value) : NULL;
        preference_set[which] = true;
    }
    const char *value = preferences[which] ? preferences[which] : "";
    pthread_mutex_unlock(&preference_lock);
    return value;
}

void halide_vulkan_set_layer_names(const char *n) { set_preference(PREF_LAYERS, n); }
const char *halide_vulkan_get_layer_names(void *uc) { (void)uc; return get_preference(PREF_LAYERS); }
void halide_vulkan_set_extension_names(const char *n) { set_preference(PREF_EXTENSIONS, n); }
const char *halide_vulkan_get_extension_names(void *uc) {
    (void)uc;
    return get_preference(PREF_EXTENSIONS);
}
void halide_vulkan_set_device_type(const char *n) { set_preference(PREF_DEVICE_TYPE, n); }
const char *halide_vulkan_get_device_type(void *uc) {
    (void)uc;
    return get_preference(PREF_DEVICE_TYPE);
}
void halide_vulkan_set_build_options(const char *n) { set_preference(PREF_BUILD_OPTIONS, n); }
const char *halide_vulkan_get_build_options(void *uc) {
    (void)uc;
    return get_preference(PREF_BUILD_OPTIONS);
}
void halide_vulkan_set_alloc_config(const char *n) { set_preference(PREF_ALLOC_CONFIG, n); }
const char *halide_vulkan_get_alloc_config(void *uc) {
    (void)uc;
    return get_preference(PREF_ALLOC_CONFIG);
}

/* Allocation callbacks: the shim passes none to the driver (its own allocations are few and
 * long-lived); what a program sets is kept and given back, as Halide's getter does. */
static const void *allocation_callbacks;
void halide_vulkan_set_allocation_callbacks(const void *callbacks) {
    __atomic_store_n(&allocation_callbacks, callbacks, __ATOMIC_RELEASE);
}
const void *halide_vulkan_get_allocation_callbacks(void *uc) {
    (void)uc;
    return __atomic_load_n(&allocation_callbacks, __ATOMIC_ACQUIRE);
}

/* A ':'-separated list (Halide's delimiter on Linux) as at most `max` names in `storage`. */
static int split_names(const char *list, char *storage, size_t storage_size, const char **names,
                       int max) {
    snprintf(storage, storage_size, "%s", list);
    int count = 0;
    for (char *save = NULL, *name = strtok_r(storage, ":", &save); name && count < max;
         name = strtok_r(NULL, ":", &save)) {
        if (*name) {
            names[count++] = name;
        }
    }
    return count;
}

/* --- the loader ------------------------------------------------------------------------- */

static bool load_loader(char *message, size_t size) {
    if (loader.library != NULL) {
        return true;
    }
    void *library = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        library = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    }
    if (library == NULL) {
        shim_vk_say(message, size, 0, "no Vulkan loader (libvulkan.so.1) on this machine: install one, "
            "e.g. Debian's libvulkan1 with mesa-vulkan-drivers for lavapipe's CPU device, or "
            "your GPU vendor's driver (%s)", dlerror());
        return false;
    }
    get_instance_proc_fn get = (get_instance_proc_fn)dlsym(library, "vkGetInstanceProcAddr");
    if (get == NULL) {
        shim_vk_say(message, size, 0, "the Vulkan loader has no vkGetInstanceProcAddr");
        dlclose(library);
        return false;
    }
    loader.get_instance_proc = get;
    loader.create_instance = (void *)get(NULL, "vkCreateInstance");
    loader.enumerate_instance_extensions = (void *)get(NULL, "vkEnumerateInstanceExtensionProperties");
    if (loader.create_instance == NULL || loader.enumerate_instance_extensions == NULL) {
        shim_vk_say(message, size, 0, "the Vulkan loader lacks vkCreateInstance");
        dlclose(library);
        return false;
    }
    loader.library = library;
    return true;
}

static bool load_instance_functions(VkInstance instance) {
    get_instance_proc_fn get = loader.get_instance_proc;
    loader.destroy_instance = (void *)get(instance, "vkDestroyInstance");
    loader.enumerate_physical_devices = (void *)get(instance, "vkEnumeratePhysicalDevices");
    loader.get_properties = (void *)get(instance, "vkGetPhysicalDeviceProperties");
    loader.get_queue_families = (void *)get(instance, "vkGetPhysicalDeviceQueueFamilyProperties");
    loader.get_memory_properties = (void *)get(instance, "vkGetPhysicalDeviceMemoryProperties");
    loader.get_features = (void *)get(instance, "vkGetPhysicalDeviceFeatures");
    loader.get_features2 = (void *)get(instance, "vkGetPhysicalDeviceFeatures2");
    if (loader.get_features2 == NULL) {
        loader.get_features2 = (void *)get(instance, "vkGetPhysicalDeviceFeatures2KHR");
    }
    loader.enumerate_device_extensions = (void *)get(instance, "vkEnumerateDeviceExtensionProperties");
    loader.create_device = (void *)get(instance, "vkCreateDevice");
    loader.get_device_proc = (void *)get(instance, "vkGetDeviceProcAddr");
    return loader.destroy_instance && loader.enumerate_physical_devices && loader.get_properties &&
           loader.get_queue_families && loader.get_memory_properties && loader.get_features &&
           loader.enumerate_device_extensions && loader.create_device && loader.get_device_proc;
}

static bool instance_has_extension(const char *name) {
    uint32_t count = 0;
    if (loader.enumerate_instance_extensions(NULL, &count, NULL) != VK_SUCCESS || count == 0) {
        return false;
    }
    VkExtensionProperties *found = calloc(count, sizeof *found);
    bool has = false;
    if (found && loader.enumerate_instance_extensions(NULL, &count, found) >= 0) {
        for (uint32_t i = 0; i < count && !has; i++) {
            has = strcmp(found[i].extensionName, name) == 0;
        }
    }
    free(found);
    return has;
}

/* An instance with the requested layers (Halide's), or a Halide error code. */
static int create_instance(VkInstance *instance, char *message, size_t size) {
    char storage[1024];
    const char *layers[32];
    int layer_count = split_names(get_preference(PREF_LAYERS), storage, sizeof storage, layers, 32);
    const char *extensions[1];
    uint32_t extension_count = 0;
    /* Halide requires it; in Vulkan 1.1 and later it is core, and a 1.0 loader lists it. */
    if (instance_has_extension("VK_KHR_get_physical_device_properties2")) {
        extensions[extension_count++] = "VK_KHR_get_physical_device_properties2";
    }
    VkApplicationInfo application = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "halide-shim",
                                     VK_MAKE_API_VERSION(0, 1, 0, 0), "Halide",
                                     VK_MAKE_API_VERSION(0, 21, 0, 0),
                                     VK_MAKE_API_VERSION(0, 1, 3, 0)};
    VkInstanceCreateInfo info = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &application,
                                 (uint32_t)layer_count, layers, extension_count, extensions};
    VkResult result = loader.create_instance(&info, NULL, instance);
    if (result != VK_SUCCESS) {
        return shim_vk_say(message, size, halide_error_code_device_interface_no_device,
                   "vkCreateInstance failed: %s%s", shim_vk_result_name(result),
                   result == VK_ERROR_LAYER_NOT_PRESENT
                       ? " (a layer named in HL_VK_LAYERS or VK_INSTANCE_LAYERS is not installed)"
                       : "");
    }
    if (!load_instance_functions(*instance)) {
        return shim_vk_say(message, size, halide_error_code_symbol_not_found,
                   "the Vulkan loader lacks instance functions the shim needs");
    }
    return halide_error_code_success;
}

int shim_vk_probe(char *names, size_t size) {
    pthread_mutex_lock(&start_lock);
    int count = -1;
    VkInstance instance = NULL;
    if (load_loader(names, size) && create_instance(&instance, names, size) == 0) {
        uint32_t n = 0;
        loader.enumerate_physical_devices(instance, &n, NULL);
        VkPhysicalDevice *devices = calloc(n ? n : 1, sizeof *devices);
        if (devices && loader.enumerate_physical_devices(instance, &n, devices) >= 0) {
            size_t used = 0;
            names[0] = 0;
            for (uint32_t i = 0; i < n; i++) {
                VkPhysicalDeviceProperties properties;
                loader.get_properties(devices[i], &properties);
                int wrote = snprintf(names + used, size - used, "%s\n", properties.deviceName);
                if (wrote > 0 && (size_t)wrote < size - used) {
                    used += (size_t)wrote;
                }
            }
            count = (int)n;
        }
        free(devices);
    }
    if (instance != NULL && instance != shim_vk.instance) {
        loader.destroy_instance(instance, NULL);
    }
    pthread_mutex_unlock(&start_lock);
    return count;
}

/* --- choosing the device, as Halide's vk_select_device_for_context does -------------------- */

static bool type_matches(const char *wanted, int32_t type) {
    bool integrated = type == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
    bool discrete = type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
    if (wanted == NULL || *wanted == 0) {
        return integrated || discrete; /* a real GPU by default */
    }
    return (strstr(wanted, "cpu") && type == VK_PHYSICAL_DEVICE_TYPE_CPU) ||
           (strstr(wanted, "integrated-gpu") && integrated) ||
           (strstr(wanted, "discrete-gpu") && discrete) ||
           (strstr(wanted, "virtual-gpu") && type == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU) ||
           (strstr(wanted, "gpu") && (integrated || discrete));
}

/* The first compute queue family of `device`, or -1. */
static int compute_family(VkPhysicalDevice device, uint32_t *timestamp_bits) {
    uint32_t count = 0;
    loader.get_queue_families(device, &count, NULL);
    VkQueueFamilyProperties *families = calloc(count ? count : 1, sizeof *families);
    int found = -1;
    if (families != NULL) {
        loader.get_queue_families(device, &count, families);
        for (uint32_t i = 0; i < count && found < 0; i++) {
            if (families[i].queueCount > 0 && (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
                found = (int)i;
                *timestamp_bits = families[i].timestampValidBits;
            }
        }
    }
    free(families);
    return found;
}

/* The device of the given type (Halide's HL_VK_DEVICE_TYPE) with a compute queue; else, as
 * Halide, the first device. */
static int select_device(VkInstance instance, char *message, size_t size) {
    uint32_t count = 0;
    VkResult result = loader.enumerate_physical_devices(instance, &count, NULL);
    if ((result != VK_SUCCESS && result != VK_INCOMPLETE) || count == 0) {
        return shim_vk_say(message, size, halide_error_code_device_interface_no_device,
                   "the Vulkan loader lists no device (%s)", shim_vk_result_name(result));
    }
    VkPhysicalDevice *devices = calloc(count, sizeof *devices);
    if (devices == NULL) {
        return shim_vk_say(message, size, halide_error_code_out_of_memory, "out of memory");
    }
    loader.enumerate_physical_devices(instance, &count, devices);
    const char *wanted = get_preference(PREF_DEVICE_TYPE);
    int family = -1;
    uint32_t bits = 0;
    VkPhysicalDevice chosen = NULL;
    for (uint32_t i = 0; i < count && chosen == NULL; i++) {
        VkPhysicalDeviceProperties properties;
        loader.get_properties(devices[i], &properties);
        if (type_matches(wanted, properties.deviceType) &&
            (family = compute_family(devices[i], &bits)) >= 0) {
            chosen = devices[i];
        }
    }
    if (chosen == NULL) {
        chosen = devices[0];
        family = compute_family(chosen, &bits);
    }
    free(devices);
    if (family < 0) {
        return shim_vk_say(message, size, halide_error_code_device_interface_no_device,
                   "the Vulkan device has no compute queue");
    }
    shim_vk.physical_device = chosen;
    shim_vk.queue_family = (uint32_t)family;
    shim_vk.timestamp_bits = bits;
    loader.get_properties(chosen, &shim_vk.properties);
    loader.get_memory_properties(chosen, &shim_vk.memory_properties);
    return halide_error_code_success;
}

/* The device's functions, from the loader (a Halide error code: one the shim needs missing). */
static int load_device_functions(VkDevice device, char *message, size_t size) {
#define LOAD(name)                                                                              \
    shim_vk.fn.name = (void *)loader.get_device_proc(device, #name);                            \
    if (shim_vk.fn.name == NULL) {                                                              \
        return shim_vk_say(message, size, halide_error_code_symbol_not_found,                   \
                           "the Vulkan driver lacks " #name);                                   \
    }
    SHIM_VK_DEVICE_FUNCTIONS(LOAD)
#undef LOAD
#define LOAD_OPTIONAL(name) shim_vk.fn.name = (void *)loader.get_device_proc(device, #name);
    SHIM_VK_TIMELINE_FUNCTIONS(LOAD_OPTIONAL)
#undef LOAD_OPTIONAL
    return halide_error_code_success;
}

/* --- the device, with Halide's extensions and every feature the device has --------------- */

static int create_device(char *message, size_t size) {
    VkPhysicalDevice physical = shim_vk.physical_device;
    uint32_t count = 0;
    loader.enumerate_device_extensions(physical, NULL, &count, NULL);
    VkExtensionProperties *supported = calloc(count ? count : 1, sizeof *supported);
    if (supported == NULL) {
        return shim_vk_say(message, size, halide_error_code_out_of_memory, "out of memory");
    }
    loader.enumerate_device_extensions(physical, NULL, &count, supported);
#define SUPPORTED(name)                                                                         \
    ({                                                                                          \
        bool has_ = false;                                                                      \
        for (uint32_t i_ = 0; i_ < count && !has_; i_++) {                                      \
            has_ = strcmp(supported[i_].extensionName, (name)) == 0;                            \
        }                                                                                       \
        has_;                                                                                   \
    })
    static const char *const required[] = {"VK_KHR_8bit_storage",
                                           "VK_KHR_storage_buffer_storage_class"};
    static const char *const optional[] = {"VK_KHR_portability_subset", "VK_KHR_maintenance5",
                                           "VK_KHR_16bit_storage", "VK_KHR_shader_float16_int8",
                                           "VK_KHR_shader_float_controls"};
    const char *enabled[64];
    int enabled_count = 0;
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        if (!SUPPORTED(required[i])) {
            free(supported);
            return shim_vk_say(message, size, halide_error_code_device_interface_no_device,
                       "the Vulkan device %s lacks %s, which Halide's kernels need",
                       shim_vk.properties.deviceName, required[i]);
        }
        enabled[enabled_count++] = required[i];
    }
    for (size_t i = 0; i < sizeof optional / sizeof *optional; i++) {
        if (SUPPORTED(optional[i])) {
            enabled[enabled_count++] = optional[i];
        }
    }
    /* HL_VK_EXTENSIONS: Halide 21 stores it and enables nothing from it; the shim enables the
     * names the device has, so that a program's extra extensions reach the device. */
    char storage[1024];
    const char *extra[32];
    int extra_count = split_names(get_preference(PREF_EXTENSIONS), storage, sizeof storage, extra, 32);
    for (int i = 0; i < extra_count && enabled_count < 64; i++) {
        bool already = false;
        for (int j = 0; j < enabled_count && !already; j++) {
            already = strcmp(enabled[j], extra[i]) == 0;
        }
        if (!already && SUPPORTED(extra[i])) {
            enabled[enabled_count++] = extra[i];
        }
    }
#undef SUPPORTED
    char layer_storage[1024];
    const char *layers[32];
    int layer_count = split_names(get_preference(PREF_LAYERS), layer_storage,
                                  sizeof layer_storage, layers, 32);

    /* Every feature the device has (Halide's kernels may use 8/16-bit storage and arithmetic
     * and half floats): queried through the chain Halide queries, and enabled as reported. */
    uint32_t major = VK_API_VERSION_MAJOR(shim_vk.properties.apiVersion);
    uint32_t minor = VK_API_VERSION_MINOR(shim_vk.properties.apiVersion);
    bool v11 = major > 1 || minor >= 1, v12 = major > 1 || minor >= 2;
    /* (Timeline semaphores, for launches that are not waited for: Vulkan 1.2.) */
    VkPhysicalDeviceTimelineSemaphoreFeatures timeline = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES, NULL, 0};
    VkPhysicalDeviceShaderFloat16Int8Features f16_i8 = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, v12 ? &timeline : NULL,
        0, 0};
    VkPhysicalDevice8BitStorageFeatures storage8 = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES, &f16_i8, 0, 0, 0};
    VkPhysicalDevice16BitStorageFeatures storage16 = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, v12 ? &storage8 : NULL, 0, 0, 0, 0};
    VkPhysicalDeviceFeatures2 features2 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                           &storage16, {{0}}};
    VkPhysicalDeviceFeatures features;
    const void *next = NULL;
    const VkPhysicalDeviceFeatures *plain = NULL;
    if (loader.get_features2 != NULL && v11) {
        loader.get_features2(physical, &features2);
        next = &features2;
    } else {
        loader.get_features(physical, &features);
        plain = &features;
    }
    float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0,
                                          shim_vk.queue_family, 1, &priority};
    VkDeviceCreateInfo info = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, next, 0, 1, &queue_info,
                               (uint32_t)layer_count, layers, (uint32_t)enabled_count, enabled,
                               plain};
    VkDevice device = NULL;
    VkResult result = loader.create_device(physical, &info, NULL, &device);
    free(supported);
    if (result != VK_SUCCESS) {
        return shim_vk_say(message, size, halide_error_code_device_interface_no_device,
                   "vkCreateDevice failed for %s: %s", shim_vk.properties.deviceName,
                   shim_vk_result_name(result));
    }
    result = load_device_functions(device, message, size);
    if (result) {
        return result;
    }
    VK(vkGetDeviceQueue, void (*)(VkDevice, uint32_t, uint32_t, VkQueue *), device,
       shim_vk.queue_family, 0, &shim_vk.queue);
    /* Launches are not waited for where the device has timeline semaphores, unless
     * $HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH=1 (as Halide's runtime does, which waits for the
     * queue to be idle after each). */
    const char *wait_each = getenv("HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH");
    if (timeline.timelineSemaphore && shim_vk.fn.vkCreateSemaphore && shim_vk.fn.vkWaitSemaphores &&
        shim_vk.fn.vkGetSemaphoreCounterValue && !(wait_each && strcmp(wait_each, "1") == 0)) {
        VkSemaphoreTypeCreateInfo type = {VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO, NULL,
                                          VK_SEMAPHORE_TYPE_TIMELINE, 0};
        VkSemaphoreCreateInfo info = {VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, &type, 0};
        VkSemaphore semaphore = 0;
        if (VK(vkCreateSemaphore, VkResult (*)(VkDevice, const VkSemaphoreCreateInfo *,
                                               const void *, VkSemaphore *),
               device, &info, NULL, &semaphore) == VK_SUCCESS) {
            shim_vk.timeline = semaphore;
        }
    }
    __atomic_store_n(&shim_vk.device, device, __ATOMIC_RELEASE);
    return halide_error_code_success;
}

/* --- an application's own context (Halide's halide_vulkan_acquire_context override) ------- */

typedef int (*acquire_hook)(void *, void **, VkInstance *, VkDevice *, VkPhysicalDevice *,
                            VkQueue *, uint32_t *, uint64_t *, bool);
typedef int (*release_hook)(void *, VkInstance, VkDevice, VkQueue, uint64_t);

/* An application's own halide_vulkan_acquire_context: one the executable or a preloaded
 * library defines comes before the shim's in the process's symbol lookup, as it comes before
 * Halide's runtime in a program that overrides it (Halide's way to run pipelines on the
 * application's device). NULL where the one found is the shim's. */
static acquire_hook application_acquire(release_hook *release) {
    void *found = dlsym(RTLD_DEFAULT, "halide_vulkan_acquire_context");
    Dl_info theirs, ours;
    if (found == NULL || !dladdr(found, &theirs) || !dladdr((void *)&shim_vk, &ours) ||
        theirs.dli_fbase == ours.dli_fbase) {
        return NULL;
    }
    *release = (release_hook)dlsym(RTLD_DEFAULT, "halide_vulkan_release_context");
    return (acquire_hook)found;
}

/* Run on the application's instance, device and queue instead of making them. The shim takes
 * the context through the application's hook at every submission (release after), as Halide's
 * runtime takes it for every operation, so that an application that locks in its hook orders
 * its own use of the queue with the shim's. Launches are each waited for: the application chose
 * the device's features, timeline semaphores among them. */
static int adopt_application_context(acquire_hook acquire, release_hook release, char *message,
                                     size_t size) {
    void *allocator = NULL;
    VkInstance instance = NULL;
    VkDevice device = NULL;
    VkPhysicalDevice physical = NULL;
    VkQueue queue = NULL;
    uint32_t family = 0;
    uint64_t messenger = 0;
    int result = acquire(NULL, &allocator, &instance, &device, &physical, &queue, &family,
                         &messenger, true);
    if (result) {
        return shim_vk_say(message, size, result,
                           "the application's halide_vulkan_acquire_context failed (%d)", result);
    }
    if (release != NULL) {
        release(NULL, instance, device, queue, messenger);
    }
    if (instance == NULL || device == NULL || physical == NULL || queue == NULL) {
        return shim_vk_say(message, size, halide_error_code_device_interface_no_device,
                           "the application's halide_vulkan_acquire_context gave no device");
    }
    if (!load_instance_functions(instance)) {
        return shim_vk_say(message, size, halide_error_code_symbol_not_found,
                           "the Vulkan loader lacks instance functions the shim needs");
    }
    result = load_device_functions(device, message, size);
    if (result) {
        return result;
    }
    shim_vk.instance = instance;
    shim_vk.physical_device = physical;
    shim_vk.queue_family = family;
    shim_vk.queue = queue;
    loader.get_properties(physical, &shim_vk.properties);
    loader.get_memory_properties(physical, &shim_vk.memory_properties);
    uint32_t count = 0;
    loader.get_queue_families(physical, &count, NULL);
    VkQueueFamilyProperties *families = calloc(count ? count : 1, sizeof *families);
    if (families != NULL) {
        loader.get_queue_families(physical, &count, families);
        shim_vk.timestamp_bits = family < count ? families[family].timestampValidBits : 0;
        free(families);
    }
    shim_vk.application_acquire = (void *)acquire;
    shim_vk.application_release = (void *)release;
    __atomic_store_n(&shim_vk.device, device, __ATOMIC_RELEASE);
    return halide_error_code_success;
}

void shim_vk_hold_queue(void) {
    if (shim_vk.application_acquire != NULL) {
        void *allocator;
        VkInstance instance;
        VkDevice device;
        VkPhysicalDevice physical;
        VkQueue queue;
        uint32_t family;
        uint64_t messenger;
        ((acquire_hook)shim_vk.application_acquire)(NULL, &allocator, &instance, &device, &physical,
                                                    &queue, &family, &messenger, false);
    }
}

void shim_vk_release_queue(void) {
    if (shim_vk.application_release != NULL) {
        ((release_hook)shim_vk.application_release)(NULL, shim_vk.instance, shim_vk.device,
                                                    shim_vk.queue, 0);
    }
}

int shim_vk_start(char *message, size_t size) {
    pthread_mutex_lock(&start_lock);
    int result = halide_error_code_success;
    release_hook release = NULL;
    acquire_hook acquire = NULL;
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
        if (!load_loader(message, size)) {
            result = halide_error_code_device_interface_no_device;
        } else if ((acquire = application_acquire(&release)) != NULL) {
            result = adopt_application_context(acquire, release, message, size);
        } else if (shim_vk.instance == NULL) {
            result = create_instance(&shim_vk.instance, message, size);
        }
        if (result == 0 && acquire == NULL) {
            result = select_device(shim_vk.instance, message, size);
        }
        if (result == 0 && acquire == NULL) {
            result = create_device(message, size);
        }
        if (result == 0) {
            const char *staged = getenv("HALIDE_SHIM_VULKAN_STAGED_COPIES");
            shim_vk.map_device_memory = staged == NULL || strcmp(staged, "1") != 0;
            shim_vk.process = shim_bound_process();
        }
    }
    pthread_mutex_unlock(&start_lock);
    return result;
}

const char *shim_vk_device_name(void) {
    return shim_vk.properties.deviceName;
}

void shim_vk_device_facts(uint64_t facts[8]) {
    const VkPhysicalDeviceMemoryProperties *memory = &shim_vk.memory_properties;
    uint64_t device_local = 0;
    for (uint32_t i = 0; i < memory->memoryHeapCount; i++) {
        if (memory->memoryHeaps[i].flags & 1 /* VK_MEMORY_HEAP_DEVICE_LOCAL_BIT */) {
            device_local = device_local > memory->memoryHeaps[i].size ? device_local
                                                                      : memory->memoryHeaps[i].size;
        }
    }
    facts[0] = shim_vk.properties.limits.minStorageBufferOffsetAlignment;
    facts[1] = device_local;
    facts[2] = VK_API_VERSION_MAJOR(shim_vk.properties.apiVersion);
    facts[3] = VK_API_VERSION_MINOR(shim_vk.properties.apiVersion);
    facts[4] = shim_vk.properties.limits.maxStorageBufferRange;
    facts[5] = shim_vk.timestamp_bits != 0;
    facts[6] = shim_vk.map_device_memory;
    facts[7] = shim_vk.timeline != 0;
}

int shim_vk_usable(void *user_context) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
        int result = shim_py_device_start(user_context, shim_backend_interface(SHIM_BACKEND_VULKAN));
        if (result) {
            return result;
        }
        if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
            halide_error(user_context, "Vulkan: the device could not be made\n");
            return halide_error_code_device_interface_no_device;
        }
    }
    return shim_refuse_after_fork(user_context, shim_vk.process, "Vulkan");
}

/* --- Halide's entry points ------------------------------------------------------------------ */

const struct halide_device_interface_t *halide_vulkan_device_interface(void) {
    return shim_backend_interface(SHIM_BACKEND_VULKAN);
}

/* Halide's context hooks, for native code that asks for the device the pipelines run on (to
 * make VkBuffers to wrap, say). The shim has no Halide allocator to give (NULL), and no debug
 * messenger; the context is the shim's, for the life of the process. There is no lock to hold
 * between the two: nothing of the device is shared but the queue, whose submissions the shim
 * serializes itself (an application that submits to it must not do so concurrently with a
 * pipeline call). */
int halide_vulkan_acquire_context(void *user_context, void **allocator, VkInstance *instance,
                                  VkDevice *device, VkPhysicalDevice *physical_device,
                                  VkQueue *queue, uint32_t *queue_family_index, uint64_t *messenger,
                                  bool create) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL && !create) {
        *instance = NULL;
        *device = NULL;
        *physical_device = NULL;
        *queue = NULL;
    } else {
        int result = shim_vk_usable(user_context);
        if (result) {
            return result;
        }
        *instance = shim_vk.instance;
        *device = shim_vk.device;
        *physical_device = shim_vk.physical_device;
        *queue = shim_vk.queue;
        *queue_family_index = shim_vk.queue_family;
    }
    if (allocator != NULL) {
        *allocator = NULL;
    }
    if (messenger != NULL) {
        *messenger = 0;
    }
    return halide_error_code_success;
}

int halide_vulkan_release_context(void *user_context, VkInstance instance, VkDevice device,
                                  VkQueue queue, uint64_t messenger) {
    (void)user_context;
    (void)instance;
    (void)device;
    (void)queue;
    (void)messenger;
    return halide_error_code_success;
}

bool halide_vulkan_is_initialized(void) {
    return __atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) != NULL;
}

/* A pipeline's bundled runtime registers halide_vulkan_cleanup as a destructor, which would
 * release the device at unload; both resolve here (the shim's library comes first), and the
 * device is the shim's, for the process: nothing to do, as for OpenCL (opencl.c). */
int halide_vulkan_device_release(void *user_context) {
    (void)user_context;
    return halide_error_code_success;
}

void halide_vulkan_cleanup(void) {
}

int halide_vulkan_release_unused_device_allocations(void *user_context) {
    return shim_py_release_unused_allocations(user_context, SHIM_BACKEND_VULKAN);
}

int halide_vulkan_compute_capability(void *user_context, int *major, int *minor) {
    return shim_py_compute_capability(user_context, major, minor,
                                      shim_backend_interface(SHIM_BACKEND_VULKAN));
}

/* Native handles: the VkBuffer itself (Halide 21 stores and returns whatever it is given, which
 * its own runtime then reads as its private region: Halide issues 8715 and 8943; the shim takes
 * and gives the VkBuffer, the meaning later Halide adopts). The VkBuffer must be on the shim's
 * device (halide_vulkan_acquire_context gives it). */
int halide_vulkan_wrap_vk_buffer(void *user_context, struct halide_buffer_t *buf,
                                 uint64_t vk_buffer) {
    return halide_device_wrap_native(user_context, buf, vk_buffer, halide_vulkan_device_interface());
}

int halide_vulkan_detach_vk_buffer(void *user_context, struct halide_buffer_t *buf) {
    int result = shim_check_native_handle(user_context, buf, SHIM_BACKEND_VULKAN,
                                          "halide_vulkan_detach_vk_buffer");
    if (result == SHIM_NO_NATIVE_HANDLE) {
        return halide_error_code_success;
    }
    return result ? result : halide_device_detach_native(user_context, buf);
}

uintptr_t halide_vulkan_get_vk_buffer(void *user_context, struct halide_buffer_t *buf) {
    int result = shim_check_native_handle(user_context, buf, SHIM_BACKEND_VULKAN,
                                          "halide_vulkan_get_vk_buffer");
    if (result) {
        return 0;
    }
    const shim_vk_handle *handle = (const shim_vk_handle *)shim_device_load(buf);
    return (uintptr_t)handle->buffer;
}

/* Halide's runtime resolves the loader's symbols through this; the shim's are its own. */
void *halide_vulkan_get_symbol(void *user_context, const char *name) {
    (void)user_context;
    pthread_mutex_lock(&start_lock); /* (the loader is opened once, under the lock) */
    bool loaded = load_loader(NULL, 0);
    pthread_mutex_unlock(&start_lock);
    return loaded ? dlsym(loader.library, name) : NULL;
}
