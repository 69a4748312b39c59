/* The native library's own API for halide_buffer_t fields that generated code and other threads
 * change concurrently (flags, device), and Halide's host allocator. See abi/shim_calls.h for
 * what every abi/shim_*.h header is.
 */

/* Atomic reads and updates of halide_buffer_t::flags for Python, which must never read-modify-
 * write the word itself: generated code and other threads change it concurrently. */
uint64_t shim_flags_get(const struct halide_buffer_t *buf);
void shim_flags_assign(struct halide_buffer_t *buf, uint64_t bits, bool value);

/* A flag bit of the shim's own, above Halide's dirty bits (which generated code and Halide's
 * buffer helpers update without touching other bits): set on every member of a shared family
 * (a Buffer with crops or slices). Such a member's dirty bits are derived from the family's
 * regions, so both can be set at once without a conflict (a parent with one crop newer on the
 * device and a disjoint one newer on the host); the native layer leaves that case to the
 * Python core, which knows the regions (shim/memory/aliasing.py). */
#define SHIM_BUFFER_FLAG_REGIONS 65536
/* Another: the struct is a shim.Buffer's, and its allocation family lives in Python
 * (shim/memory/families.py); the native layer never serves its allocations itself
 * (native_stubs/devices/served.c). Crops made by generated code copy the bit with the rest of
 * the flags, which only sends their allocations to Python too. */
#define SHIM_BUFFER_FLAG_PYTHON 131072

/* Atomic stores Python uses for the device fields; release order, so that a fast path that
 * sees a device handle also sees the interface stored before it. */
void shim_buffer_set_device(struct halide_buffer_t *buf, uint64_t device,
                            const struct halide_device_interface_t *device_interface);

/* Halide's host allocator (from the standalone runtime), for device_and_host_malloc. */
void *halide_malloc(void *user_context, size_t size);
void halide_free(void *user_context, void *ptr);
