/* Halide 21 runtime ABI as cffi sees it.
 *
 * This is the one place the Python side learns the layout of Halide's structs. It mirrors
 * HalideRuntime.h from the halide==21.0.0 wheel, written in the subset of C that cffi's cdef
 * parser accepts (no attributes, no preprocessor conditionals). cffi's API mode compiles these
 * declarations against the real header, so a field that drifts fails the build; tests/test_abi.py
 * also compares every size and offset with a program compiled against the real header.
 */

typedef enum halide_type_code_t {
    halide_type_int = 0,
    halide_type_uint = 1,
    halide_type_float = 2,
    halide_type_handle = 3,
    halide_type_bfloat = 4
} halide_type_code_t;

struct halide_type_t {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
};

typedef struct halide_dimension_t {
    int32_t min, extent, stride;
    uint32_t flags;
} halide_dimension_t;

typedef enum {
    halide_buffer_flag_host_dirty = 1,
    halide_buffer_flag_device_dirty = 2
} halide_buffer_flags;

struct halide_device_interface_t;
struct halide_device_interface_impl_t;

typedef struct halide_buffer_t {
    uint64_t device;
    const struct halide_device_interface_t *device_interface;
    uint8_t *host;
    uint64_t flags;
    struct halide_type_t type;
    int32_t dimensions;
    halide_dimension_t *dim;
    void *padding;
} halide_buffer_t;

struct halide_device_interface_t {
    int (*device_malloc)(void *user_context, struct halide_buffer_t *buf,
                         const struct halide_device_interface_t *device_interface);
    int (*device_free)(void *user_context, struct halide_buffer_t *buf);
    int (*device_sync)(void *user_context, struct halide_buffer_t *buf);
    void (*device_release)(void *user_context,
                           const struct halide_device_interface_t *device_interface);
    int (*copy_to_host)(void *user_context, struct halide_buffer_t *buf);
    int (*copy_to_device)(void *user_context, struct halide_buffer_t *buf,
                          const struct halide_device_interface_t *device_interface);
    int (*device_and_host_malloc)(void *user_context, struct halide_buffer_t *buf,
                                  const struct halide_device_interface_t *device_interface);
    int (*device_and_host_free)(void *user_context, struct halide_buffer_t *buf);
    int (*buffer_copy)(void *user_context, struct halide_buffer_t *src,
                       const struct halide_device_interface_t *dst_device_interface,
                       struct halide_buffer_t *dst);
    int (*device_crop)(void *user_context, const struct halide_buffer_t *src,
                       struct halide_buffer_t *dst);
    int (*device_slice)(void *user_context, const struct halide_buffer_t *src,
                        int slice_dim, int slice_pos, struct halide_buffer_t *dst);
    int (*device_release_crop)(void *user_context, struct halide_buffer_t *buf);
    int (*wrap_native)(void *user_context, struct halide_buffer_t *buf, uint64_t handle,
                       const struct halide_device_interface_t *device_interface);
    int (*detach_native)(void *user_context, struct halide_buffer_t *buf);
    int (*compute_capability)(void *user_context, int *major, int *minor);
    const struct halide_device_interface_impl_t *impl;
};

struct halide_scalar_value_t {
    union {
        bool b;
        int8_t i8;
        int16_t i16;
        int32_t i32;
        int64_t i64;
        uint8_t u8;
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
        float f32;
        double f64;
        void *handle;
    } u;
};

/* What a halide_trace event is (struct halide_trace_event_t's `event`; the native library's
 * trace handler, native_stubs/profiling/tracing.c, reads the struct through the real header). */
enum halide_trace_event_code_t {
    halide_trace_load = 0,
    halide_trace_store = 1,
    halide_trace_begin_realization = 2,
    halide_trace_end_realization = 3,
    halide_trace_produce = 4,
    halide_trace_end_produce = 5,
    halide_trace_consume = 6,
    halide_trace_end_consume = 7,
    halide_trace_begin_pipeline = 8,
    halide_trace_end_pipeline = 9,
    halide_trace_tag = 10
};

/* A trace event as Halide 21 lays it out (56 bytes; Halide 22's is abi/halide22_runtime.h's
 * halide22_trace_event_t), and the handler an application installs: it gets events in this
 * layout from every library, unless code of a Halide 22 library installed it
 * (native_stubs/profiling/trace_handlers.c, docs/profiling.md). */
struct halide_trace_event_t {
    const char *func;
    void *value;
    int32_t *coordinates;
    const char *trace_tag;
    struct halide_type_t type;
    enum halide_trace_event_code_t event;
    int32_t parent_id;
    int32_t value_index;
    int32_t dimensions;
};
typedef int32_t (*halide_trace_t)(void *user_context, const struct halide_trace_event_t *);
halide_trace_t halide_set_custom_trace(halide_trace_t trace);
int32_t halide_default_trace(void *user_context, const struct halide_trace_event_t *event);

enum halide_argument_kind_t {
    halide_argument_kind_input_scalar = 0,
    halide_argument_kind_input_buffer = 1,
    halide_argument_kind_output_buffer = 2
};

struct halide_filter_argument_t {
    const char *name;
    int32_t kind;
    int32_t dimensions;
    struct halide_type_t type;
    const struct halide_scalar_value_t *scalar_def, *scalar_min, *scalar_max, *scalar_estimate;
    int64_t const *const *buffer_estimates;
};

struct halide_filter_metadata_t {
    int32_t version;
    int32_t num_arguments;
    const struct halide_filter_argument_t *arguments;
    const char *target;
    const char *name;
};

enum halide_error_code_t {
    halide_error_code_success = 0,
    halide_error_code_generic_error = -1,
    halide_error_code_explicit_bounds_too_small = -2,
    halide_error_code_bad_type = -3,
    halide_error_code_access_out_of_bounds = -4,
    halide_error_code_buffer_allocation_too_large = -5,
    halide_error_code_buffer_extents_too_large = -6,
    halide_error_code_constraints_make_required_region_smaller = -7,
    halide_error_code_constraint_violated = -8,
    halide_error_code_param_too_small = -9,
    halide_error_code_param_too_large = -10,
    halide_error_code_out_of_memory = -11,
    halide_error_code_buffer_argument_is_null = -12,
    halide_error_code_debug_to_file_failed = -13,
    halide_error_code_copy_to_host_failed = -14,
    halide_error_code_copy_to_device_failed = -15,
    halide_error_code_device_malloc_failed = -16,
    halide_error_code_device_sync_failed = -17,
    halide_error_code_device_free_failed = -18,
    halide_error_code_no_device_interface = -19,
    halide_error_code_unimplemented = -20,
    halide_error_code_symbol_not_found = -21,
    halide_error_code_internal_error = -22,
    halide_error_code_device_run_failed = -23,
    halide_error_code_unaligned_host_ptr = -24,
    halide_error_code_bad_fold = -25,
    halide_error_code_fold_factor_too_small = -26,
    halide_error_code_requirement_failed = -27,
    halide_error_code_buffer_extents_negative = -28,
    halide_error_code_gpu_device_error = -29,
    halide_error_code_trace_failed = -30,
    halide_error_code_specialize_fail = -31,
    halide_error_code_device_wrap_native_failed = -32,
    halide_error_code_device_detach_native_failed = -33,
    halide_error_code_host_is_null = -34,
    halide_error_code_bad_extern_fold = -35,
    halide_error_code_device_interface_no_device = -36,
    halide_error_code_host_and_device_dirty = -37,
    halide_error_code_buffer_is_null = -38,
    halide_error_code_device_buffer_copy_failed = -39,
    halide_error_code_device_crop_unsupported = -40,
    halide_error_code_device_crop_failed = -41,
    halide_error_code_incompatible_device_interface = -42,
    halide_error_code_bad_dimensions = -43,
    halide_error_code_device_dirty_with_no_device_support = -44,
    halide_error_code_storage_bound_too_small = -45,
    halide_error_code_split_factor_not_positive = -46,
    halide_error_code_vscale_invalid = -47,
    halide_error_code_cannot_profile_pipeline = -48
};

/* The runtime entry points Python calls directly. */
void halide_error(void *user_context, const char *msg);
int halide_copy_to_host(void *user_context, struct halide_buffer_t *buf);
int halide_copy_to_device(void *user_context, struct halide_buffer_t *buf,
                          const struct halide_device_interface_t *device_interface);
int halide_device_malloc(void *user_context, struct halide_buffer_t *buf,
                         const struct halide_device_interface_t *device_interface);
int halide_device_free(void *user_context, struct halide_buffer_t *buf);
int halide_device_sync(void *user_context, struct halide_buffer_t *buf);
int halide_device_sync_global(void *user_context,
                              const struct halide_device_interface_t *device_interface);
void halide_device_release(void *user_context,
                           const struct halide_device_interface_t *device_interface);
int halide_device_wrap_native(void *user_context, struct halide_buffer_t *buf, uint64_t handle,
                              const struct halide_device_interface_t *device_interface);
int halide_device_detach_native(void *user_context, struct halide_buffer_t *buf);
int halide_device_and_host_malloc(void *user_context, struct halide_buffer_t *buf,
                                  const struct halide_device_interface_t *device_interface);
int halide_device_and_host_free(void *user_context, struct halide_buffer_t *buf);
int halide_buffer_copy(void *user_context, struct halide_buffer_t *src,
                       const struct halide_device_interface_t *dst_device_interface,
                       struct halide_buffer_t *dst);
int halide_device_crop(void *user_context, const struct halide_buffer_t *src,
                       struct halide_buffer_t *dst);
int halide_device_slice(void *user_context, const struct halide_buffer_t *src,
                        int slice_dim, int slice_pos, struct halide_buffer_t *dst);
int halide_device_release_crop(void *user_context, struct halide_buffer_t *buf);
int halide_set_num_threads(int n);
int halide_get_num_threads(void);

/* Reusing device allocations (Halide's allocation_cache.cpp; served by
 * native_stubs/devices/allocation_reuse.c and the pools of shim/backends/pool.py). */
int halide_reuse_device_allocations(void *user_context, bool);
bool halide_can_reuse_device_allocations(void *user_context);
struct halide_device_allocation_pool {
    int (*release_unused)(void *user_context);
    struct halide_device_allocation_pool *next;
};
void halide_register_device_allocation_pool(struct halide_device_allocation_pool *);

/* Which multitarget sub-target may run (can_use_target.cpp; served per release by
 * native_stubs/calls/target_features.c), and an application's own answer to it. */
typedef int (*halide_can_use_target_features_t)(int count, const uint64_t *features);
int halide_can_use_target_features(int count, const uint64_t *features);
int halide_default_can_use_target_features(int count, const uint64_t *features);
halide_can_use_target_features_t halide_set_custom_can_use_target_features(
    halide_can_use_target_features_t);
