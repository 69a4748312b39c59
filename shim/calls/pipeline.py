"""A loaded pipeline, called with Python values.

A call goes one of two ways. The fast path (native_stubs/fast/fastcall.c, the pipeline's CallPlan)
takes calls with shim.Buffers, numbers and, on the CPU, numpy arrays, whose shapes passed the
bounds query before, and runs them from C. It declines everything else before anything has
run, and the general path takes the call: binding and marshalling the values
(shim/calls/binding.py), the bounds query, then the run (shim/calls/running.py). Loading is
shim/calls/library.py's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Literal, Union, overload

import numpy as np

from shim.core import call_uses
from shim.profiling import halide_profiler
from shim.calls import pipeline_pickle
from shim.calls.binding import (Signature, bounds_query, box_query_buffer, check_bounds,
                          free_temporaries, query_answer)
from shim.buffers.buffer import Buffer
from shim.buffers.buffer_arguments import PHYSICAL_MEMORY
from shim.buffers.pipeline_result import PipelineResult
from shim.base.errors import ArgumentError
from shim.memory.families import FamilyLock
from shim.calls.extension import CONVENTIONS, ExtensionFunction
from shim.calls.library import Library
from shim.calls.metadata import USER_CONTEXT, Argument
from shim.native import CallPlan, ffi
from shim.calls.running import PreparedCall, Runner
from shim.calls import multitarget
from shim.calls.scalars import MISSING, ScalarArgument

# Target features that make a pipeline run code on a device.
DEVICE_FEATURES = {"opencl", "cuda", "metal", "vulkan", "d3d12compute", "webgpu"}

# What load() takes as the library's path (os.fsdecode's).
LibraryPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
# A region: (min, extent) per dimension, x first.
Box = Sequence[tuple[int, int]]


@overload
def load(path: LibraryPath, name: str | None = None, *,
         convention: Literal["numpy"] = "numpy") -> Pipeline: ...
@overload
def load(path: LibraryPath, name: str | None = None, *,
         convention: Literal["extension"]) -> ExtensionFunction: ...
@overload
def load(path: LibraryPath, name: str | None = None, *,
         convention: str) -> Pipeline | ExtensionFunction: ...


def load(path: LibraryPath, name: str | None = None, *,
         convention: str = "numpy") -> Pipeline | ExtensionFunction:
    """Load the Halide pipeline in the shared library at ``path``.

    Works for any AOT pipeline of Halide 19 or 21 (and 22, prepared: docs/releases.md), built
    with its runtime bundled or with the ``no_runtime`` feature, each served by the release
    that built it. ``name`` picks one pipeline when the library holds several; a multitarget
    library's dispatcher is found by itself (its sub-targets are ``Pipeline.subtargets``, each
    loadable by its name too).

    ``convention="numpy"`` (the default) gives a Pipeline: numpy's last axis is x whatever
    the array's memory order, as halide.Buffer(array) takes it. ``convention="extension"``
    gives a function called exactly as the Python extension Halide generates for the
    pipeline (``-e python_extension``): an F-contiguous array's axis 0 is x, outputs are
    written in place, the result is None, errors are the extension's (shim/calls/extension.py).
    """
    if convention not in CONVENTIONS:
        raise ArgumentError("convention", f"expected one of {', '.join(map(repr, CONVENTIONS))}, "
                                          f"got {convention!r}")
    pipeline = Pipeline(path, name)
    return pipeline if convention == "numpy" else ExtensionFunction(pipeline)


class Pipeline(CallPlan):
    """A loaded pipeline. Call it with arguments by position (metadata order) or by name.

    Inputs are numpy arrays, shim.Buffers or other CPU array-likes; scalars are Python numbers;
    outputs are shim.Buffers, numpy arrays (written in place) or shapes (allocated). Returns the
    output, or a tuple of outputs in metadata order. Releases the GIL while the pipeline runs.
    """

    def __init__(self, path: LibraryPath, name: str | None = None):
        if "_library" in self.__dict__:
            # The CallPlan (the fast path, the bounds cache) is made once, for the first
            # library: the Python side must not change to another.
            raise TypeError("a Pipeline is made once")
        self._library = Library(path, name)
        #: The path of the library it was loaded from.
        self.path: str = self._library.path
        #: Its name: the function the generator made, which the library exports.
        self.name: str = self._library.name
        #: The Halide target it was built for ("x86-64-linux-opencl").
        self.target: str = self._library.target
        #: The device APIs the pipeline's code uses (none: it computes on the CPU only).
        self.device_kinds = frozenset(f for f in self.target.split("-") if f in DEVICE_FEATURES)
        self._signature = Signature(self.name, self.target, self._library.arguments,
                                    self.device_kinds)
        #: The arguments a call gives, in the order of its positions: the generator's parameters.
        self.arguments: list[Argument] = self._signature.arguments
        #: Every argument in the order the pipeline's own function takes them, __user_context
        #: included where it takes one.
        self.argv_arguments: list[Argument] = self._signature.all_arguments
        self._runner = Runner(self.name, self._library.argv_fn, self.device_kinds,
                              self._library.release.profiler_abi
                              if halide_profiler.builds_profile(self.target) else None)
        # The fast path and the cache of argument shapes that passed the bounds query: CallPlan,
        # in C (native_stubs/fast/fastcall.c), whose __call__ is the Pipeline's.
        runner = self._runner
        super().__init__(self._library.argv_address, self._signature.plan_entries(),
                         runner.native_calls, runner.host_write, runner.backend_mask, np.ndarray,
                         Buffer, FamilyLock, runner.finish_fast, call_uses.end_call,
                         self._signature.output_of_shape, np.zeros, PHYSICAL_MEMORY,
                         PipelineResult)

    @property
    def release(self) -> str:
        """The Halide release that built the pipeline's library ("19", "21", "22"), which
        serves it: shim/calls/library_release.py says how it is told."""
        return self._library.release.name

    def release_description(self) -> str:
        """The release that built the pipeline, in words: ``Halide 21``, or where a
        multitarget dispatcher has yet to settle it, ``Halide 21 (or 19: ...)``."""
        release = self._library.release
        text = f"Halide {release.name}"
        if not release.verified:
            text += " (served as prepared from its source: none is released to verify with yet)"
        unsettled = self._library.release_unsettled
        if unsettled is not None:
            text += (f" (or {unsettled.name}, which number CPU features otherwise: its "
                     f"dispatcher's first question tells)")
        return text

    def subtarget_status(self) -> list[tuple[str, str, list[str] | None]]:
        """(name, target, the CPU features this CPU lacks for it: None where its name spells no
        target) of each sub-target."""
        release = self._library.release
        return [(sub.name, sub.target, multitarget.lacking(release, sub))
                for sub in self._library.subtargets]

    @property
    def subtargets(self) -> list[multitarget.Subtarget]:
        """A multitarget library's dispatcher: its sub-targets, (name, target) each, of which
        it runs the first this CPU can (by Halide's rule: in the order it was built with, the
        last whatever the CPU). Empty for any other pipeline."""
        return list(self._library.subtargets)

    @property
    def inputs(self) -> list[Argument]:
        return [a for a in self.arguments if not a.is_output]

    @property
    def outputs(self) -> list[Argument]:
        return [a for a in self.arguments if a.is_output]

    def __repr__(self) -> str:
        return f"<shim.Pipeline {self.name} target={self.target} from {self.path}>"

    # --- pickling (shim/calls/pipeline_pickle.py) ---------------------------------------------------

    def __reduce__(self):
        """A Pipeline pickles as its library's bytes as loaded (even if the file has since been
        deleted or rebuilt), their sha256 and its name; it unpickles, in any process, as the
        same pipeline: the one that process already has, else loaded from exactly those bytes."""
        return Pipeline._from_pickle, pipeline_pickle.state(self, self._library)

    @classmethod
    def _from_pickle(cls, digest: str, name: str, data: bytes) -> Pipeline:
        return pipeline_pickle.restore(digest, name, data, cls)

    # Calling a Pipeline (CallPlan's __call__) takes the fast path, which declines before
    # anything has run whatever it cannot take exactly as the general path would; then:
    def _call_in_python(self, *args, **kwargs):
        with self.prepare(*args, **kwargs) as call:
            return call()

    def prepare(self, *args: object, **kwargs: object) -> PreparedCall:
        """Marshal the arguments once and check them with the pipeline's bounds query; the
        returned PreparedCall runs the pipeline with them as often as it is called, for loops
        where the per-call argument handling would cost more than the pipeline."""
        call = self._signature.marshal(self._signature.bind(args, kwargs), self._runner.run_query)
        try:
            self._check_bounds(call)
        except BaseException:
            free_temporaries(call)
            raise
        return PreparedCall(self._runner, call)

    def run_structs(self, argv, structs: list, outputs: list) -> None:
        """Run the pipeline once on an argv made outside the shim's Buffers, with no check of
        the shim's: its buffers' halide_buffer_t structs (``structs``, host memory only;
        ``outputs`` among them are written) and scalars' C values, as Halide's generated
        Python extension makes them (shim/calls/extension.py, for pipelines whose generated
        code checks its arguments itself). Raises the pipeline's error as a call does."""
        self._runner.run_structs(argv, structs, outputs)

    def _check_bounds(self, call) -> None:
        """Run the pipeline's bounds query and refuse inputs that are too small and outputs
        whose shape the pipeline constrains otherwise, before the real call can fail halfway.
        Shapes and scalars that passed once are remembered (the plan's cache, which the fast
        path reads too)."""
        argv_address = int(ffi.cast("uintptr_t", call.argv))
        if self._known(argv_address):
            return
        query_argv, queries = bounds_query(call)
        self._runner.run_query(query_argv)
        check_bounds(queries)
        self._remember(argv_address)

    # --- the bounds query, as a question: what does computing these regions read? ---

    def required_regions(self, outputs: Mapping[str, Box], inputs: Mapping[str, Box] | None = None,
                         /, **scalars: object) -> dict[str, tuple[tuple[int, int], ...]]:
        """Ask the pipeline's bounds query which regions computing ``outputs`` takes:
        {buffer name: ((min, extent) per dimension, x first)} for every input buffer (the
        region it reads) and output (the region it writes: the one given, unless the pipeline
        pins it elsewhere). ``outputs``: {output name: box}, in Halide's coordinates.
        ``inputs``: {input name: box} of the whole inputs, which a boundary condition such as
        ``repeat_edge`` clamps its reads to (an input left out has no size yet). Scalars by
        name, defaults where omitted. Nothing is allocated and nothing runs but the query, so
        this costs microseconds whatever the size (shim.dask plans each chunk with it)."""
        inputs = inputs or {}
        keep, queried = [], {}
        argv = ffi.new("void *[]", max(len(self._library.arguments), 1))
        unknown = set(outputs) - {a.name for a in self.outputs}
        unknown |= set(inputs) - {a.name for a in self.inputs if a.is_buffer}
        unknown |= set(scalars) - {a.name for a in self.inputs if not a.is_buffer}
        if unknown:
            raise ArgumentError(sorted(unknown)[0], f"{self.name} has no such buffer (or scalar, "
                                                    f"for a keyword)")
        for i, arg in enumerate(self._library.arguments):
            if arg.name == USER_CONTEXT:
                argv[i] = _kept(keep, ffi.new("void **"))
            elif not arg.is_buffer:
                argv[i] = _kept(keep, ScalarArgument(arg).convert(scalars.get(arg.name, MISSING)))
            else:
                if arg.is_output and arg.name not in outputs:
                    raise ArgumentError(arg.name, "the output's box is missing: give one for "
                                                  "every output")
                given = outputs[arg.name] if arg.is_output else inputs.get(arg.name)
                box = () if given is None else _checked_box(arg, given)
                query, dims = box_query_buffer(arg, box)
                keep.append(dims)
                argv[i] = queried[arg.name] = _kept(keep, query)
        self._runner.run_query(argv)
        return {name: query_answer(raw) for name, raw in queried.items()}


def _kept(keep: list, pointer):
    keep.append(pointer)
    return pointer


def _checked_box(arg: Argument, box) -> tuple:
    try:
        box = tuple((int(lo), int(extent)) for lo, extent in box)
    except (TypeError, ValueError):
        raise ArgumentError(arg.name, f"expected a box, (min, extent) per dimension, x first; "
                                      f"got {box!r}") from None
    if len(box) != arg.dimensions or any(extent < 1 for _, extent in box):
        raise ArgumentError(arg.name, f"expected {arg.dimensions} (min, extent) pairs with "
                                      f"extents of at least 1, x first; got {box!r}")
    return box
