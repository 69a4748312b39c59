"""The sizes ``python -m shim run`` chooses where the command line gives none, through the
pipeline's bounds query: outputs, and inputs whose extents are ``auto``
(run_values.DERIVED_EXTENTS).

An output without extents of its own (``OUTPUT=FILE:EXTENTS``) or from ``--output_extents``
is sized by the rule the Python API sizes an omitted output by (shim/calls/output_sizes.py):
the largest the inputs cover, starting like the first input (the dimensions it lacks from the
estimates, else RunGen's guesses: 1000 for x and y, 4 beyond), else the estimates (their mins
too: apps/harris's output starts at (3, 3)), with a warning where that is not what the first
input alone gives. Where the bounds query constrains an output (histogram's 256 bins), that
is its size. None covered: the first guess stays, and the call's bounds check reports what it
lacks (runner.py adds how the size was guessed).
"""

from __future__ import annotations

from shim.calls import output_sizes
from shim.calls.binding import box_query_buffer, query_answer
from shim.base.errors import ArgumentError, HalideCodeError
from shim.calls.library import Library
from shim.calls.metadata import USER_CONTEXT
from shim.native import ffi
from shim.cli.run_values import Box, describe_box, estimated_box
from shim.calls.running import Runner
from shim.calls.scalars import ScalarArgument


class BoundsQuery:
    """The bounds query of one pipeline: ``ask(scalars, boxes)`` gives, for every buffer, the
    Box the pipeline needs (inputs) or writes (outputs) with those scalars and output Boxes
    (an input of Box with extents 0 has no size yet, as RunGen asks)."""

    def __init__(self, pipeline):
        self._library = Library(pipeline.path, pipeline.name)
        self._runner = Runner(pipeline.name, self._library.argv_fn, pipeline.device_kinds)

    def ask(self, scalars: dict, boxes: dict) -> dict:
        arguments = self._library.arguments
        argv = ffi.new("void *[]", max(len(arguments), 1))
        keep = []
        queried = {}
        for i, arg in enumerate(arguments):
            if arg.name == USER_CONTEXT:
                argv[i] = keep_pointer(keep, ffi.new("void **"))
            elif arg.is_buffer:
                query, dims = box_query_buffer(arg, boxes[arg.name])
                keep.append(dims)
                argv[i] = queried[arg.name] = keep_pointer(keep, query)
            else:
                argv[i] = keep_pointer(keep, ScalarArgument(arg).convert(scalars[arg.name]))
        self._runner.run_query(argv)
        return {name: query_answer(raw) for name, raw in queried.items()}


def keep_pointer(keep: list, pointer):
    keep.append(pointer)
    return pointer


class Sizer:
    """Sizes a pipeline's outputs and its ``auto`` inputs (see the module's docstring)."""

    def __init__(self, pipeline, scalars: dict, log, warn):
        self._query = BoundsQuery(pipeline)
        self._inputs = pipeline.inputs
        self._buffers = [a for a in pipeline.arguments if a.is_buffer]
        self._outputs = pipeline.outputs
        self._scalars = scalars
        self._log, self._warn = log, warn

    def outputs(self, given: dict, inputs: dict) -> tuple[dict, dict]:
        """({output: Box}, {output: how its size was chosen}) for every output: ``given``
        ones as they are, the others guessed from the Boxes of the inputs that have one
        (``inputs``: {name: Box or None})."""
        boxes, how = dict(given), {name: "given" for name in given}
        missing = [a for a in self._outputs if a.name not in given]
        if not missing:
            return boxes, how
        known = {name: box for name, box in inputs.items() if box is not None}
        first = next((a.name for a in self._inputs if a.is_buffer and a.name in known), None)
        estimated = {a.name: estimated_box(a) for a in missing}
        like = None if first is None else {
            a.name: _like(known[first], a.dimensions, estimated[a.name]) for a in missing}
        if None in estimated.values():  # (a 0-D output's is ())
            estimated = None
        if like is None and estimated is None:
            raise ArgumentError(missing[0].name, "cannot tell its size: the pipeline has no "
                                                 "estimates for it and there is no input to "
                                                 "size it like; give --output_extents=[W,H,...] "
                                                 f"or {missing[0].name}=FILE:[W,H,...]")
        choice = output_sizes.choose(lambda trial: self._ask(boxes | trial, inputs), known,
                                     like, estimated, first,
                                     hint="give --output_extents=[W,H,...]")
        if choice is not None:
            for a in missing:
                boxes[a.name], how[a.name] = choice.boxes[a.name], choice.how
                self._log(f"output {a.name} is sized {choice.how}: "
                          f"{describe_box(choice.boxes[a.name])}")
            if choice.surprise is not None:
                self._warn(f"the outputs' size is {choice.surprise}; give --output_extents "
                           f"to choose it")
            return boxes, how
        label, guess = (f"like the first input, {first}", like) if like else \
            ("from its estimates", estimated)
        for a in missing:
            boxes[a.name], how[a.name] = guess[a.name], label
            self._log(f"output {a.name} is sized {label}: {describe_box(guess[a.name])}, which "
                      f"the inputs do not cover")
        return boxes, how

    def derived_inputs(self, outputs: dict, inputs: dict, names) -> dict:
        """{input: Box} of the ``names`` inputs (extents ``auto``): what the bounds query says
        the pipeline reads of them to compute the ``outputs`` Boxes."""
        needed = self._ask(outputs, inputs)
        if needed is None:
            raise ArgumentError(names[0], "the bounds query found no size for it (extents "
                                          "'auto'): give its extents, or --output_extents")
        for name in names:
            self._log(f"input {name} is sized by the bounds query: {describe_box(needed[name])}")
        return {name: needed[name] for name in names}

    def _ask(self, outputs: dict, inputs: dict) -> dict | None:
        """The bounds query's Boxes, or None where it fails for these sizes."""
        boxes = {}
        for a in self._buffers:
            box = outputs.get(a.name) if a.is_output else inputs.get(a.name)
            boxes[a.name] = box if box is not None else ((0, 0),) * a.dimensions
        try:
            needed = self._query.ask(self._scalars, boxes)
        except HalideCodeError as e:  # (a bad scalar is the caller's error, raised as it is)
            self._log(f"the bounds query failed: {e}")
            return None
        # Near 2^31 its 32-bit arithmetic overflows (rounding up to whole vectors): no answer.
        if any(extent < 0 for box in needed.values() for _, extent in box):
            self._log("the bounds query overflowed Halide's 32-bit coordinates")
            return None
        return needed


def _like(box: Box, dimensions: int, estimated: Box | None) -> Box:
    """An output Box like an input's: its first dimensions, then the estimates', else
    RunGen's guesses (extent 1000 for x and y, 4 beyond)."""
    return tuple(box[d] if d < len(box) else estimated[d] if estimated else
                 (0, 1000 if d < 2 else 4) for d in range(dimensions))
