"""What the atheris targets share: coverage of the shim's own modules, the property every target
checks (the shim raises its own errors, and nothing else, on bad input), and a reader that makes
structured values of the fuzzer's bytes (with the writer that makes seed inputs of real values).

Every target is run by fuzz/run.py as ``python fuzz/python/TARGET.py [libFuzzer flags]
CORPUS...``; each module's docstring says what it feeds the shim and what it checks.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import struct
import sys
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # (the checkout's shim, as the tests import it)

import atheris  # noqa: E402

with atheris.instrument_imports(include=["shim"]):
    import shim  # noqa: E402,F401  (every shim module a target imports is instrumented)
    import shim.cli.main  # noqa: E402,F401
    import shim.calls.library  # noqa: E402,F401
    import shim.calls.pipeline_pickle  # noqa: E402,F401
    import shim.exchange.dlpack_capsules  # noqa: E402,F401
    import shim.interop.dlpack  # noqa: E402,F401

from shim.base.errors import ShimError  # noqa: E402


class PropertyViolated(AssertionError):
    """What a target raises (and atheris reports as a crash, keeping the input) when the shim
    broke the property it checks."""


def deliberate(error: BaseException) -> bool:
    """Whether ``error`` was raised by a ``raise`` statement of the shim's own (a protocol's
    error, such as the BufferError or TypeError the array API standard has ``__dlpack__``
    raise), not by an operation failing inside it (a raw TypeError from ``int(None)``)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    line = linecache.getline(filename, tb.tb_lineno).strip()
    return filename.startswith(os.path.join(ROOT, "shim")) and line.startswith("raise ")


def check_error(error: BaseException, what: str, protocol: tuple = ()) -> None:
    """The property: a refusal is one of the shim's exceptions (or one of ``protocol``, the
    errors a Python protocol prescribes, raised deliberately by the shim). Anything else is
    reported with ``what`` (the call) and the error's own traceback."""
    if isinstance(error, ShimError):
        return
    if protocol and isinstance(error, protocol) and deliberate(error):
        return
    raise PropertyViolated(f"{what} raised {type(error).__name__} (not a shim error): {error}\n"
                           + "".join(traceback.format_exception(error))) from error


@contextlib.contextmanager
def quiet():
    """The shim's warnings and prints, dropped: the fuzzer's output is its own."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def fuzz(test_one_input) -> None:
    """Run the target under atheris with this process's command line (libFuzzer's flags)."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


# --- structured values from bytes ------------------------------------------------------------

class Reader:
    """Values read in order from the fuzzer's bytes; zeros once they run out, so that every
    input means something."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk.ljust(n, b"\0")

    def _unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def u8(self) -> int:
        return self._unpack("B")

    def i8(self) -> int:
        return self._unpack("b")

    def u16(self) -> int:
        return self._unpack("H")

    def i32(self) -> int:
        return self._unpack("i")

    def u32(self) -> int:
        return self._unpack("I")

    def i64(self) -> int:
        return self._unpack("q")

    def u64(self) -> int:
        return self._unpack("Q")

    def f64(self) -> float:
        return self._unpack("d")

    def bool(self) -> bool:
        return bool(self.u8() & 1)

    def choice(self, options):
        return options[self.u8() % len(options)]

    def blob(self) -> bytes:
        """Bytes of a length (one byte) given first."""
        return self.take(self.u8())

    def text(self) -> str:
        return self.blob().decode("utf-8", "surrogateescape")

    def rest(self) -> bytes:
        rest = self.data[self.at:]
        self.at = len(self.data)
        return rest


class Writer:
    """The bytes a Reader reads as the values written (for seed inputs)."""

    def __init__(self):
        self.parts: list[bytes] = []

    def _pack(self, fmt: str, value) -> Writer:
        self.parts.append(struct.pack("<" + fmt, value))
        return self

    def u8(self, value):
        return self._pack("B", value & 0xFF)

    def i8(self, value):
        return self._pack("b", value)

    def u16(self, value):
        return self._pack("H", value & 0xFFFF)

    def i32(self, value):
        return self._pack("i", value)

    def u32(self, value):
        return self._pack("I", value & 0xFFFFFFFF)

    def i64(self, value):
        return self._pack("q", value)

    def u64(self, value):
        return self._pack("Q", value & (2**64 - 1))

    def f64(self, value):
        return self._pack("d", value)

    def bool(self, value):
        return self.u8(1 if value else 0)

    def choice(self, options, value):
        return self.u8(options.index(value))

    def blob(self, value: bytes):
        assert len(value) < 256
        self.u8(len(value))
        self.parts.append(value)
        return self

    def text(self, value: str):
        return self.blob(value.encode("utf-8", "surrogateescape"))

    def raw(self, value: bytes):
        self.parts.append(value)
        return self

    def bytes(self) -> bytes:
        return b"".join(self.parts)


def sample_library(name: str, target: str = "host") -> str:
    """The path of the sample pipeline ``name``, built without its runtime for ``target``
    (cached as the tests' builds are: $HALIDE_SHIM_PIPELINES)."""
    from shim.pipelines.build import Build, build

    return str(build(Build(name, target, "no_runtime")))
