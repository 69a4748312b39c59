"""Binding a call's Python values to a pipeline's arguments: by position or by name; each
buffer made into a Buffer by its kind's adapter (shim/calls/arguments.py), omitted outputs
sized through the bounds query (shim/calls/output_sizes.py); scalars converted and range-checked. The result is a Call, the native form a run
needs, checked against the pipeline's bounds query before anything runs."""

from __future__ import annotations

from shim.base.errors import ArgumentError, BoundsError, HalideCodeError, SizeWarning, warn_caller
from shim.calls import output_sizes
from shim.native import ffi, lib
from shim.native.regions import dimension_label
from shim.buffers.buffer import Buffer
from shim.buffers.buffer_arguments import zeroed
from shim.calls.arguments import Call, PipelineFacts, buffer_for, dtype_of, output_of_shape
from shim.calls.metadata import USER_CONTEXT, Argument, check_extents
from shim.calls.scalars import MISSING, ScalarArgument


class Signature:
    """A pipeline's arguments, and the binding of values to them."""

    def __init__(self, name: str, target: str, all_arguments: list, device_kinds: frozenset):
        self.name, self.target, self.device_kinds = name, target, device_kinds
        self._pipeline = PipelineFacts(name, target, device_kinds)  # what the arguments' adapters see
        # In argv order, __user_context included where the pipeline takes it.
        self.all_arguments = all_arguments
        # The ones a caller gives.
        self.arguments = [a for a in all_arguments if a.name != USER_CONTEXT]
        self._by_name = {a.name: a for a in self.arguments}
        self._names = [a.name for a in self.arguments]
        self._scalars = {a.name: ScalarArgument(a) for a in self.arguments if not a.is_buffer}
        self._null_user_context = ffi.new("void **")  # what __user_context points to
        # Omitted outputs' sizes chosen before: {(the given buffers' boxes, the scalars'
        # values): (boxes, the SizeWarning's text or None)}.
        self._sized = {}

    def bind(self, args, kwargs) -> dict:
        """{argument name: value} of a call's positional and named values."""
        if len(args) > len(self.arguments):
            raise ArgumentError("args", f"{self.name} takes {len(self.arguments)} arguments "
                                        f"({self._signature()}), got {len(args)} positional")
        values = dict(zip(self._names, args))
        for key, value in kwargs.items():
            if key not in self._by_name:
                raise ArgumentError(key, f"unknown argument; {self.name} takes {self._signature()}")
            if key in values:
                raise ArgumentError(key, "given both by position and by name")
            values[key] = value
        return values

    def _signature(self) -> str:
        return ", ".join(self._names)

    def output_of_shape(self, name: str, value) -> Buffer:
        """The Buffer output ``name`` gets when given as the shape ``value``, as a call's
        marshalling makes it (for the fast path, native_stubs/fast/fastcall.c)."""
        return output_of_shape(self._by_name[name], value, self._pipeline)

    def marshal(self, values: dict, run_query) -> Call:
        """The native form of bound values (see Call); on failure, the device memory of the
        Buffers made so far is freed. ``run_query(argv)`` runs the pipeline's bounds query, which
        sizes omitted outputs."""
        call = Call()
        try:
            self._marshal_into(call, values, run_query)
        except BaseException:
            free_temporaries(call)
            raise
        return call

    def _marshal_into(self, call: Call, values: dict, run_query) -> None:
        argv = call.argv = ffi.new("void *[]", max(len(self.all_arguments), 1))
        # Omitted outputs: (index into argv, Argument, index into call.buffers, into
        # call.results), sized once every other argument is known, since the size that fits
        # depends on the inputs and the scalars.
        omitted = []
        for i, arg in enumerate(self.all_arguments):
            if arg.name == USER_CONTEXT:
                argv[i] = self._null_user_context
            elif arg.is_buffer:
                value = values.get(arg.name, MISSING)
                if value is MISSING and arg.is_output:
                    omitted.append((i, arg, len(call.buffers), len(call.results)))
                    call.buffers.append(None)
                    call.results.append(None)
                    continue
                if value is MISSING:
                    raise ArgumentError(arg.name, f"missing input; {self.name} takes "
                                                  f"{self._signature()}")
                buf = buffer_for(arg, value, call, self._pipeline)
                argv[i] = buf.raw
                call.buffers.append((i, arg, buf))
            else:
                scalar = self._scalars[arg.name].convert(values.get(arg.name, MISSING))
                argv[i] = scalar
                call.keep_alive.append(scalar)
        if omitted:
            boxes = self._size_omitted(call, [(i, arg) for i, arg, _, _ in omitted], run_query)
            for (i, arg, at, result_at), box in zip(omitted, boxes):
                buf = Buffer.over_array(zeroed(_numpy_shape(box), dtype_of(arg), arg.name), arg.name,
                                        exposed=False, mins=[lo for lo, _ in box])
                argv[i] = buf.raw
                call.buffers[at] = (i, arg, buf)
                call.results[result_at] = buf

    def _size_omitted(self, call: Call, omitted: list, run_query) -> list:
        """The boxes ((min, extent) per Halide dimension) of the outputs the caller left out
        (``omitted``: (index into argv, Argument) each), by shim/calls/output_sizes.py's rule:
        the largest the inputs cover, starting like the first input (the dimensions it lacks
        from the estimates), else the estimates where the inputs hold what they read (with a
        SizeWarning where there were inputs). Decided before anything is allocated, and
        remembered for the same inputs and scalars. When nothing fits, the bounds error of
        the guess like the first input says how the outputs were sized and how to pass a
        size."""
        key = _sizing_key(call, omitted)
        remembered = self._sized.get(key)
        if remembered is not None:
            boxes, warning = remembered
        else:
            boxes, warning = self._choose_sizes(call, omitted, run_query)
            if len(self._sized) >= _SIZED_KEPT:
                self._sized.clear()
            self._sized[key] = boxes, warning
        if warning is not None:
            warn_caller(warning, SizeWarning)
        return boxes

    def _choose_sizes(self, call: Call, omitted: list, run_query) -> tuple[list, str | None]:
        given = _given(call)
        known = {arg.name: buf.box for arg, buf in given if not arg.is_output}
        first = next(((arg.name, buf.box) for arg, buf in given if not arg.is_output), None)
        outputs = [arg for _, arg in omitted]
        guesses = size_guesses(outputs, first)
        like = dict(zip((a.name for a in outputs), guesses[0][1])) if first and guesses and \
            guesses[0][0].startswith("like") else None
        estimated = [_estimated_box(arg) for arg in outputs]
        estimated = None if None in estimated else dict(zip((a.name for a in outputs), estimated))

        def ask(boxes: dict) -> dict | None:
            try:
                asked, wanted = _query_with(call, omitted, [boxes[a.name] for a in outputs],
                                            run_query)
            except HalideCodeError:
                return None
            needed = {arg.name: box for arg, box in zip(outputs, asked)}
            needed.update((arg.name, box) for (arg, _), box in zip(given, wanted))
            return needed

        choice = output_sizes.choose(ask, known, like, estimated, first and first[0],
                                     hint="pass the output: its shape, a numpy array or a "
                                          "shim.Buffer")
        if choice is None:
            if not guesses:
                raise ArgumentError(outputs[0].name,
                                    "missing output: pass a shim.Buffer, a numpy array, or its "
                                    "shape (numpy order); the pipeline has no size estimates and "
                                    "no input buffer to size it like")
            failures = []
            for how, boxes in guesses:
                try:
                    return _fit(call, omitted, boxes, run_query, self.target), None
                except BoundsError as e:
                    failures.append((how, boxes, e))
            raise _sizing_error(omitted, failures)
        boxes = _fit(call, omitted, [choice.boxes[a.name] for a in outputs], run_query,
                     self.target)
        warning = None
        if choice.surprise is not None:
            sized = ", ".join(f"{a.name} {_numpy_shape(box)}" for a, box in zip(outputs, boxes))
            warning = (f"{self.name}: {sized}, {choice.surprise}; pass the output's shape to "
                       f"choose it")
        return boxes, warning

    def plan_entries(self) -> list[tuple]:
        """What the call plan knows of each argument (see native_stubs/fast/fastcall.c, plan_init)."""
        return [self._plan_entry(arg) for arg in self.all_arguments]

    def _plan_entry(self, arg: Argument) -> tuple:
        if arg.name == USER_CONTEXT:
            role, default = 3, None
        elif arg.is_buffer:
            role, default = (2 if arg.is_output else 1), None
        else:
            role, default = 0, self._scalars[arg.name].default_bytes()
        bounds = [None, None] if arg.is_buffer else [arg.min, arg.max]
        dtype = arg.type.dtype if arg.is_buffer else None  # (None too where numpy has none)
        return (arg.name, role, arg.type.code, arg.type.bits, arg.dimensions, *bounds, default,
                dtype)


# How many sizings a Signature remembers (a few shapes in a loop; not every shape ever seen).
_SIZED_KEPT = 64


def _sizing_key(call: Call, omitted: list) -> tuple:
    """What an omitted output's size depends on: the given buffers' boxes, the scalars'
    values (``call.keep_alive``: their C values), which outputs are omitted."""
    boxes = tuple((arg.name, buf.box) for arg, buf in _given(call))
    scalars = tuple(bytes(ffi.buffer(scalar)) for scalar in call.keep_alive)
    return boxes, scalars, tuple(i for i, _ in omitted)


def free_temporaries(call: Call) -> None:
    """Free the device memory of the Buffers the shim made for ``call``."""
    for temporary in call.temporaries:
        temporary.device_free()
    call.temporaries.clear()


def bounds_query(call: Call):
    """The argv of the bounds query for ``call``'s shapes and scalars, and what to check its
    answers with (``check_bounds``)."""
    query_argv = ffi.new("void *[]", list(call.argv))
    queries = []
    for i, arg, buf in call.buffers:
        if _queried_as_itself(arg):
            _typed_for(arg, buf.raw)
            continue
        raw, dims = _bounds_query_buffer(arg, buf.raw)
        query_argv[i] = raw
        queries.append((arg, buf, raw, dims))
    return query_argv, queries


def _queried_as_itself(arg: Argument) -> bool:
    """Whether a given buffer goes into the bounds query as itself rather than in the query's
    form (no memory): a 0-D input. It has no region for the query to report, and the query
    may read its value: an extern stage's scalar argument taken from it (``level[()]``) is
    evaluated as the extern stage is asked for its bounds, and Halide's generated code then
    loads from the buffer's host memory, which a query buffer has none of (a crash, under
    Halide's runtime as under the shim's, where the query had one)."""
    return arg.dimensions == 0 and not arg.is_output


def _typed_for(arg: Argument, raw):
    """A given buffer's struct, its type as ``arg``'s pipeline checks it (the run writes the
    same in native_stubs/fast/run.c), for a query it goes into as itself."""
    raw.type.lanes = arg.type_lanes
    return raw


def check_bounds(queries) -> None:
    """Refuse inputs smaller than what the bounds query says the pipeline reads, and outputs
    whose shape it constrains otherwise."""
    for arg, buf, raw, _dims in queries:
        for d in range(raw.dimensions):
            _check_region(arg, d, (raw.dim[d].min, raw.dim[d].extent), buf.box[d])


def _size_guesses(omitted: list, call: Call) -> list[tuple[str, list]]:
    """size_guesses for the ``omitted`` outputs of ``call`` (see Signature._size_omitted)."""
    first = next(((arg.name, buf.box) for arg, buf in _given(call) if not arg.is_output), None)
    return size_guesses([arg for _, arg in omitted], first)


def size_guesses(outputs: list, first_input: tuple | None) -> list[tuple[str, list]]:
    """(how, a box per output) for each way to size ``outputs`` (Arguments) that applies, in
    the order a call tries them: like ``first_input`` ((name, box) of the first input buffer,
    or None), dimensions it lacks from the estimates; then the pipeline's estimates. Shared by
    calls that leave outputs out and by shim.dask, which sizes a whole graph's output."""
    guesses = []
    estimated = [_estimated_box(arg) for arg in outputs]
    if first_input is not None:
        name, box = first_input
        like = [box[:output.dimensions] + (estimate or ())[len(box):]
                for output, estimate in zip(outputs, estimated)]
        if all(len(guess) == output.dimensions for guess, output in zip(like, outputs)):
            guesses.append((f"like the first input, {name}", like))
    if None not in estimated and (not guesses or estimated != guesses[0][1]):
        guesses.append(("from the pipeline's estimates", estimated))
    return guesses


def _estimated_box(arg: Argument) -> tuple | None:
    """An output's box from its estimates (a min not estimated is 0), or None without an
    extent for every dimension."""
    estimates = arg.buffer_estimates
    if not estimates or any(extent is None for _, extent in estimates):
        return None
    return tuple((lo or 0, extent) for lo, extent in estimates)


def _given(call: Call):
    """(Argument, Buffer) of each buffer argument the call has a Buffer for already."""
    return [(arg, buf) for _, arg, buf in filter(None, call.buffers)]


def _fit(call: Call, omitted: list, boxes: list, run_query, target: str) -> list:
    """``boxes`` for the ``omitted`` outputs, or those the bounds query asks for instead, once
    the query accepts every buffer of ``call`` with them; else the BoundsError."""
    for (_, arg), box in zip(omitted, boxes):
        check_extents(arg, _numpy_shape(box), target)
    asked, wanted = _query_with(call, omitted, boxes, run_query)
    if asked != boxes and all(extent > 0 for box in asked for _, extent in box):
        # An output of fixed size (or fixed mins): it gets what the pipeline asks for.
        boxes = asked
        for (_, arg), box in zip(omitted, boxes):
            check_extents(arg, _numpy_shape(box), target)
        asked, wanted = _query_with(call, omitted, boxes, run_query)
    for (_, arg), want, box in zip(omitted, asked, boxes):
        for d in range(arg.dimensions):
            _check_region(arg, d, want[d], box[d])
    for (arg, buf), want in zip(_given(call), wanted):
        for d in range(arg.dimensions):
            _check_region(arg, d, want[d], buf.box[d])
    return boxes


def _query_with(call: Call, omitted: list, boxes: list, run_query) -> tuple[list, list]:
    """The bounds query's answers (a box per buffer) for ``call`` with the ``omitted``
    outputs' ``boxes``, without allocating anything: (the omitted outputs' answers, those of
    the buffers the call has, in order)."""
    query_argv = ffi.new("void *[]", list(call.argv))
    keep = []
    for i, arg, buf in filter(None, call.buffers):
        if _queried_as_itself(arg):
            keep.append((_typed_for(arg, buf.raw), None))  # (its answer: no dimensions)
            continue
        keep.append(_bounds_query_buffer(arg, buf.raw))
        query_argv[i] = keep[-1][0]
    mine = []
    for (i, arg), box in zip(omitted, boxes):
        mine.append(box_query_buffer(arg, box))
        query_argv[i] = mine[-1][0]
    run_query(query_argv)
    return [query_answer(raw) for raw, _ in mine], [query_answer(raw) for raw, _ in keep]


def query_answer(raw) -> tuple:
    """(min, extent) per dimension of a bounds-query buffer after the query."""
    return tuple((raw.dim[d].min, raw.dim[d].extent) for d in range(raw.dimensions))


def box_query_buffer(arg: Argument, box):
    """A halide_buffer_t with no memory (Halide's bounds-query form) for ``arg`` over ``box``
    ((min, extent) per dimension, x first; empty: extents 0), densely strided; the query
    overwrites an input's with the region it reads. Returns (the struct, its dimensions),
    both to be kept alive while the query runs."""
    query = ffi.new("halide_buffer_t *")
    dims = ffi.new("halide_dimension_t[]", max(arg.dimensions, 1))
    stride = 1
    for d, (lo, extent) in enumerate(box):
        dims[d].min, dims[d].extent, dims[d].stride = lo, extent, stride
        stride *= max(extent, 1)
    arg.type_to_c(query.type)
    query.dimensions = arg.dimensions
    query.dim = dims
    return query, dims


def _shape_hint(dimensions: int) -> str:
    """A placeholder for a shape in numpy order, for messages."""
    names = {1: "(width,)", 2: "(height, width)", 3: "(channels, height, width)"}
    return names.get(dimensions, f"({dimensions} extents)")


def _numpy_shape(box) -> tuple:
    """The numpy shape of a box in Halide order."""
    return tuple(extent for _, extent in reversed(box))


def _sizing_error(omitted: list, failures: list) -> BoundsError:
    """The first guess's BoundsError, saying how the omitted outputs were sized, what the
    other guesses gave, and how to pass a size."""

    def sized(boxes):
        if len(omitted) == 1:
            return str(_numpy_shape(boxes[0]))
        return ", ".join(f"{arg.name} {_numpy_shape(box)}" for (_, arg), box in zip(omitted, boxes))

    how, boxes, first = failures[0]
    names = " and ".join(arg.name for _, arg in omitted)
    text = (f"{first.message.removeprefix(first.argument + ': ')}. {names} "
            f"{'was' if len(omitted) == 1 else 'were'} not given and sized {how}: {sized(boxes)}")
    for how, boxes, error in failures[1:]:
        text += f"; sized {how}, {sized(boxes)}: {error.message}"
    passes = ", ".join(f"{arg.name}={_shape_hint(arg.dimensions)}" for _, arg in omitted)
    return BoundsError(first.argument, first.code,
                       f"{text}. Pass the size: {passes} in numpy order (x last), or a numpy "
                       "array or shim.Buffer to write into")


def _bounds_query_buffer(arg: Argument, raw):
    """A copy of ``raw``'s shape with no memory, for ``arg``: Halide's bounds-query form."""
    query = ffi.new("halide_buffer_t *")
    dims = ffi.new("halide_dimension_t[]", max(raw.dimensions, 1))
    for d in range(raw.dimensions):
        dims[d] = raw.dim[d]
    query.type = raw.type
    query.type.lanes = arg.type_lanes
    query.dimensions = raw.dimensions
    query.dim = dims
    return query, dims


def _check_region(arg: Argument, d: int, want: tuple, have: tuple) -> None:
    (want_min, want_extent), (have_min, have_extent) = want, have
    wanted = f"[{want_min}, {want_min + want_extent})"
    covered = f"[{have_min}, {have_min + have_extent})"
    if arg.is_output:
        if want != have:
            raise BoundsError(arg.name, lib.halide_error_code_constraint_violated,
                              f"the pipeline writes {dimension_label(d, arg.dimensions)} over "
                              f"{wanted} but the output covers {covered}", region=(d, want, have))
    elif want_extent > 0 and (want_min < have_min or want_min + want_extent > have_min + have_extent):
        raise BoundsError(arg.name, lib.halide_error_code_access_out_of_bounds,
                          f"too small: the pipeline reads {dimension_label(d, arg.dimensions)} "
                          f"over {wanted} but the input covers {covered}", region=(d, want, have))
