"""The libraries the native library's entry points serve, each by the Halide release that built
it (native_stubs/calls/releases.c): the release table's facts (shim/base/releases.py) handed to
the native library as this module is imported, and each library registered as it is loaded."""

from __future__ import annotations

from shim.base.releases import CPU_FEATURES, DEFAULT, RELEASES, RUNTIME, Release
from shim.native import ffi, lib


def index(release: Release) -> int:
    """The release's number in the native library."""
    return RELEASES.index(release)


def _runtime_feature(name: str) -> int:
    """A feature's number in the numbering the native library's CPU detection answers in."""
    if name not in CPU_FEATURES:
        return lib.SHIM_FEATURE_NOT_CPU
    if name not in RUNTIME.features:
        return lib.SHIM_FEATURE_UNKNOWN
    return RUNTIME.features.index(name)


def _define_releases() -> None:
    for release in RELEASES:
        facts = ffi.new("struct shim_release_facts *")
        facts.scalar_lanes = release.scalar_lanes
        facts.profiler_abi = release.profiler_abi
        facts.trace_abi = release.trace_abi
        facts.vulkan_buffer_offsets = release.vulkan_buffer_offsets
        facts.volatile_feature_answers = release.volatile_feature_answers
        facts.feature_count = len(release.features)
        for i, name in enumerate(release.features):
            facts.runtime_feature[i] = _runtime_feature(name)
        lib.shim_release_define(index(release), facts)
    lib.shim_release_set_default(index(DEFAULT))


def mask_words(words) -> list:
    """A feature mask as the native library reads one: SHIM_FEATURE_WORDS words."""
    return list(words) + [0] * (lib.SHIM_FEATURE_WORDS - len(words))


# The ways of spelling a scalar type among the libraries registered (Release.scalar_lanes).
_type_spellings: set = set()


def register(address: int, release: Release, alternative: Release | None = None,
             masks: tuple = ()) -> None:
    """The library holding ``address`` is served by ``release``; where ``alternative`` numbers
    features otherwise, the first of the feature ``masks`` its dispatcher passes that only one
    of them lists settles which ((``release``'s masks, ``alternative``'s masks) per sub-target
    asked about)."""
    words = [word for pair in (0, 1) for mask in masks for word in mask_words(mask[pair])]
    result = lib.shim_library_register(
        address, index(release), -1 if alternative is None else index(alternative),
        len(masks) if alternative is not None else 0, ffi.new("uint64_t[]", words or [0]))
    if result != 0:
        raise RuntimeError(f"the native library could not register the library at {address:#x}")
    _type_spellings.add(release.scalar_lanes)


def types_spelled_several_ways() -> bool:
    """Whether libraries of releases that spell a buffer's type differently are loaded (a
    Buffer in calls of two of them at once fails one's type check)."""
    return len(_type_spellings) > 1


def release_at(address: int) -> Release:
    """The release the library holding ``address`` is served by now."""
    return RELEASES[lib.shim_library_release(address)]


def unsettled_alternative(address: int) -> Release | None:
    """The release the library holding ``address`` may yet turn out to be of, until its
    dispatcher's first question settles it; None once settled, or where there is none."""
    alternative = lib.shim_library_alternative(address)
    return None if alternative < 0 else RELEASES[alternative]


def cpu_can_use(release: Release, words) -> bool:
    """Whether this CPU runs code of ``words``' features (``release``'s numbering), as
    halide_can_use_target_features answers a library of ``release``."""
    return lib.shim_cpu_can_use(index(release), ffi.new("uint64_t[]", mask_words(words))) == 1


_define_releases()
