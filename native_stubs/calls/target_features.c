/* halide_can_use_target_features, answered for each library in its own release's numbering.
 *
 * A multitarget library's dispatcher asks, before its first call, whether this CPU can run each
 * of its sub-targets but the last (the fallback), passing the sub-target's features as a bit
 * mask in the numbering of the Halide release that built it; the earliest sub-target that may
 * run is used from then on. Releases number features differently (shim/base/releases.py): read
 * in another release's numbering, a Halide 19 dispatcher's avx512_sapphirerapids is Halide 21's
 * avx512_cannonlake, and a CPU without AVX512-FP16 runs Sapphire Rapids code and dies of SIGILL.
 * So each bit is translated by its meaning (the release's runtime_feature table) before the CPU
 * is asked.
 *
 * The CPU's answers: on x86, what this file detects itself, for all sixteen of Halide's x86
 * features, a feature usable only where the CPU has every extension Halide's code generation
 * turns on for it in any release served (CodeGen_X86's target CPU and attributes at v19, v21
 * and main) and the OS saves the registers it needs (XCR0). Halide 19's and 21's runtimes check
 * only ten of them (an avxvnni or avx512_zen5 sub-target runs on any CPU there), and their
 * avx512_sapphirerapids takes no AVX512-FP16 or AMX, which the code they generate for it may
 * use. Elsewhere, the answers of the runtime linked into this library (Halide 21's
 * halide_get_cpu_features). A CPU feature nothing here detects is never usable: a sub-target
 * the CPU may lack never runs, where Halide's own runtime would run it.
 *
 * An application's own answer (halide_set_custom_can_use_target_features) is asked instead, with
 * the library's mask as the library passed it; halide_default_can_use_target_features, which it
 * may call, answers in the numbering of the library whose question it is answering. Halide 22
 * lets an answer say "not right now" (2) or "for the moment" (3); dispatchers of earlier
 * releases take any non-zero answer as "use it" for good, so they get 0 for 2 and 1 for 3.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_native.h"
#include "calls/halide_hooks.h"
#include "calls/releases.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SHIM_DETECTS_X86 1
#endif

/* The CPU's features in the runtime's numbering (Halide 21's enum): those detected (known) and,
 * of them, those this CPU has (available). */
static uint64_t known[SHIM_FEATURE_WORDS], available[SHIM_FEATURE_WORDS];
static pthread_once_t detected = PTHREAD_ONCE_INIT;

static void note(int feature, bool has) {
    known[feature / 64] |= 1ull << (feature % 64);
    if (has) {
        available[feature / 64] |= 1ull << (feature % 64);
    }
}

#ifdef SHIM_DETECTS_X86
static bool bit(unsigned reg, int n) {
    return (reg >> n) & 1;
}

static void detect_x86(void) {
    unsigned a, b, c, d;
    unsigned c1 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0, d71 = 0, b24 = 0, c81 = 0;
    if (__get_cpuid(1, &a, &b, &c1, &d) == 0) {
        c1 = 0;
    }
    if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7) == 0) {
        b7 = c7 = d7 = 0;
    }
    if (__get_cpuid_count(7, 1, &a71, &b, &c, &d71) == 0) {
        a71 = d71 = 0;
    }
    if (__get_cpuid(0x80000001, &a, &b, &c81, &d) == 0) {
        c81 = 0;
    }
    /* What the OS saves on a context switch (XCR0), readable where OSXSAVE says so: AVX's
     * registers (bits 1, 2), AVX-512's (5, 6, 7), AMX's tiles (17, 18), APX's (19). */
    uint64_t xcr0 = 0;
    if (bit(c1, 27)) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((uint64_t)hi << 32) | lo;
    }
    bool os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    bool os_amx = (xcr0 & 0x60000) == 0x60000, os_apx = (xcr0 >> 19) & 1;
    bool amx = os_amx && bit(d7, 22) && bit(d7, 24) && bit(d7, 25); /* bf16, tile, int8 */
    if (amx) {
        /* Linux gives a process AMX's tile data only once asked (ARCH_REQ_XCOMP_PERM for
         * XFEATURE_XTILEDATA), as Halide 22's runtime asks; refused, AMX code would fault. */
        amx = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    if (__get_cpuid_count(0x24, 0, &a, &b24, &c, &d) == 0) {
        b24 = 0;
    }

    /* Halide's sse41 is penryn's (SSE3, SSSE3, SSE4.1), its avx Sandy Bridge's (x86-64-v2:
     * SSE4.2, POPCNT too), its avx2 Haswell's (x86-64-v3: BMI1, BMI2, LZCNT, MOVBE too). */
    bool sse41 = bit(c1, 0) && bit(c1, 9) && bit(c1, 19);
    bool avx = sse41 && os_avx && bit(c1, 20) && bit(c1, 23) && bit(c1, 28);
    bool f16c = avx && bit(c1, 29), fma = avx && bit(c1, 12);
    bool avx2 = fma && f16c && bit(b7, 5) && bit(b7, 3) && bit(b7, 8) && bit(c81, 5) &&
                bit(c1, 22);
    bool avx512 = avx2 && os_avx512 && bit(b7, 16) && bit(b7, 28);                /* F, CD */
    bool knl = avx512 && bit(b7, 26) && bit(b7, 27);                                /* PF, ER */
    bool skylake = avx512 && bit(b7, 31) && bit(b7, 30) && bit(b7, 17);            /* VL, BW, DQ */
    bool cannonlake = skylake && bit(b7, 21) && bit(c7, 1);                          /* IFMA, VBMI */
    bool avxvnni = avx2 && bit(a71, 4);
    /* BF16, VNNI, BITALG, VBMI2, and VPOPCNTDQ, GFNI, VAES, VPCLMULQDQ that znver4 has. */
    bool zen4 = cannonlake && bit(a71, 5) && bit(c7, 11) && bit(c7, 12) && bit(c7, 6) &&
                bit(c7, 14) && bit(c7, 8) && bit(c7, 9) && bit(c7, 10);
    bool zen5 = zen4 && avxvnni && bit(d7, 8);                                      /* VP2INTERSECT */
    bool sapphirerapids = zen4 && avxvnni && bit(d7, 23) && amx;                    /* FP16, AMX */
    note(halide_target_feature_sse41, sse41);
    note(halide_target_feature_avx, avx);
    note(halide_target_feature_f16c, f16c);
    note(halide_target_feature_fma, fma);
    note(halide_target_feature_fma4, avx && bit(c81, 16));
    note(halide_target_feature_avx2, avx2);
    note(halide_target_feature_avxvnni, avxvnni);
    note(halide_target_feature_avx512, avx512);
    note(halide_target_feature_avx512_knl, knl);
    note(halide_target_feature_avx512_skylake, skylake);
    note(halide_target_feature_avx512_cannonlake, cannonlake);
    note(halide_target_feature_avx512_zen4, zen4);
    note(halide_target_feature_avx512_zen5, zen5);
    note(halide_target_feature_avx512_sapphirerapids, sapphirerapids);
    note(halide_target_feature_avx10_1, os_avx512 && bit(d71, 19) && (b24 & 0xff) >= 1);
    note(halide_target_feature_x86_apx, os_apx && bit(d71, 21));
}
#else
/* The runtime's own detection (Halide 21's CpuFeatures: two words of each). */
struct halide_cpu_features {
    uint64_t known[2], available[2];
};
int halide_get_cpu_features(struct halide_cpu_features *features);
#endif

static void detect(void) {
#ifdef SHIM_DETECTS_X86
    detect_x86();
#else
    struct halide_cpu_features cpu;
    if (halide_get_cpu_features(&cpu) == 0) {
        memcpy(known, cpu.known, sizeof cpu.known);
        memcpy(available, cpu.available, sizeof cpu.available);
    }
#endif
}

static int answer(const struct shim_release_facts *release, int count, const uint64_t *features) {
    pthread_once(&detected, detect);
    for (int i = 0; i < count * 64 && i < SHIM_FEATURES; i++) {
        if (!((features[i / 64] >> (i % 64)) & 1)) {
            continue;
        }
        int feature = i < release->feature_count ? release->runtime_feature[i] : SHIM_FEATURE_UNKNOWN;
        if (feature == SHIM_FEATURE_UNKNOWN) {
            return 0;
        }
        bool refused = feature >= 0 && ((known[feature / 64] >> (feature % 64)) & 1) &&
                       !((available[feature / 64] >> (feature % 64)) & 1);
        if (refused) {
            return 0;
        }
    }
    return 1;
}

/* The release whose question a custom hook is answering on this thread (-1: none), for
 * halide_default_can_use_target_features called from the hook. */
static __thread int asking = -1;

static void mask_of(int count, const uint64_t *features, uint64_t mask[SHIM_FEATURE_WORDS]) {
    memset(mask, 0, SHIM_FEATURE_WORDS * sizeof *mask);
    memcpy(mask, features, (size_t)(count < SHIM_FEATURE_WORDS ? count : SHIM_FEATURE_WORDS) *
                               sizeof *mask);
}

__attribute__((noinline)) int halide_default_can_use_target_features(int count,
                                                                      const uint64_t *features) {
    if (count <= 0 || features == NULL) {
        return 1;
    }
    int release = asking;
    if (release < 0) {
        uint64_t mask[SHIM_FEATURE_WORDS];
        mask_of(count, features, mask);
        release = shim_library_settle(__builtin_return_address(0), mask);
    }
    return answer(shim_release_facts(release), count, features);
}

__attribute__((noinline)) int halide_can_use_target_features(int count, const uint64_t *features) {
    if (count <= 0 || features == NULL) {
        return 1;
    }
    uint64_t mask[SHIM_FEATURE_WORDS];
    mask_of(count, features, mask);
    int release = shim_library_settle(__builtin_return_address(0), mask);
    const struct shim_release_facts *facts = shim_release_facts(release);
    halide_can_use_target_features_t hook =
        __atomic_load_n(&shim_halide_custom_can_use_target_features, __ATOMIC_ACQUIRE);
    int result;
    if (hook == NULL || hook == halide_default_can_use_target_features) {
        result = answer(facts, count, features);
    } else {
        int outer = asking;
        asking = release;
        result = hook(count, features);
        asking = outer;
    }
    if (!facts->volatile_feature_answers) {
        result = result == 2 ? 0 : result != 0;
    }
    return result;
}

int shim_cpu_can_use(int index, const uint64_t *words) {
    if (index < 0 || index >= SHIM_RELEASES) {
        return -1;
    }
    return answer(shim_release_facts(index), SHIM_FEATURE_WORDS, words);
}
