"""Multitarget libraries: one pipeline compiled for several targets, behind a dispatcher.

Halide's ``compile_multitarget`` (a generator run with ``target=a,b,c``) exports, besides the
pipeline NAME (the dispatcher), one pipeline per target: NAME-<target string> until Halide 22,
which spells it as a C identifier, NAME_<target string with ___ for each ->
(shim/base/releases.py: Release.subtarget_separator). The dispatcher asks
halide_can_use_target_features about each target but the last, in order, and runs the first
this CPU can use, else the last. The dispatcher is the pipeline a user means; the others are
its sub-targets, each a pipeline of its own too (load one with ``name=``).
"""

from __future__ import annotations

from typing import NamedTuple

from shim.base.releases import CPU_FEATURES, RELEASES, Release, feature_words, target_features
from shim.native.libraries import cpu_can_use


class Subtarget(NamedTuple):
    """One of a multitarget library's pipelines: its exported ``name`` and its ``target``."""

    name: str
    target: str


def _target(suffix: str, separator: str) -> str | None:
    """The target string a sub-target's name ends with (after its dispatcher's name), or None
    where it is not one: targets start with an architecture, a bit width and an OS, or with
    ``host`` (generators name sub-targets by the target strings they were given)."""
    if separator == "-":
        if not suffix.startswith("-"):
            return None
        target = suffix[1:]
    else:
        if not suffix.startswith("_"):
            return None
        target = suffix[1:].replace(separator, "-")
    tokens = target.split("-")
    if not all(tokens) or (tokens[0] != "host" and (len(tokens) < 3 or not tokens[1].isdigit())):
        return None
    return target


def subtargets_of(dispatcher: str, names) -> list[Subtarget]:
    """The pipelines among ``names`` that are sub-targets of ``dispatcher``, in name order."""
    found = []
    for name in sorted(names):
        if name == dispatcher or not name.startswith(dispatcher):
            continue
        for separator in dict.fromkeys(r.subtarget_separator for r in RELEASES):
            target = _target(name[len(dispatcher):], separator)
            if target is not None:
                found.append(Subtarget(name, target))
                break
    return found


def dispatchers(names) -> dict[str, list[Subtarget]]:
    """{dispatcher: its sub-targets} of the pipelines ``names``, sub-targets of sub-targets
    left out."""
    found = {name: subtargets_of(name, names) for name in names}
    taken = {sub.name for subs in found.values() for sub in subs}
    return {name: subs for name, subs in found.items() if subs and name not in taken}


def entry_points(names) -> list[str]:
    """The pipelines of a library a user may mean: each dispatcher, and every pipeline that is
    no dispatcher's sub-target."""
    taken = {sub.name for subs in dispatchers(names).values() for sub in subs}
    return [name for name in sorted(names) if name not in taken]


def lacking(release: Release, subtarget: Subtarget) -> list[str] | None:
    """The features of ``subtarget``'s target this CPU lacks, as the shim answers a dispatcher
    of ``release`` (empty: it can run here); None where its name spells no target of that
    release."""
    features = target_features(release, subtarget.target)
    if features is None:
        return None
    return sorted(f for f in features & CPU_FEATURES
                  if not cpu_can_use(release, feature_words(release, [f])))
