"""A pipeline's shared library: which pipeline in it, checked for this machine, opened so that
its runtime calls bind to the shim's, and its entry points.

A Halide AOT .so exports ``NAME_argv(void **args)`` and ``NAME_metadata()``. The metadata
gives each argument's name, kind, type and dimensionality; ``argv`` takes, in that order, a
``halide_buffer_t *`` for each buffer and a pointer to the value for each scalar.
"""

from __future__ import annotations

import ctypes
import functools
import os

from shim.base.elf import (ET_REL, NotELF, architecture, dynamic_symbols, exported_functions,
                           file_type, pipeline_names)
from shim.base.errors import ArgumentError, RuntimeOverrideWarning, warn_caller
from shim.calls import multitarget
from shim.calls.library_release import UnknownRelease, decide, runtime_prefix
from shim.calls.metadata import read_metadata
from shim.native import LIBRARY_PATH, ffi, lib, libraries


class Library:
    """The pipeline ``name`` (None: the only one, or a multitarget library's dispatcher) in the
    shared library at ``path``, opened: its ``argv`` entry point, its target, its arguments (in
    argv order, with __user_context where the pipeline takes it), the Halide ``release`` that
    built it (shim/calls/library_release.py) and, for a multitarget dispatcher, its
    ``subtargets``."""

    def __init__(self, path, name: str | None = None):
        try:
            self.path = os.fsdecode(path)
        except TypeError:
            raise ArgumentError("path", "expected the path of a pipeline's shared library (str, "
                                        f"bytes or os.PathLike), got {type(path).__name__}") from None
        self.name, names, defined = _choose_name(self.path, name)
        self.subtargets = multitarget.subtargets_of(self.name, names)
        self._handle = _open_library(self.path)  # (closing it would unload the code)
        # The file's bytes, read as it is loaded: what a pickled Pipeline carries
        # (shim/calls/pipeline_pickle.py). Read now rather than at the first pickle so that a file
        # deleted or rebuilt after loading still pickles the code this process runs.
        self.data = _read(self.path)
        self._digest: str | None = None
        self.argv_address, metadata = serve(self.path, self._handle, self.name, names, defined)
        self.argv_fn = ffi.cast("int (*)(void **)", self.argv_address)
        self.target, self.arguments = metadata.target, metadata.arguments

    @property
    def release(self):
        """The Halide release (shim/base/releases.py) the library is served by: the one the
        evidence showed at load, or, where it left Halide 19 or 21, the one its multitarget
        dispatcher's first question settled."""
        return libraries.release_at(self.argv_address)

    @property
    def release_unsettled(self):
        """The release the library may yet turn out to be of (Halide 19 for one taken for 21)
        until its dispatcher's first question settles it; None where nothing is open."""
        return libraries.unsettled_alternative(self.argv_address)

    @property
    def digest(self) -> str:
        """The sha256 of ``data`` (hex): what names the library in pickles. Computed at the
        first pickle, which most libraries never see. (Not a functools.cached_property: see
        HalideType.dtype in shim/base/types.py.)"""
        if self._digest is None:
            import hashlib  # (here: its 4 ms import is for the few libraries ever pickled)

            self._digest = hashlib.sha256(self.data).hexdigest()  # (two threads: the same value)
        return self._digest


def serve(path: str, handle, name: str, names: list, defined: dict):
    """The argv entry point's address and the metadata of the pipeline ``name`` of the library
    ``handle`` opened (at ``path``; its pipelines ``names``, the functions it defines
    ``defined``), the library registered with the Halide release that built it."""
    argv_address = _symbol_address(handle, name + "_argv")
    metadata_fn = ffi.cast("const struct halide_filter_metadata_t *(*)(void)",
                           _symbol_address(handle, name + "_metadata"))
    try:
        metadata = read_metadata(metadata_fn())
    except ValueError as e:
        raise ArgumentError("path", f"{path}: bad pipeline metadata: {e}") from None
    if metadata.name != name:
        raise ArgumentError("path", f"{path}: metadata names the pipeline {metadata.name!r}, "
                                    f"exported as {name!r}")
    try:
        decision = decide(metadata.scalar_lanes, metadata.target, defined,
                          multitarget.subtargets_of(name, names))
    except UnknownRelease as e:
        raise ArgumentError("path", f"{path} cannot be served: {e}") from None
    libraries.register(argv_address, *decision)
    return argv_address, metadata


def _open_library(path: str):
    try:
        # RTLD_NOW binds every halide_* reference now, to the shim's native library, which
        # shim.native loaded first into the global scope.
        library = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        hint = ""
        if "undefined symbol" in str(e):
            hint = (" (a no_runtime pipeline needs every runtime function it calls; this one "
                    "calls a function the shim does not provide)")
        raise ArgumentError("path", f"cannot load {path}: {e}{hint}") from None
    lib.shim_msan_libraries_changed()  # (it may define its own msan hooks: HONOURED_DEFINITIONS)
    return library


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ArgumentError("path", f"cannot read {path}: {e}") from None


def _choose_name(path: str, name: str | None) -> tuple[str, list, dict]:
    """The name of the pipeline to use in the library at ``path``, which must be a Halide
    pipeline for the machine this process runs on, served by the shim's runtime; with the
    names of all its pipelines and the functions it defines."""
    if not os.path.isfile(path):
        raise ArgumentError("path", f"no such file: {path}")
    try:
        _check_architecture(path)
        if file_type(path) == ET_REL:
            stem = os.path.splitext(os.path.basename(path))[0]
            raise ArgumentError("path", f"{path} is an object file, not a shared library: link "
                                        f"it into one first (cc -shared -o {stem}.so "
                                        f"{os.path.basename(path)} -lpthread -ldl)")
        symbols, needed = dynamic_symbols(path)
        names = pipeline_names(path, symbols)
    except NotELF as e:
        if _is_archive(path):
            stem = os.path.splitext(os.path.basename(path))[0]
            raise ArgumentError("path", f"{path} is a static library, not a shared one: link it "
                                        f"into one first (cc -shared -o {stem}.so "
                                        f"-Wl,--whole-archive {os.path.basename(path)} "
                                        f"-Wl,--no-whole-archive -lpthread -ldl)") from None
        raise ArgumentError("path", f"{path} is not a Halide pipeline: {e}") from None
    except OSError as e:
        raise ArgumentError("path", f"cannot read {path}: {e}") from None
    if not names:
        raise ArgumentError("path", f"{path} is not a Halide pipeline: it exports no "
                                    "NAME_argv / NAME_metadata pair")
    prefix = runtime_prefix(symbols, needed, _shim_runtime_functions())
    if prefix is not None:
        raise ArgumentError("path", f"{path} was built with Halide's runtime prefixes: its code "
                                    f"calls its runtime as {prefix}..., not halide_..., so the "
                                    "shim cannot serve it (and with a runtime of its own it "
                                    "would abort the process on any error); build it without "
                                    "runtime_prefixes")
    _warn_of_own_runtime_functions(path, symbols)
    if name is None:
        entry_points = multitarget.entry_points(names)
        if len(entry_points) > 1:
            raise ArgumentError("name", f"{path} holds several pipelines "
                                        f"({', '.join(entry_points)}); choose one with name=")
        return entry_points[0], names, symbols
    if name not in names:
        raise ArgumentError("name", f"{path} has no pipeline {name!r}; it has {', '.join(names)}")
    return name, names, symbols


# The runtime functions whose definition in a library the shim calls for that library's code:
# the msan hooks (native_stubs/calls/msan.c), as Halide's msan test defines them.
HONOURED_DEFINITIONS = frozenset({"halide_msan_annotate_memory_is_initialized",
                                  "halide_msan_check_memory_is_initialized"})


def _warn_of_own_runtime_functions(path: str, symbols: dict) -> None:
    """A library that defines a runtime function itself (strongly, where Halide's runtime is
    weak), such as halide_acquire_cl_context to hand Halide its own OpenCL context, expects
    Halide to call it: under the shim, the shim's definition is the one every pipeline calls
    (its library is loaded first, with RTLD_GLOBAL), except for HONOURED_DEFINITIONS. Said once
    per library, not silently."""
    own = sorted(name for name, strong in symbols.items()
                 if strong and name.startswith("halide_") and name in _shim_runtime_functions()
                 and name not in HONOURED_DEFINITIONS)
    if own:
        warn_caller(f"{path} defines its own {', '.join(own)}: the shim's runtime replaces "
                    f"{'them' if len(own) > 1 else 'it'} (what the pipeline calls is the "
                    f"shim's; Halide's halide_set_* hooks are the way to change what it does: "
                    f"docs/internals.md)", RuntimeOverrideWarning)


@functools.cache
def _shim_runtime_functions() -> frozenset:
    return frozenset(exported_functions(LIBRARY_PATH))


def _is_archive(path: str) -> bool:
    """Whether the file is an ar archive (Halide's ``-e static_library``)."""
    with open(path, "rb") as f:
        return f.read(8) == b"!<arch>\n"


def _check_architecture(path: str) -> None:
    """dlopen skips a library built for another machine as if it were not there ("No such
    file or directory"): say what is wrong instead. This process runs the code the shim's own
    native library holds."""
    theirs, ours = architecture(path), _host_architecture()
    if theirs != ours:
        raise ArgumentError("path", f"{path} holds {theirs} code; this process runs {ours} code: "
                                    "build the pipeline for this machine")


@functools.cache
def _host_architecture() -> str:
    return architecture(LIBRARY_PATH)


def _symbol_address(library, symbol: str) -> int:
    return ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value
