/* DLPack 1.x (dmlc/dlpack include/dlpack/dlpack.h): the structs exchanged through
 * __dlpack__ capsules. Plain C that cffi's cdef and the native library both read. */

typedef struct DLPackVersion {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLDevice {
    int32_t device_type; /* DLDeviceType: kDLCPU = 1, kDLCUDA = 2, kDLOpenCL = 4, ... */
    int32_t device_id;
} DLDevice;

typedef struct DLDataType {
    uint8_t code; /* kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct DLTensor {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements, outermost first; NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags; /* READ_ONLY = 1, IS_COPIED = 2 */
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
