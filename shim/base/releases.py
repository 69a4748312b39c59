"""The Halide releases whose libraries the shim serves, and everything that differs between them.

Every runtime entry point whose meaning changed between Halide releases serves each library by
the release that built it (DESIGN.md, invariant 7): this module is the one table of what
differs. Nothing else in the package branches on a release: the entry points read a release's
facts (handed to the native library by shim/native/libraries.py), the loader decides which
release built a library from evidence the facts describe (shim/calls/library_release.py).

Sources: Halide's src/runtime/HalideRuntime.h, src/Target.cpp and src/Module.cpp at v19.0.0,
v21.0.0 and abbf7ff983 (main on 2026-08-22, which will be Halide 22). Halide 22 is prepared from
that source and emulated by the tests, not yet verified with a Halide 22 compiler (none is
released): docs/releases.md.
"""

from __future__ import annotations

from typing import NamedTuple


class Release(NamedTuple):
    """One Halide release, as the runtime entry points meet the libraries it builds."""

    name: str
    # halide_target_feature_t in enum order, each by the token target strings spell it with
    # (Target.cpp's feature_name_map: cuda_capability_30 for cuda_capability30, vk_int8 for
    # vulkan_int8...). A library asks halide_can_use_target_features about these numbers.
    features: tuple[str, ...]
    # halide_type_t's third field in a buffer of scalar elements: `lanes`, 1, until Halide 22
    # made it `reserved`, 0 (PR 9205). Generated code compares all 32 bits of a buffer
    # argument's type with its own, so each call's buffers carry the value of the pipeline's
    # release; argument metadata carries it too.
    scalar_lanes: int
    # halide_profiler_instance_start's arguments and the profiler's structs (0: 5 arguments,
    # 72-byte func stats; 1: Halide 22's 11 arguments, 192-byte func stats with counters: PRs
    # 9157, 9164, 9344).
    profiler_abi: int
    # halide_trace_helper's arguments and halide_trace_event_t (0: 12 arguments, 56-byte
    # events; 1: Halide 22's thread_id argument, 64-byte events, events 11 and 12 for parallel
    # tasks, halide_current_thread_id: PRs 9192, 9205).
    trace_abi: int
    # Vulkan kernels read an int32 element offset per buffer argument after their scalar
    # arguments, and bind every buffer whole (PR 8954); before, a crop was bound at its offset.
    vulkan_buffer_offsets: bool
    # Its multitarget dispatchers read halide_can_use_target_features' answers 2 ("not right
    # now") and 3 ("for the moment") and ask again later (PR 9320); older ones take any
    # non-zero answer as "use it" and keep it for good.
    volatile_feature_answers: bool
    # What separates a multitarget sub-target's name from its dispatcher's: f-x86-64-linux-avx2
    # until Halide 22, which spells names as C identifiers, f_x86___64___linux___avx2 (PR 9315:
    # `_` first, `___` for each `-`).
    subtarget_separator: str
    # Whether the shim has served libraries this release's compiler built: Halide 22's side of
    # every difference is prepared from its source and emulated by the tests until a Halide 22
    # is released (benchmarks/halide22_kit.py then checks it).
    verified: bool = True


def _inserted(base: tuple, after: str, *new: str) -> tuple:
    """``base`` with ``new`` inserted after ``after``: how every release changed the enum."""
    at = base.index(after) + 1
    return base[:at] + new + base[at:]


_FEATURES_19 = (
    "jit", "debug", "no_asserts", "no_bounds_query", "sse41", "avx", "avx2", "fma", "fma4",
    "f16c", "armv7s", "no_neon", "vsx", "power_arch_2_07", "cuda", "cuda_capability_30",
    "cuda_capability_32", "cuda_capability_35", "cuda_capability_50", "cuda_capability_61",
    "cuda_capability_70", "cuda_capability_75", "cuda_capability_80", "cuda_capability_86",
    "opencl", "cl_doubles", "cl_atomics64", "user_context", "profile", "no_runtime", "metal",
    "c_plus_plus_name_mangling", "large_buffers", "hvx_128", "hvx_v62", "fuzz_float_stores",
    "soft_float_abi", "msan", "avx512", "avx512_knl", "avx512_skylake", "avx512_cannonlake",
    "avx512_zen4", "avx512_sapphirerapids", "trace_loads", "trace_stores",
    "trace_realizations", "trace_pipeline", "hvx_v65", "hvx_v66", "hvx_v68", "cl_half",
    "strict_float", "tsan", "asan", "d3d12compute", "check_unsafe_promises", "hexagon_dma",
    "embed_bitcode", "enable_llvm_loop_opt", "wasm_mvponly", "wasm_simd128", "wasm_threads",
    "wasm_bulk_memory", "webgpu", "sve", "sve2", "egl", "arm_dot_prod", "arm_fp16",
    "llvm_large_code_model", "rvv", "armv8a", "armv81a", "armv82a", "armv83a", "armv84a",
    "armv85a", "armv86a", "armv87a", "armv88a", "armv89a", "sanitizer_coverage",
    "profile_by_timer", "spirv", "vulkan", "vk_int8", "vk_int16", "vk_int64", "vk_float16",
    "vk_float64", "vk_v10", "vk_v12", "vk_v13", "semihosting", "avx10_1", "x86apx",
)
# Halide 21: PRs 8703 (enable_backtraces), 8612 (avxvnni, avx512_zen5), 8623 (simulator).
_FEATURES_21 = _inserted(_inserted(_inserted(_inserted(
    _FEATURES_19, "debug", "enable_backtraces"), "avx2", "avxvnni"),
    "avx512_zen4", "avx512_zen5"), "x86apx", "simulator")
# Halide 22: PRs 9259 (CUDA capabilities), 9126 (SME), 9077 (HLSL shader models).
_FEATURES_22 = _inserted(_inserted(_inserted(
    _FEATURES_21, "cuda_capability_86", "cuda_capability_89", "cuda_capability_90",
    "cuda_capability_100", "cuda_capability_120"),
    "sve2", "sme2", "sme_svl128", "sme_svl256", "sme_svl512", "sme_svl1024", "sme_svl2048"),
    "simulator", *(f"hlsl_sm{n}" for n in range(60, 70)))

RELEASES = (
    Release("19", _FEATURES_19, scalar_lanes=1, profiler_abi=0, trace_abi=0,
            vulkan_buffer_offsets=False, volatile_feature_answers=False,
            subtarget_separator="-"),
    Release("21", _FEATURES_21, scalar_lanes=1, profiler_abi=0, trace_abi=0,
            vulkan_buffer_offsets=False, volatile_feature_answers=False,
            subtarget_separator="-"),
    Release("22", _FEATURES_22, scalar_lanes=0, profiler_abi=1, trace_abi=1,
            vulkan_buffer_offsets=True, volatile_feature_answers=True,
            subtarget_separator="___", verified=False),
)
BY_NAME = {release.name: release for release in RELEASES}
# The release of the runtime linked into the native library (native_stubs/build.py), whose
# numbering of features the native library's own CPU detection answers in.
RUNTIME = BY_NAME["21"]
# What a library is taken for where nothing tells its release apart: 19 and 21 differ only in
# the numbering of features, which only multitarget dispatchers pass, and there the numbers
# they pass tell (shim/calls/library_release.py).
DEFAULT = BY_NAME["21"]

# Tokens target strings take for a feature besides its own (Target.cpp: "hvx" is hvx_128).
FEATURE_ALIASES = {"hvx": "hvx_128"}
# Tokens of target strings that are not features: `trace_all` sets three features, and
# `tune_*` and `vector_bits_*` set the processor and vector width.
TRACE_ALL = ("trace_loads", "trace_stores", "trace_realizations")
# The features that are facts about the CPU, which a runtime's halide_can_use_target_features
# checks (x86_cpu_features.cpp, arm_cpu_features.cpp): every other feature is about the
# compiler, the OS or a GPU, and is not the CPU's to refuse.
CPU_FEATURES = frozenset({
    "sse41", "avx", "avx2", "avxvnni", "fma", "fma4", "f16c", "avx512", "avx512_knl",
    "avx512_skylake", "avx512_cannonlake", "avx512_zen4", "avx512_zen5",
    "avx512_sapphirerapids", "avx10_1", "x86apx",
    "armv7s", "no_neon", "sve", "sve2", "arm_dot_prod", "arm_fp16", "sme2", "sme_svl128",
    "sme_svl256", "sme_svl512", "sme_svl1024", "sme_svl2048",
})


def feature_words(release: Release, names) -> tuple[int, ...]:
    """The bit mask of ``names`` in ``release``'s numbering, as halide_can_use_target_features
    takes it: uint64 words, feature i at bit i % 64 of word i // 64."""
    words = [0] * ((len(release.features) + 63) // 64)
    for name in names:
        i = release.features.index(FEATURE_ALIASES.get(name, name))
        words[i // 64] |= 1 << (i % 64)
    return tuple(words)


def target_words(target: str) -> list[str]:
    """The tokens of a target string that may name features (after ``arch-bits-os``, or after
    ``host``)."""
    tokens = target.split("-")
    return tokens[1:] if tokens[0] == "host" else tokens[3:]


def features_of_word(release: Release, token: str) -> tuple[str, ...] | None:
    """The features a target string's token sets in ``release``'s vocabulary (none for the
    processor and vector width), or None where ``release`` knows no such token."""
    if token == "trace_all":
        return TRACE_ALL
    if token.startswith(("tune_", "vector_bits_")):
        return ()
    name = FEATURE_ALIASES.get(token, token)
    return (name,) if name in release.features else None


def target_features(release: Release, target: str) -> frozenset | None:
    """The features a target string (``x86-64-linux-avx2-no_runtime``, ``host-avx2``) names, in
    ``release``'s vocabulary; None where a token is neither a feature of ``release`` nor one of
    the other words target strings take (a feature of a newer release, or not a target
    string)."""
    features = set()
    for token in target_words(target):
        named = features_of_word(release, token)
        if named is None:
            return None
        features.update(named)
    return frozenset(features)
