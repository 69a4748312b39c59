/* The native library's own API for device allocations: the pool every backend's freed memory
 * goes to (native_stubs/devices/pool.c), and the allocations the native layer serves itself
 * (native_stubs/devices/served.c). See abi/shim_calls.h for what every abi/shim_*.h header is.
 */

/* One backend's idle device allocations, with Halide's reuse rules (shim/backends/pool.py
 * says which, and why). An entry is a backend's native value (a cl_mem, a CUdeviceptr, a
 * host address) and its capacity in bytes; the pool owns what it holds, and hands each entry
 * to exactly one taker. Its lock guards the list and the counts only and is never held across
 * a driver call. */
typedef struct shim_pool shim_pool;
shim_pool *shim_pool_new(void);
void shim_pool_delete(shim_pool *pool);
/* Halide's quantize_allocation_size: rounded up to the 4 most significant bits. */
uint64_t shim_pool_quantize(uint64_t nbytes);
/* Halide's rule: `size` fits pooled memory of `capacity`, wasting at most 1/8 of it. */
bool shim_pool_fits(uint64_t size, uint64_t capacity);
/* At most max_count entries and max_bytes bytes; max_bytes -1: not set yet (nothing is
 * pooled until it is). */
void shim_pool_set_bounds(shim_pool *pool, int64_t max_count, int64_t max_bytes);
int64_t shim_pool_max_count(const shim_pool *pool);
int64_t shim_pool_max_bytes(const shim_pool *pool);
/* The best-fitting entry for `size` (quantized), removed, its capacity in *capacity; 0 if
 * none fits. Counted as reused. */
uint64_t shim_pool_take(shim_pool *pool, uint64_t size, uint64_t *capacity);
/* Pool an entry: -1 if it alone exceeds the bounds (nothing kept), else 1 if the pool now
 * exceeds them (the caller then evicts, below, until it is within them), 0 if not. */
int shim_pool_put(shim_pool *pool, uint64_t native, uint64_t capacity);
/* The oldest entry while the pool exceeds its bounds, removed; 0 once within them. */
uint64_t shim_pool_evict(shim_pool *pool, uint64_t *capacity);
/* The oldest entry, removed; 0 if the pool is empty (a drain is a loop of these). */
uint64_t shim_pool_pop(shim_pool *pool, uint64_t *capacity);
uint64_t shim_pool_length(const shim_pool *pool);
uint64_t shim_pool_bytes(const shim_pool *pool);
/* Allocations made by the driver, served from the pool, freed to the driver. */
void shim_pool_counts(const shim_pool *pool, uint64_t *fresh, uint64_t *reused, uint64_t *freed);
void shim_pool_count(shim_pool *pool, uint64_t fresh, uint64_t freed);
/* In a forked child: the entries are the parent's driver state; forget them (never touched
 * again) and take a new lock. */
void shim_pool_forget_after_fork(shim_pool *pool);

/* shim/native/regions.py's Layout.nbytes_span of a buffer (the bytes an allocation mirroring it
 * spans), for the layouts it gives a positive size for without raising: false for the others
 * (an empty extent, a negative stride or extent, a size past 2^60), which Python decides. */
bool shim_buffer_span(const struct halide_buffer_t *buf, uint64_t *span);

/* Allocations served by the native layer (native_stubs/devices/served.c): device_malloc,
 * device_free and (for buffers whose elements are dense) copy_to_device and copy_to_host of a
 * pipeline's own buffers (no shim.Buffer, no crop) on a backend whose native side registered an
 * allocator, with no Python. Python switches it per backend (the tests run
 * the same work both ways and compare) and takes a served allocation over the first time it
 * needs one (a crop of it, a copy, a profile): shim/memory/families.py. */
void shim_serve_allocations(int backend, bool on);
bool shim_serves_allocations(int backend);
/* Served allocations alive now, and the capacity they hold. */
int64_t shim_served_live(int backend, int64_t *bytes);
/* Bytes the served copies moved so far, each way. */
void shim_served_transferred(int backend, uint64_t *uploaded, uint64_t *downloaded,
                             uint64_t *device_copied);
/* Buffer.device_malloc and Buffer.device_free (shim/core/buffer_operations.py) of a shim.Buffer's
 * struct `buf`, served as halide_device_malloc and halide_device_free serve one: 0 once done,
 * anything else (nothing done) where the Python core decides. The malloc marks host memory
 * the newer copy, as the Python core's; the free leaves a buffer whose results are only on the
 * device to the Python core, which brings them home first. Call with the GIL released (a
 * cffi call). */
int shim_buffer_device_malloc(struct halide_buffer_t *buf,
                              const struct halide_device_interface_t *interface);
int shim_buffer_device_free(struct halide_buffer_t *buf);
/* Take over the served allocation behind `handle` (its own handle, or a crop or slice of it
 * made in C): 1, with its native value, the bytes asked for, the capacity and its own handle
 * (`root`), and the native layer forgets it and its crops (the handles stay valid: they are
 * now the caller's, released as any other); 0 if `handle` is not one served and not yet taken. */
int shim_served_adopt(int backend, uint64_t handle, uint64_t *native, uint64_t *nbytes,
                      uint64_t *capacity, uint64_t *root);
/* After shim_served_adopt gave `root`: the crops of it made in C that were live then, up to
 * `room` of them (each handle, and its byte offset into the allocation); how many there are. */
int shim_served_crops(int backend, uint64_t root, uint64_t *handles, uint64_t *offsets, int room);
