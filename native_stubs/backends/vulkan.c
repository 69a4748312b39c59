/* Halide's Vulkan entry points and the Vulkan device, served by the shim's Vulkan backend
 * (shim/backends/vulkan.py).
 *
 * Unlike OpenCL and CUDA, whose Python packages own the driver, the whole Vulkan device lives
 * here, in plain C against the loader (libvulkan.so.1, opened with dlopen at first use), and
 * Python calls down into it: the instance, device and queue (chosen as Halide's runtime chooses
 * them), allocations, copies, and (vulkan_kernels.c) shader modules and launches. No Python
 * package is needed, and the paths every launch and copy takes never enter Python.
 *
 * Work is submitted to one queue. Each submission begins with a barrier that orders it after
 * everything submitted before, so the device runs the shim's work in submission order, as one
 * in-order queue, whichever thread submitted it; each returns once its fence has signalled,
 * so a copy's bytes are where they should be when it returns, as the backend contract asks.
 * Threads record and wait concurrently: only vkQueueSubmit itself takes a lock.
 *
 * Memory: a Buffer's allocation is device-local; where the device-local memory is also
 * host-visible (integrated GPUs, lavapipe) it stays mapped and copies are memcpy, else they
 * go through a host-visible staging buffer and vkCmdCopyBuffer.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "devices/device_generic.h"
#include "devices/served.h"
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

/* Write the reason into the caller's buffer; returns `code`. */
__attribute__((format(printf, 4, 5))) static int say(char *message, size_t size, int code,
                                                     const char *format, ...) {
    if (message != NULL && size > 0) {
        va_list args;
        va_start(args, format);
        vsnprintf(message, size, format, args);
        va_end(args);
    }
    return code;
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
        say(message, size, 0, "no Vulkan loader (libvulkan.so.1) on this machine: install one, "
            "e.g. Debian's libvulkan1 with mesa-vulkan-drivers for lavapipe's CPU device, or "
            "your GPU vendor's driver (%s)", dlerror());
        return false;
    }
    get_instance_proc_fn get = (get_instance_proc_fn)dlsym(library, "vkGetInstanceProcAddr");
    if (get == NULL) {
        say(message, size, 0, "the Vulkan loader has no vkGetInstanceProcAddr");
        dlclose(library);
        return false;
    }
    loader.get_instance_proc = get;
    loader.create_instance = (void *)get(NULL, "vkCreateInstance");
    loader.enumerate_instance_extensions = (void *)get(NULL, "vkEnumerateInstanceExtensionProperties");
    if (loader.create_instance == NULL || loader.enumerate_instance_extensions == NULL) {
        say(message, size, 0, "the Vulkan loader lacks vkCreateInstance");
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
        return say(message, size, halide_error_code_device_interface_no_device,
                   "vkCreateInstance failed: %s%s", shim_vk_result_name(result),
                   result == VK_ERROR_LAYER_NOT_PRESENT
                       ? " (a layer named in HL_VK_LAYERS or VK_INSTANCE_LAYERS is not installed)"
                       : "");
    }
    if (!load_instance_functions(*instance)) {
        return say(message, size, halide_error_code_symbol_not_found,
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
        return say(message, size, halide_error_code_device_interface_no_device,
                   "the Vulkan loader lists no device (%s)", shim_vk_result_name(result));
    }
    VkPhysicalDevice *devices = calloc(count, sizeof *devices);
    if (devices == NULL) {
        return say(message, size, halide_error_code_out_of_memory, "out of memory");
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
        return say(message, size, halide_error_code_device_interface_no_device,
                   "the Vulkan device has no compute queue");
    }
    shim_vk.physical_device = chosen;
    shim_vk.queue_family = (uint32_t)family;
    shim_vk.timestamp_bits = bits;
    loader.get_properties(chosen, &shim_vk.properties);
    loader.get_memory_properties(chosen, &shim_vk.memory_properties);
    return halide_error_code_success;
}

/* --- the device, with Halide's extensions and every feature the device has --------------- */

static int create_device(char *message, size_t size) {
    VkPhysicalDevice physical = shim_vk.physical_device;
    uint32_t count = 0;
    loader.enumerate_device_extensions(physical, NULL, &count, NULL);
    VkExtensionProperties *supported = calloc(count ? count : 1, sizeof *supported);
    if (supported == NULL) {
        return say(message, size, halide_error_code_out_of_memory, "out of memory");
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
            return say(message, size, halide_error_code_device_interface_no_device,
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
        return say(message, size, halide_error_code_device_interface_no_device,
                   "vkCreateDevice failed for %s: %s", shim_vk.properties.deviceName,
                   shim_vk_result_name(result));
    }
#define LOAD(name)                                                                              \
    shim_vk.fn.name = (void *)loader.get_device_proc(device, #name);                            \
    if (shim_vk.fn.name == NULL) {                                                              \
        return say(message, size, halide_error_code_symbol_not_found,                           \
                   "the Vulkan driver lacks " #name);                                           \
    }
    SHIM_VK_DEVICE_FUNCTIONS(LOAD)
#undef LOAD
#define LOAD_OPTIONAL(name) shim_vk.fn.name = (void *)loader.get_device_proc(device, #name);
    SHIM_VK_TIMELINE_FUNCTIONS(LOAD_OPTIONAL)
#undef LOAD_OPTIONAL
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

int shim_vk_start(char *message, size_t size) {
    pthread_mutex_lock(&start_lock);
    int result = halide_error_code_success;
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
        if (!load_loader(message, size)) {
            result = halide_error_code_device_interface_no_device;
        } else if (shim_vk.instance == NULL) {
            result = create_instance(&shim_vk.instance, message, size);
        }
        if (result == 0) {
            result = select_device(shim_vk.instance, message, size);
        }
        if (result == 0) {
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
        say(message, message_size, 0, "allocating %llu bytes of Vulkan device memory failed: %s",
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
    value = shim_vk.submitted + 1;
    result = VK(vkQueueSubmit, VkResult (*)(VkQueue, uint32_t, const VkSubmitInfo *, VkFence),
                shim_vk.queue, 1, &info, shim_vk.timeline != 0 ? 0 : s->fence);
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
    VkResult result = VK(vkQueueWaitIdle, VkResult (*)(VkQueue), shim_vk.queue);
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
        return say(message, size, VK_ERROR_UNKNOWN, "a copy of over 16 dimensions");
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
            return say(message, size, drained, "waiting for the device's work failed: %s",
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
            return say(message, size, result, "a Vulkan staging buffer of %lld bytes: %s",
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
        return say(message, size, VK_ERROR_OUT_OF_HOST_MEMORY, "out of memory for a copy's regions");
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
        return say(message, size, result, "a Vulkan copy failed: %s", shim_vk_result_name(result));
    }
    return VK_SUCCESS;
}

int shim_vk_transfer(int direction, shim_vk_memory *src, shim_vk_memory *dst, void *host,
                     const int64_t *shape, const int64_t *src_strides, const int64_t *dst_strides,
                     int outer, int64_t src_offset, int64_t dst_offset, char *message,
                     size_t message_size) {
    if (__atomic_load_n(&shim_vk.device, __ATOMIC_ACQUIRE) == NULL) {
        return say(message, message_size, VK_ERROR_INITIALIZATION_FAILED, "no Vulkan device");
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
    __atomic_store_n(&handle->served, 1, __ATOMIC_RELEASE);
    return (uint64_t)(uintptr_t)handle;
}

static bool claim_served(uint64_t value, uint64_t *native, uint64_t *nbytes, uint64_t *capacity) {
    shim_vk_handle *handle = (shim_vk_handle *)(uintptr_t)value;
    uint32_t expected = 1;
    if (!__atomic_compare_exchange_n(&handle->served, &expected, 0, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
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

static bool served_native(uint64_t value, uint64_t *native) {
    const shim_vk_handle *handle = (const shim_vk_handle *)(uintptr_t)value;
    if (!__atomic_load_n(&handle->served, __ATOMIC_ACQUIRE)) {
        return false;
    }
    *native = (uint64_t)(uintptr_t)handle->memory;
    return true;
}

/* The first `nbytes` of an allocation, complete when they return, as the Python backend's
 * write and read. */
static int write_allocation(uint64_t native, const void *host, uint64_t nbytes) {
    int64_t shape[1] = {(int64_t)nbytes}, none[1] = {0};
    return transfer(0, NULL, (shim_vk_memory *)(uintptr_t)native, (uint8_t *)host, shape, none,
                    none, 0, 0, 0, NULL, 0);
}

static int read_allocation(uint64_t native, void *host, uint64_t nbytes) {
    int64_t shape[1] = {(int64_t)nbytes}, none[1] = {0};
    return transfer(1, (shim_vk_memory *)(uintptr_t)native, NULL, host, shape, none, none, 0, 0,
                    0, NULL, 0);
}

static const shim_allocator allocator = {
    driver_usable, create_allocation, release_allocation, make_served_handle, claim_served,
    release_served_handle, served_native, write_allocation, read_allocation,
};

void shim_vk_serve_allocations(shim_pool *pool) {
    shim_served_register(SHIM_BACKEND_VULKAN, &allocator, pool);
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
