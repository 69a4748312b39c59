/* The Halide releases the native library serves libraries by, and the libraries it knows the
 * release of. See abi/shim_calls.h for what every abi/shim_*.h header is.
 *
 * shim/base/releases.py is the table of what differs between releases; shim/native/libraries.py
 * hands its facts here (shim_release_define) and registers each library shim.load opens with
 * the release that built it (shim_library_register). An entry point whose meaning differs
 * between releases serves a call by the release of the library its caller's code lies in
 * (native_stubs/calls/releases.c); a library nobody registered is served by the default
 * release (shim_release_set_default). */

enum {
    SHIM_RELEASES = 8,        /* releases the table may hold */
    SHIM_FEATURE_WORDS = 4,   /* uint64 words of a feature mask the native library reads */
    SHIM_FEATURES = 256,      /* SHIM_FEATURE_WORDS * 64 */
    SHIM_MASKS = 32           /* masks a library's dispatcher may pass, per numbering */
};

/* What a release's feature number means to the native library's CPU detection: its number in
 * the numbering of the runtime linked into the library (Halide 21's enum), or: */
enum {
    SHIM_FEATURE_NOT_CPU = -1,   /* not about the CPU (a GPU, the OS, the compiler): no answer */
    SHIM_FEATURE_UNKNOWN = -2    /* about the CPU, but nothing here detects it: never usable */
};

struct shim_release_facts {
    uint16_t scalar_lanes;            /* halide_type_t's third field for scalar elements */
    uint8_t profiler_abi;             /* shim/base/releases.py: Release.profiler_abi */
    uint8_t trace_abi;                /* Release.trace_abi */
    uint8_t vulkan_buffer_offsets;    /* Release.vulkan_buffer_offsets */
    uint8_t volatile_feature_answers; /* Release.volatile_feature_answers */
    int16_t feature_count;            /* its halide_target_feature_end */
    int16_t runtime_feature[256];     /* [SHIM_FEATURES]: its feature i, in the runtime's numbering */
};

/* Define release `index` (0 <= index < SHIM_RELEASES). 0, or -1 for a bad index. Called at
 * import, before any library is registered. */
int shim_release_define(int index, const struct shim_release_facts *facts);
/* The release a library nobody registered is served by. */
int shim_release_set_default(int index);

/* The library holding `address` (any address of its code or data, such as an entry point's)
 * was built by `release`. Where the evidence left two releases that number features
 * differently (19 and 21), `alternative` is the other (-1: none), and the masks its
 * multitarget dispatcher passes to halide_can_use_target_features tell them apart: `masks`
 * holds `mask_count` masks of SHIM_FEATURE_WORDS words in `release`'s numbering, then as many
 * in `alternative`'s, and the first call with a mask of only one of the two lists settles the
 * library's release. 0, or -1 (not a loaded library; the registry full; a bad release). */
int shim_library_register(uintptr_t address, int release, int alternative, int mask_count,
                          const uint64_t *masks);
/* The release the library holding `address` is served by now (the default where nobody
 * registered it), and the alternative its dispatcher has yet to settle (-1: none). */
int shim_library_release(uintptr_t address);
int shim_library_alternative(uintptr_t address);

/* halide_can_use_target_features' answer for `words` (SHIM_FEATURE_WORDS words) in the
 * numbering of release `index`, from this CPU: 1 usable, 0 not. (The entry point answers a
 * library the same way, in its own release's numbering.) */
int shim_cpu_can_use(int index, const uint64_t *words);
