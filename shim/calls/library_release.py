"""Which Halide release built a library, from what the library shows.

No field of a Halide library names its release; what differs between releases
(shim/base/releases.py) is the evidence, weighed in this order:
- the third field of its argument types (halide_type_t's ``lanes``, 1, until Halide 22 made it
  ``reserved``, 0): Halide 22 or not;
- the target string of its metadata, and those its multitarget sub-targets' names spell: a
  release that does not know one of their features did not build it (a library naming features
  no served release knows is refused: a newer Halide built it, or its metadata is damaged);
- the runtime it carries, if it was built with one: Halide 21 made halide_get_cpu_features a C
  function, where Halide 19's is C++;
- where Halide 19 and 21 are both left, they differ only in the numbering of features, which
  only a multitarget dispatcher passes, asking halide_can_use_target_features about its
  sub-targets: the library is taken for the default (21), with 19 as the alternative its
  dispatcher's first question settles (the feature masks of its sub-targets in each numbering
  are known from their names).
A library built with Halide 22's runtime prefixes calls its runtime functions by other names than
halide_*, which the shim cannot serve: it is refused, never run on a runtime of its own unseen.
"""

from __future__ import annotations

from typing import NamedTuple

from shim.base.releases import (DEFAULT, RELEASES, Release, feature_words, features_of_word,
                                target_features, target_words)
from shim.calls.multitarget import Subtarget

# Runtime functions a release's runtime defines that tell the served releases apart, where a
# library carries one (built without no_runtime): Halide 19's CPU detection is C++, 21's and
# 22's a C function (PR 8573).
_RUNTIME_MARKS = {
    "19": frozenset({"_ZN6Halide7Runtime8Internal23halide_get_cpu_featuresEv"}),
    "21": frozenset({"halide_get_cpu_features"}),
    "22": frozenset({"halide_get_cpu_features"}),
}
_ALL_MARKS = frozenset().union(*_RUNTIME_MARKS.values())


class Decision(NamedTuple):
    """The release a library is served by, and where the evidence leaves another that numbers
    features otherwise, that ``alternative`` and the feature ``masks`` that settle it: per
    sub-target, (its mask in ``release``'s numbering, in ``alternative``'s)."""

    release: Release
    alternative: Release | None = None
    masks: tuple = ()


class UnknownRelease(ValueError):
    """The library shows no release the shim serves (its message says what)."""


def decide(scalar_lanes: frozenset, target: str, defined: dict, subtargets: list[Subtarget]) -> Decision:
    """The release that built a library whose argument types carry ``scalar_lanes`` in their
    third field, whose metadata names ``target``, which defines the functions ``defined`` and
    has the multitarget ``subtargets``."""
    candidates = [r for r in RELEASES if {r.scalar_lanes} == set(scalar_lanes)]
    if not candidates:
        raise UnknownRelease(f"its argument types carry {sorted(scalar_lanes)} in halide_type_t's "
                             "third field, which no Halide release the shim serves writes")
    targets = [target] + [sub.target for sub in subtargets]
    known = [r for r in candidates if all(target_features(r, t) is not None for t in targets)]
    if not known:
        newest = candidates[-1]
        unknown = sorted({token for t in targets for token in target_words(t)
                          if features_of_word(newest, token) is None})
        raise UnknownRelease(f"its target{'s' if len(targets) > 1 else ''} name "
                             f"{', '.join(unknown) or 'words'} that Halide {newest.name} does not "
                             f"know: built by a newer Halide than the shim serves (it serves "
                             f"{', '.join(r.name for r in RELEASES)})")
    marks = _ALL_MARKS.intersection(defined)
    if marks:
        known = [r for r in known if marks <= _RUNTIME_MARKS[r.name]] or known
    release = DEFAULT if DEFAULT in known else known[-1]
    others = [r for r in known if r is not release and r.features != release.features]
    if not others:
        return Decision(release)
    alternative = others[0]
    masks = tuple((feature_words(release, target_features(release, sub.target)),
                   feature_words(alternative, target_features(alternative, sub.target)))
                  for sub in subtargets)
    return Decision(release, alternative, masks) if masks else Decision(release)


def runtime_prefix(defined: dict, needed: frozenset, runtime_functions: frozenset) -> str | None:
    """The prefix a library's runtime functions carry instead of ``halide_`` (Halide 22's
    runtime_prefixes), or None: several functions it defines or needs are runtime functions
    (``runtime_functions``: the shim's, all halide_*) under another prefix, and none under
    ``halide_``. Only distinctive names count (with an underscore: do_par_for, error_bad_type),
    never a C library's (malloc, free)."""
    suffixes = {name[len("halide_"):] for name in runtime_functions}
    suffixes = {s for s in suffixes if "_" in s}
    longest = max(map(len, suffixes), default=0)
    found: dict[str, set] = {}
    for name in set(defined) | set(needed):
        if name.startswith("halide_"):
            if name[len("halide_"):] in suffixes:
                return None
            continue
        # (Only the ends a suffix can be: every end of a name of a million characters, from
        # a damaged file, would take hours to try.)
        for at in range(max(1, len(name) - longest), len(name)):
            if name[at:] in suffixes:
                found.setdefault(name[:at], set()).add(name[at:])
    prefixes = [prefix for prefix, hits in found.items() if len(hits) >= 2]
    return min(prefixes, key=len) if prefixes else None
