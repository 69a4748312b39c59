"""The sizes ``python -m shim run`` chooses where the command line gives none, through the
pipeline's bounds query: outputs, and inputs whose extents are ``auto``
(run_values.DERIVED_EXTENTS).

An output without extents of its own (``OUTPUT=FILE:EXTENTS``) or from ``--output_extents``
is sized by the rule the Python API sizes an omitted output by (shim/calls/output_sizes.py):
the largest the inputs cover, starting like the first input (RunGen's first: the first by
name; the dimensions it lacks from the estimates, else RunGen's guesses: 1000 for x and y, 4 beyond), else the estimates (their mins
too: apps/harris's output starts at (3, 3)), with a warning where that is not what the first
input alone gives. Where the bounds query constrains an output (histogram's 256 bins), that
is its size. None covered: the first guess stays, and the call's bounds check reports what it
lacks (runner.py adds how the size was guessed). The shapes of RunGen's --verbose lines come
from here too: ``promised_inputs`` (its bounds_query_input_shapes) and ``shapes``.
"""

from __future__ import annotations

from shim.calls import output_sizes
from shim.calls.binding import box_query_buffer
from shim.base.errors import ArgumentError, HalideCodeError
from shim.calls.library import Library
from shim.calls.metadata import USER_CONTEXT
from shim.native import ffi
from shim.cli.rungen import Box
from shim.cli.run_values import estimated_box
from shim.calls.running import Runner
from shim.calls.scalars import ScalarArgument


class BoundsQuery:
    """The bounds query of one pipeline: ``ask_shapes(scalars, boxes)`` gives, for every
    buffer, the shape (RunGen's: (min, extent, stride) per dimension) the pipeline needs
    (inputs) or writes (outputs) with those scalars and output Boxes (an input of Box with
    extents 0 has no size yet, as RunGen asks)."""

    def __init__(self, pipeline):
        self._library = Library(pipeline.path, pipeline.name)
        self._runner = Runner(pipeline.name, self._library.argv_fn, pipeline.device_kinds)

    def ask_shapes(self, scalars: dict, boxes: dict) -> dict:
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
        return {name: tuple((raw.dim[d].min, raw.dim[d].extent, raw.dim[d].stride)
                            for d in range(raw.dimensions)) for name, raw in queried.items()}


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
        # (RunGen's first input: the first by name, as its std::map holds them)
        first = min(known, default=None)
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
            if choice.surprise is not None:
                self._warn(f"the outputs' size is {choice.surprise}; give --output_extents "
                           f"to choose it")
            return boxes, how
        label, guess = (f"like the first input, {first}", like) if like else \
            ("from its estimates", estimated)
        for a in missing:
            boxes[a.name], how[a.name] = guess[a.name], f"{label}, which the inputs do not cover"
        return boxes, how

    def derived_inputs(self, outputs: dict, inputs: dict, names) -> dict:
        """{input: Box} of the ``names`` inputs (extents ``auto``): what the bounds query says
        the pipeline reads of them to compute the ``outputs`` Boxes."""
        needed = self._ask(outputs, inputs)
        if needed is None:
            raise ArgumentError(names[0], "the bounds query found no size for it (extents "
                                          "'auto'): give its extents, or --output_extents")
        return {name: needed[name] for name in names}

    def dimensions(self, name: str) -> int:
        return next(a.dimensions for a in self._buffers if a.name == name)

    def promised_inputs(self, outputs: dict) -> dict | None:
        """RunGen's bounds_query_input_shapes: the shape ((min, extent, stride) per
        dimension) the bounds query asks of each input, none of them sized yet, for the
        ``outputs`` Boxes; None where the query fails."""
        inputs = {a.name: ((0, 0),) * a.dimensions for a in self._buffers if not a.is_output}
        shapes = self.shapes(outputs, inputs)
        return None if shapes is None else {name: shapes[name] for name in inputs}

    def shapes(self, outputs: dict, inputs: dict) -> dict | None:
        """RunGen's shapes ((min, extent, stride) per dimension) of every buffer the bounds
        query answers for these Boxes, or None where it fails."""
        boxes = {a.name: outputs[a.name] if a.is_output else inputs[a.name]
                 for a in self._buffers}
        try:
            shapes = self._query.ask_shapes(self._scalars, boxes)
        except HalideCodeError as e:
            self._log(f"the bounds query failed: {e}")
            return None
        if any(extent < 0 for shape in shapes.values() for _, extent, _ in shape):
            self._log("the bounds query overflowed Halide's 32-bit coordinates")
            return None
        return shapes

    def _ask(self, outputs: dict, inputs: dict) -> dict | None:
        """The bounds query's Boxes, or None where it fails for these sizes (an input without
        a Box has none yet, as RunGen asks)."""
        shapes = self.shapes(
            {a.name: outputs.get(a.name) or ((0, 0),) * a.dimensions for a in self._outputs},
            {a.name: inputs.get(a.name) or ((0, 0),) * a.dimensions
             for a in self._buffers if not a.is_output})
        if shapes is None:
            return None
        return {name: tuple((lo, extent) for lo, extent, _ in shape)
                for name, shape in shapes.items()}


def _like(box: Box, dimensions: int, estimated: Box | None) -> Box:
    """An output Box like an input's: its first dimensions, then the estimates', else
    RunGen's guesses (extent 1000 for x and y, 4 beyond)."""
    return tuple(box[d] if d < len(box) else estimated[d] if estimated else
                 (0, 1000 if d < 2 else 4) for d in range(dimensions))
