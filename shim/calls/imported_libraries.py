"""Halide libraries Python imports itself after the shim: the extension modules Halide
generates (``-e python_extension``). Their pipelines call the shim's runtime as any library's
do (the shim's native library comes first in the process's symbol scope), and must be served by
the release that built them too: taken for the default release (Halide 21), a Halide 22
extension built with its profiler would have its 11-argument halide_profiler_instance_start
read as Halide 21's 5.

shim.load registers the libraries it opens (shim/calls/library.py). These it never opens, so an
import hook does: each extension module, once Python has loaded it, is looked at for Halide
pipelines (NAME_argv and NAME_metadata exported), and a library that has some is registered by
the same evidence. The hook never fails an import: a library it cannot read is left to the
default release, as it would be without the hook. Extension modules imported before the shim
bound their runtime calls elsewhere (their own runtime, or none) and are not served anyway.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import sys

from shim.base.elf import dynamic_symbols, pipeline_names
from shim.calls import multitarget
from shim.calls.library import serve


class _RegisteringLoader(importlib.machinery.ExtensionFileLoader):
    """Python's loader of an extension module, which registers its Halide pipelines' library
    once it is loaded."""

    def create_module(self, spec):
        module = super().create_module(spec)
        register_extension(self.path)
        return module


class _ExtensionModules:
    """A finder on sys.meta_path (importlib.abc.MetaPathFinder's protocol; not its subclass, whose
    import costs the shim's start): what Python's path finder finds, an extension module with
    the loader above."""

    def find_spec(self, fullname, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or type(spec.loader) is not importlib.machinery.ExtensionFileLoader:
            return None  # (Python's own finders find it again, as without the hook)
        spec.loader = _RegisteringLoader(spec.loader.name, spec.loader.path)
        return spec


def register_extension(path: str) -> bool:
    """Register the library of Halide pipelines Python loaded from ``path``, if it holds any,
    with the release that built it; whether it did."""
    try:
        defined, _ = dynamic_symbols(path)
        names = pipeline_names(path, defined)
        if not names:
            return False
        handle = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        serve(path, handle, multitarget.entry_points(names)[0], names, defined)
        return True
    except Exception:  # (an import never fails for it: see the module's docstring)
        return False


def watch() -> None:
    """Register each Halide extension module imported from now on (once per process)."""
    if not any(isinstance(finder, _ExtensionModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ExtensionModules())
