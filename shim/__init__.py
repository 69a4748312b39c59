"""halide-shim: a drop-in runtime for ahead-of-time compiled Halide pipelines.

Importing shim loads its native runtime library into the global symbol scope first, so every
pipeline loaded afterwards calls the shim's halide_* functions instead of Halide's own.
"""

import os

from shim import native  # noqa: F401  (must come first: see shim/native/__init__.py)
from shim._version import __version__  # noqa: F401  (its one source, which setup.cfg reads)
from shim.core import callbacks  # noqa: F401  (registers the device layer's callbacks)
from shim.core import shutdown  # noqa: F401  (an orderly exit)
from shim.memory import families
from shim.native import interrupts
from shim.core.allocation_reuse import (
    can_reuse_device_allocations,
    release_unused_device_allocations,
    reuse_device_allocations,
)
from shim.buffers.buffer import Buffer, Dimension
from shim.backends.devices import default_device, device, devices
from shim.interop.dlpack import from_dlpack
from shim.base.errors import (
    ArgumentError,
    ArgumentTypeError,
    BoundsError,
    BuildError,
    CoordinateError,
    DeviceError,
    DeviceUnavailable,
    DirtyBufferWarning,
    ElementValueError,
    LayoutWarning,
    PipelineError,
    RuntimeOverrideWarning,
    ShimError,
    SizeWarning,
    UnsafeCacheWarning,
)
from shim.calls import imported_libraries
from shim.calls.metadata import Argument, ArgumentKind
from shim.calls.pipeline import Pipeline, load
from shim.profiling.profiler import Profile, profile
from shim.interop.pyopencl_interop import from_pyopencl, to_pyopencl
from shim.calls.running import PreparedCall
from shim.native.streams import stream
from shim.native.threads import num_threads, set_num_threads
from shim.base.types import HalideType, Type, TypeCode

interrupts.install()  # no signal handler runs inside the device layer's bookkeeping
imported_libraries.watch()  # Halide's extension modules imported from now on: their release
# Last of the at-fork hooks (after those every module above registered): until it has run, a
# forked child's finalizers give nothing back (see shim/memory/families.py).
os.register_at_fork(after_in_child=families.after_fork_in_child)

__all__ = [
    "Argument",
    "ArgumentError",
    "ArgumentKind",
    "ArgumentTypeError",
    "BoundsError",
    "Buffer",
    "BuildError",
    "CoordinateError",
    "DeviceError",
    "DeviceUnavailable",
    "Dimension",
    "DirtyBufferWarning",
    "ElementValueError",
    "LayoutWarning",
    "HalideType",
    "Pipeline",
    "PreparedCall",
    "Profile",
    "PipelineError",
    "RuntimeOverrideWarning",
    "ShimError",
    "SizeWarning",
    "Type",
    "TypeCode",
    "UnsafeCacheWarning",
    "can_reuse_device_allocations",
    "default_device",
    "device",
    "devices",
    "from_dlpack",
    "from_pyopencl",
    "load",
    "num_threads",
    "profile",
    "release_unused_device_allocations",
    "reuse_device_allocations",
    "set_num_threads",
    "stream",
    "to_pyopencl",
]
