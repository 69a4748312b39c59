"""The size of outputs a caller leaves out, decided through the pipeline's bounds query: one
rule for the Python API (shim/calls/binding.py), ``python -m shim run`` (shim/cli/run_sizes.py)
and ``shim.dask``.

1. **What the inputs cover**: the largest output, starting from one like the first input
   (its mins and extents; the caller fills the dimensions it lacks), whose reads the given
   inputs hold. Its mins move up past what the pipeline reads below the inputs' mins, then
   each dimension's extent is the largest the inputs cover, found by bisection (the bounds
   query costs microseconds). So an elementwise pipeline gives the input's shape, a 3x3
   stencil of a W x H image W-2 x H-2, a 2x downsample W/2 x H/2 (the same for 3000x3000 as
   for 64x64: the estimates never override what the inputs say). A dimension the inputs do
   not bound (boundary conditions that clamp, an output wider than any input) keeps the first
   input's extent.
2. **The estimates**, only where the inputs they need are there: what a pipeline without
   buffer inputs is sized by. Where there were inputs, the size did not come from them, and
   the caller is told (``Choice.surprise``: a SizeWarning, a log line), as where an input
   other than the first makes the output smaller than the first alone would (inputs of
   different shapes given to an elementwise pipeline).
3. Nothing covered: no choice; the caller reports what each guess lacked.

Where the bounds query answers another region for an output than the one asked, the output
gets that region only where the pipeline pins it: its mins (an output that starts at 2), or the
whole region, the same whatever is asked (histogram's 256 bins), as in RunGen. A region that moves with what is asked without being it is refused
(``choose`` raises ArgumentError naming the output): local_laplacian's schedule splits rows by
64, shifting a short last tile inward, so for a 16-row image it computes rows -48 to 15; an
output sized so would hold 64 rows starting at y = -48, which is nobody's idea of "like the
input". The caller is asked for the size instead (``hint`` says how).

A box is ((min, extent), ...) x first. ``ask(boxes)`` runs the bounds query with ``boxes``
({output name: box}) for the omitted outputs and answers {buffer name: box}: what each input
is read over and each output written over; None where the query fails."""

from __future__ import annotations

import math
from typing import NamedTuple

from shim.base.errors import ArgumentError
from shim.base.types import INT32_MAX
from shim.native.regions import DIMENSION_NAMES

# How far beyond the first input's extent an output may grow (an upsampling pipeline): a
# dimension still covered this far out is one the inputs do not bound.
_GROWTH = 64


class Choice(NamedTuple):
    boxes: dict  # {output name: box}
    how: str  # for messages: "like the first input, NAME", ...
    # Where the size is not what the first input alone would give, why (for a SizeWarning or
    # a log line): sized by the estimates although there were inputs, or smaller than the
    # first input allows because another input holds less (mismatched inputs, most often).
    surprise: str | None = None


class _Unpinned(Exception):
    """The pipeline computes an output over a region that follows what is asked without being
    it (see the module's docstring)."""

    def __init__(self, name: str, asked: tuple, answered: tuple):
        super().__init__(name)
        self.name, self.asked, self.answered = name, asked, answered


def choose(ask, known: dict, like: dict | None, estimated: dict | None,
           first: str | None, hint: str = "pass its shape") -> Choice | None:
    """The outputs' boxes by the module's rule. ``known``: {input name: box} of the inputs
    given; ``like``: {output name: box} like the first input (``first``), or None without
    one; ``estimated``: {output name: box} from the estimates, or None where they lack one.
    ``hint``: how the caller passes an output's size, for the refusal."""
    try:
        return _choose(_answering(ask), known, like, estimated, first)
    except _Unpinned as e:
        shape = tuple(n for _, n in reversed(e.answered))
        raise ArgumentError(e.name, f"not given, and no output like the first input fits: "
                                    f"asked for {describe_region(e.asked)}, the pipeline "
                                    f"computes {describe_region(e.answered)} (its schedule's "
                                    f"tiles may be larger than the input); {hint}, such as "
                                    f"{shape} in numpy order") from None


def describe_region(box) -> str:
    """``x 0..15, y -48..15`` for ((0, 16), (-48, 64))."""
    return ", ".join(f"{DIMENSION_NAMES[d] if d < len(DIMENSION_NAMES) else f'dim{d}'} "
                     f"{lo}..{lo + n - 1}" for d, (lo, n) in enumerate(box))


def _choose(ask, known: dict, like: dict | None, estimated: dict | None,
            first: str | None) -> Choice | None:
    if like is not None:
        boxes = _largest_covered(ask, like, known)
        if boxes is not None:
            how = (f"like the first input, {first}" if boxes == like else
                   f"as large as the inputs cover (the first, {first}, less what the pipeline "
                   f"reads around it)")
            surprise = None
            if len(known) > 1 and _largest_covered(ask, like, {first: known[first]}) != boxes:
                others = ", ".join(name for name in known if name != first)
                surprise = (f"smaller than the first input, {first}, allows: {others} "
                            f"cover{'s' if len(known) == 2 else ''} less")
            return Choice(boxes, how, surprise)
    if estimated is not None:
        needed = ask(estimated)
        if needed is not None and covered(needed, known):
            surprise = ("sized from the pipeline's estimates, not from the inputs, which "
                        "cover no output like the first input") if known else None
            return Choice(_answered(ask, needed, estimated), "from the pipeline's estimates",
                          surprise)
    return None


def covered(needed: dict, known: dict, dimension: int | None = None) -> bool:
    """Whether each known input holds what ``needed`` says is read of it (in ``dimension``
    only, or in all)."""
    for name, have in known.items():
        for d, ((want_lo, want_n), (have_lo, have_n)) in enumerate(zip(needed[name], have)):
            if dimension is not None and d != dimension:
                continue
            if want_n > 0 and (want_lo < have_lo or want_lo + want_n > have_lo + have_n):
                return False
    return True


def _answering(ask):
    """``ask``, answering None where the query's 32-bit arithmetic overflowed (near 2^31 it
    rounds extents up past the limit: negative extents)."""
    def checked(boxes):
        try:
            needed = ask(boxes)
        except OverflowError:  # (a box beyond 32 bits: no answer, as for the query's own)
            return None
        if needed is None or any(extent < 0 for box in needed.values() for _, extent in box):
            return None
        return needed
    return checked


def _answered(ask, needed: dict, boxes: dict) -> dict:
    """``boxes``, each replaced by the region the query answered for it (``needed``) where the
    pipeline pins it: the mins alone, the extents being those asked (``dim(0).set_min(2)``),
    or the whole region, answered the same when asked for one more element in every dimension
    (histogram's 256 bins). _Unpinned where the answer is another region that moves with what
    is asked (tiles shifted inward)."""
    result = {}
    for name, box in boxes.items():
        answer = tuple(needed[name])
        if answer == tuple(box) or not all(n > 0 for _, n in answer):
            result[name] = box
            continue
        if [n for _, n in answer] != [n for _, n in box]:
            again = ask({**boxes, name: tuple((lo, n + 1) for lo, n in box)})
            if again is None or tuple(again[name]) != answer:
                raise _Unpinned(name, tuple(box), answer)
        result[name] = answer
    return result


def _largest_covered(ask, like: dict, known: dict) -> dict | None:
    needed = ask(like)
    if needed is None:
        return None
    boxes = {name: list(box) for name, box in like.items()}
    dimensions = max((len(box) for box in boxes.values()), default=0)
    # Mins: up by what the pipeline reads below the inputs' mins.
    for d in range(dimensions):
        below = max((have[d][0] - needed[name][d][0] for name, have in known.items()
                     if d < len(have) and needed[name][d][1] > 0), default=0)
        for box in boxes.values():
            if d < len(box) and below > 0:
                box[d] = (box[d][0] + below, box[d][1])
    for d in range(dimensions):
        start = max(box[d][1] for box in boxes.values() if d < len(box))

        def covered_at(extent: int) -> bool:
            trial = {name: tuple((lo, extent) if i == d else (lo, n)
                                 for i, (lo, n) in enumerate(box))
                     for name, box in boxes.items()}
            answer = ask(trial)
            return answer is not None and covered(answer, known, d)

        # No trial beyond what a halide_buffer_t's 32-bit extents and strides hold.
        others = max((math.prod(max(n, 1) for i, (_, n) in enumerate(box) if i != d)
                      for box in boxes.values()), default=1)
        cap = min(start * _GROWTH, INT32_MAX // others)
        if cap > start and covered_at(cap):
            extent = start  # not bounded by the inputs (as far as can be asked): the first's
        elif covered_at(min(start, cap)):
            extent = min(start, cap)
            if cap > start:  # covered at start, not at cap: the largest in between
                lo, hi = start, cap
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if covered_at(mid) else (lo, mid)
                extent = lo
        elif not covered_at(1):
            return None
        else:
            lo, hi = 1, min(start, cap)  # covered at lo, not at hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if covered_at(mid) else (lo, mid)
            extent = lo
        for box in boxes.values():
            if d < len(box):
                box[d] = (box[d][0], extent)
    result = {name: tuple(box) for name, box in boxes.items()}
    needed = ask(result)
    if needed is None or not covered(needed, known):
        return None
    return _answered(ask, needed, result)
