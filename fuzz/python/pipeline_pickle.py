"""atheris target: a pickled shim.Pipeline, as a Dask worker unpickles one.

The input's first byte chooses how the rest is used:
- even: a pickle stream (the seeds: a real pipeline pickled with protocols 2 and 5). It is
  unpickled as pickle does, except that the only globals it may name are the two a pickled
  Pipeline names, ``builtins.getattr`` and ``shim.calls.pipeline.Pipeline``, and the only
  attribute it may take is the class's ``_from_pickle``: any other pickle runs whatever it
  names (docs/security.md: unpickle only what you would run), which is no property of the
  shim's. What pickle itself refuses (a truncated stream, an unknown opcode) is pickle's, and
  so is the memory it takes for what a stream claims (seed-bytearray8-of-6-gib: see
  _Unpickler).
- odd: the three values a pickled Pipeline holds, made of the rest: its library's bytes (the
  real library's, cut short, other bytes, or another type), their sha256 (right for them, the
  real library's, other text, or another type) and its name. The sha256 is right only for
  bytes that cannot get past the shim's checks to the dynamic loader (the real library's,
  cut short, or bytes that are not ELF): a library whose bytes match their hash is trusted
  code, and the loader's reading of ELF is not the shim's.

Checked: what ``Pipeline._from_pickle`` raises is one of the shim's errors, what it returns is
a Pipeline, and a refused library leaves no file descriptor open.
"""

import hashlib
import io
import os
import pickle
import struct

from common import PropertyViolated, Reader, check_error, fuzz, quiet, sample_library

from shim.calls.pipeline import Pipeline

LIBRARY = open(sample_library("brighten"), "rb").read()
DIGEST = hashlib.sha256(LIBRARY).hexdigest()

class _Refused(Exception):
    """A refusal the target expects (the shim's, or a global it does not give)."""


def _memory_files() -> set:
    files = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:halide-shim"):
                files.add(int(fd))
        except OSError:
            pass  # (the listing's own descriptor, closed by now)
    return files


def _from_pickle(*args):
    before = _memory_files()
    try:
        with quiet():
            pipeline = Pipeline._from_pickle(*args)
    except Exception as e:  # noqa: BLE001 - the property
        check_error(e, f"Pipeline._from_pickle{tuple(map(_short, args))}")
        left = _memory_files() - before
        if left:
            raise PropertyViolated(f"a refused pickle left its library's memory file open "
                                   f"(descriptors {sorted(left)})") from e
        raise _Refused() from None
    assert isinstance(pipeline, Pipeline), type(pipeline)
    return pipeline


def _short(value):
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


class _PipelineClass:
    """What the unpickler gives for shim.calls.pipeline.Pipeline (whose _from_pickle, checked,
    is all _getattr gives of it)."""


def _getattr(obj, name, *default):
    """What the unpickler gives for builtins.getattr: the one attribute a pickled Pipeline
    takes (getattr of anything else could reach anything, builtins.open included)."""
    if obj is _PipelineClass and name == "_from_pickle" and not default:
        return _from_pickle
    raise _Refused(f"getattr({type(obj).__name__}, {name!r})")


class _Unpickler(pickle._Unpickler):
    """pickle's own, in Python: the C one sizes its memo by the largest index a stream names,
    so a stream of a few bytes could have it take gigabytes (pickle's, not the shim's); so does
    this one's BYTEARRAY8, by the length the stream gives, which is read here first."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def _load_bytearray8(self):
        size, = struct.unpack("<Q", self.read(8))
        data = self.read(size)  # (at most what the stream holds)
        if len(data) < size:
            raise pickle.UnpicklingError("BYTEARRAY8 runs past the stream's end")
        self.append(bytearray(data))

    dispatch[pickle.BYTEARRAY8[0]] = _load_bytearray8

    def find_class(self, module, name):
        if (module, name) == ("builtins", "getattr"):
            return _getattr
        if (module, name) == ("shim.calls.pipeline", "Pipeline"):
            return _PipelineClass
        raise _Refused(f"{module}.{name}")


_OTHER_VALUES = (None, 42, 1.5, "text", [1, 2], b"", (DIGEST,))


def _values(r: Reader) -> tuple:
    """(digest, name, data) made of the input (see the module's docstring)."""
    kind = r.u8() % 4
    if kind == 0:
        data = LIBRARY
    elif kind == 1:
        data = LIBRARY[:r.u16()]
    elif kind == 2:
        data = r.blob()
        if data.startswith(b"\x7fELF"):
            data = data[1:]
    else:
        data = r.choice(_OTHER_VALUES + (bytearray(LIBRARY), memoryview(LIBRARY)))
    kind = r.u8() % 4
    if kind == 0:
        digest = hashlib.sha256(data).hexdigest() if isinstance(
            data, (bytes, bytearray, memoryview)) else DIGEST
    elif kind == 1:
        digest = DIGEST
    elif kind == 2:
        digest = r.text()
    else:
        digest = r.choice(_OTHER_VALUES)
    kind = r.u8() % 3
    name = "brighten" if kind == 0 else r.text() if kind == 1 else r.choice(_OTHER_VALUES)
    return digest, name, data


def test_one_input(data: bytes) -> None:
    if not data:
        return
    try:
        if data[0] % 2 == 0:
            _Unpickler(io.BytesIO(data[1:])).load()
        else:
            _from_pickle(*_values(Reader(data[1:])))
    except _Refused:
        pass
    except AssertionError:
        raise
    except Exception:  # noqa: BLE001 - pickle's own refusals (the shim's are checked inside)
        pass


if __name__ == "__main__":
    fuzz(test_one_input)
