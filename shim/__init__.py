"""halide-shim: a drop-in runtime for ahead-of-time compiled Halide pipelines.

Importing shim loads its native runtime library into the global symbol scope first, so every
pipeline loaded afterwards calls the shim's halide_* functions instead of Halide's own.
"""

import os

from shim import native  # noqa: F401  (must come first: see shim/native.py)
from shim._version import __version__  # noqa: F401  (its one source, which setup.cfg reads)
from shim import callbacks  # noqa: F401  (registers the device layer's callbacks)
from shim import shutdown  # noqa: F401  (an orderly exit)
from shim import families, interrupts
from shim.allocation_reuse import (
    can_reuse_device_allocations,
    release_unused_device_allocations,
    reuse_device_allocations,
)
from shim.buffer import Buffer, Dimension
from shim.devices import default_device, device, devices
from shim.dlpack import from_dlpack
from shim.errors import (
    ArgumentError,
    BoundsError,
    CoordinateError,
    DeviceError,
    DeviceUnavailable,
    DirtyBufferWarning,
    PipelineError,
    ShimError,
    UnsafeCacheWarning,
)
from shim.metadata import Argument, ArgumentKind
from shim.pipeline import Pipeline, load
from shim.profiler import Profile, profile
from shim.pyopencl_interop import from_pyopencl, to_pyopencl
from shim.running import PreparedCall
from shim.streams import stream
from shim.threads import num_threads, set_num_threads
from shim.types import HalideType

interrupts.install()  # no signal handler runs inside the device layer's bookkeeping
# Last of the at-fork hooks (after those every module above registered): until it has run, a
# forked child's finalizers give nothing back (see shim/families.py).
os.register_at_fork(after_in_child=families.after_fork_in_child)

__all__ = [
    "Argument",
    "ArgumentError",
    "ArgumentKind",
    "BoundsError",
    "Buffer",
    "CoordinateError",
    "DeviceError",
    "DeviceUnavailable",
    "Dimension",
    "DirtyBufferWarning",
    "HalideType",
    "Pipeline",
    "PreparedCall",
    "Profile",
    "PipelineError",
    "ShimError",
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
