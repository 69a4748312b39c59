"""Calls of sample pipelines made the same way through a Python extension Halide generated
(``-e python_extension``) and through ``shim.load(path, convention="extension")``, for
tests/test_generated_extension.py. ``run(functions)`` makes every case's arguments afresh
from fixed seeds, calls ``functions[pipeline]`` with them, and says what came of it: the
return value and the outputs' bytes, or the exception's type, text and Halide's message (the
generated extension, built with HALIDE_PYTHON_EXTENSION_LOG_ERRORS_TO_STDERR, prints it to
sys.stderr; the shim's exception carries it as ``message``). The generated side runs in a
child process that never imports the shim (``python extension_cases.py DIR OUT``).
"""

import contextlib
import io
import pickle
import sys

import numpy as np

# The pipelines (pipelines/generators/) the cases call.
PIPELINES = ("blur3x3", "mix", "sum_diff", "checked_sqrt", "histogram")


def _u16(rng, shape, order="C"):
    return np.asarray(rng.integers(0, 65536, shape, dtype=np.uint16), order=order)


def _cases():
    """(label, pipeline, make) each; make(rng) -> (args, kwargs, the arrays to look at after)."""
    def blur(shape, order, out_order=None, out=None):
        def make(rng):
            a = _u16(rng, shape, order)
            o = np.zeros(out or (shape[0] - 2, shape[1] - 2), np.uint16,
                         order=out_order or order)
            return (a, o), {}, [o]
        return make

    cases = [
        ("blur C", "blur3x3", blur((40, 30), "C")),
        # The extension's axis rule: F-contiguous memory has x in axis 0.
        ("blur F", "blur3x3", blur((40, 30), "F")),
        ("blur F in, C out of the transposed shape", "blur3x3",
         blur((40, 30), "F", "C", out=(28, 38))),
        ("blur C in, F out", "blur3x3", blur((40, 30), "C", "F")),
        # Both C- and F-contiguous (an axis of extent 1 besides x): F wins, axis 0 is x.
        ("blur, an output both C- and F-contiguous", "blur3x3", blur((3, 40), "C", out=(1, 38))),
        ("blur, output too large", "blur3x3", blur((20, 20), "C", out=(20, 20))),
    ]

    # Inputs too small, per dimension and memory order: Halide's access_out_of_bounds (-4),
    # naming its dimension (0 is x: numpy's last axis in C order, its first in F order).
    cases += [
        ("blur, input too small in x, C", "blur3x3", blur((40, 29), "C", out=(38, 28))),
        ("blur, input too small in y, C", "blur3x3", blur((39, 30), "C", out=(38, 28))),
        ("blur, input too small in x, F", "blur3x3", blur((29, 40), "F", out=(28, 38))),
        ("blur, input too small in y, F", "blur3x3", blur((30, 39), "F", out=(28, 38))),
        # An output whose every axis but one has extent 1 counts as F-contiguous: its strides
        # then fail the extension's length check (ValueError) or Halide's stride constraint.
        ("blur, an output of one column", "blur3x3", blur((12, 10), "C", out=(10, 1))),
        ("blur, an output of one row, C", "blur3x3", blur((3, 12), "C", out=(1, 10))),
        # Empty arrays: passed on (Halide decides), or the extension's length check.
        ("blur, an output of no columns", "blur3x3", blur((12, 10), "C", out=(10, 0))),
        ("blur, an input of no rows", "blur3x3", blur((0, 10), "C", out=(10, 8))),
    ]

    def arrays(*made, outputs=1):
        """The arguments ``made`` (a function of the random generator each, or the value),
        the last ``outputs`` of them watched."""
        def make(rng):
            values = tuple(m(rng) if callable(m) else m for m in made)
            return values, {}, [v for v in values[-outputs:] if isinstance(v, np.ndarray)]
        return make

    def u16(shape, order="C", dtype=np.uint16):
        return lambda rng: _u16(rng, shape, order).astype(dtype, order=order)

    def zeros(shape, dtype, order="C"):
        return lambda rng: np.zeros(shape, dtype, order=order)

    # What Halide checks first: every buffer's type before any buffer's region; the extension's
    # own unpacking of every buffer before either.
    cases += [
        ("blur, wrong output type", "blur3x3", arrays(u16((12, 10)), zeros((10, 8), np.float32))),
        ("blur, a bool input", "blur3x3", arrays(zeros((12, 10), np.bool_), zeros((10, 8), np.uint16))),
        ("blur, wrong type and too small", "blur3x3",
         arrays(u16((5, 5), dtype=np.float32), zeros((10, 8), np.uint16))),
        ("blur, too small and a wrong output type", "blur3x3",
         arrays(u16((5, 5)), zeros((10, 8), np.int16))),
        ("blur, wrong type and a 3-D output", "blur3x3",
         arrays(u16((12, 10), dtype=np.float32), zeros((1, 10, 8), np.uint16))),
        ("blur, a 1-D input", "blur3x3", arrays(u16((120,)), zeros((10, 8), np.uint16))),
        ("blur, a big-endian input", "blur3x3",
         arrays(u16((12, 10), dtype=">u2"), zeros((10, 8), np.uint16))),
        ("blur, a read-only input", "blur3x3", arrays(lambda rng: _frozen(_u16(rng, (12, 10))),
                                                      zeros((10, 8), np.uint16))),
        ("blur, a strided output", "blur3x3",
         arrays(u16((12, 10)), lambda rng: np.zeros((10, 16), np.uint16)[:, ::2])),
        ("blur, a bytearray input", "blur3x3", arrays(bytearray(240), zeros((10, 8), np.uint16))),
        ("blur, an object that is no buffer", "blur3x3", arrays(object(), zeros((10, 8), np.uint16))),
    ]

    def f32(shape, order="C"):
        return lambda rng: np.asarray(rng.random(shape, dtype=np.float32), order=order)

    def u8(shape, order="C"):
        return lambda rng: np.asarray(rng.integers(0, 256, shape, dtype=np.uint8), order=order)

    # The scalars' declared ranges are checked after the buffers (param_too_small -9, _large
    # -10, with Halide's %e for floats).
    cases += [
        ("mix, a too small and offset out of range", "mix",
         arrays(u8((4, 4)), f32((9, 7)), 0.5, 5000, zeros((9, 7), np.float32))),
        ("mix, b of the wrong type and alpha out of range", "mix",
         arrays(u8((9, 7)), u8((9, 7)), 2.0, 0, zeros((9, 7), np.float32))),
        ("mix, alpha and offset out of range", "mix",
         arrays(u8((9, 7)), f32((9, 7)), 2.0, -5000, zeros((9, 7), np.float32))),
        ("mix, alpha below its minimum", "mix",
         arrays(u8((9, 7)), f32((9, 7)), -0.25, 0, zeros((9, 7), np.float32))),
        ("mix, one-row C arrays", "mix",
         arrays(u8((1, 7)), f32((1, 7)), 0.5, 0, zeros((1, 7), np.float32))),
        ("mix, one-column arrays", "mix",
         arrays(u8((9, 1)), f32((9, 1)), 0.5, 0, zeros((9, 1), np.float32))),
        ("sum_diff, b narrower, C", "sum_diff",
         arrays(lambda rng: np.ones((6, 5), np.int32), lambda rng: np.ones((6, 4), np.int32),
                zeros((6, 5), np.int32), zeros((6, 5), np.int32), outputs=2)),
        ("sum_diff, a shorter, F", "sum_diff",
         arrays(lambda rng: np.ones((6, 4), np.int32, order="F"),
                lambda rng: np.ones((6, 5), np.int32, order="F"),
                zeros((6, 5), np.int32, "F"), zeros((6, 5), np.int32, "F"), outputs=2)),
        ("sum_diff, diff wider than the inputs", "sum_diff",
         arrays(lambda rng: np.ones((6, 5), np.int32), lambda rng: np.ones((6, 5), np.int32),
                zeros((6, 5), np.int32), zeros((6, 6), np.int32), outputs=2)),
        # The output's constraints (256 bins from 0): too few is the output read out of
        # bounds (-4), too many a violated constraint (-8).
        ("histogram, 100 bins", "histogram", arrays(u8((8, 8)), zeros(100, np.uint32))),
        ("histogram, 300 bins", "histogram", arrays(u8((8, 8)), zeros(300, np.uint32))),
        ("histogram, a float input", "histogram", arrays(f32((8, 8)), zeros(256, np.uint32))),
    ]

    def halide_output(type_name, sizes, mins):
        def make(rng):
            import halide as hl
            o = hl.Buffer(getattr(hl, type_name)(32), sizes)
            o.set_min(mins)
            return (_u8_image(rng), o), {}, [np.asarray(o)]
        return make

    cases += [("histogram, a halide.Buffer output from 1", "histogram",
               halide_output("UInt", [256], [1])),
              ("histogram, a halide.Buffer output of floats", "histogram",
               halide_output("Float", [256], [0])),
              ("histogram, a halide.Buffer output", "histogram", halide_output("UInt", [256], [0]))]

    def by_keyword(rng):
        a = _u16(rng, (12, 10))
        o = np.zeros((10, 8), np.uint16)
        return (), {"output": o, "input": a}, [o]

    def strided(rng):
        a = _u16(rng, (24, 10))[::2]
        return (a, np.zeros((10, 8), np.uint16)), {}, []

    def read_only_output(rng):
        o = np.zeros((10, 8), np.uint16)
        o.flags.writeable = False
        return (_u16(rng, (12, 10)), o), {}, []

    def wrong_type(rng):
        return (_u16(rng, (12, 10)).astype(np.float32), np.zeros((10, 8), np.uint16)), {}, []

    def wrong_dimensions(rng):
        return (_u16(rng, (12, 10))[None], np.zeros((10, 8), np.uint16)), {}, []

    def unsupported_type(rng):
        return (_u16(rng, (12, 10)), np.zeros((10, 8), np.complex64)), {}, []

    def missing(rng):
        return (_u16(rng, (12, 10)),), {}, []

    def unknown_keyword(rng):
        return (_u16(rng, (12, 10)), np.zeros((10, 8), np.uint16)), {"bogus": 1}, []

    def too_many(rng):
        return (_u16(rng, (12, 10)), np.zeros((10, 8), np.uint16), 3), {}, []

    def not_an_array(rng):
        return ("abc", np.zeros((10, 8), np.uint16)), {}, []

    def halide_buffers(out_min):
        def make(rng):
            import halide as hl
            a = hl.Buffer(hl.UInt(16), [12, 10])
            a.set_min([10, 20])
            np.asarray(a)[:] = _u16(rng, (10, 12))
            o = hl.Buffer(hl.UInt(16), [10, 8])
            o.set_min(out_min)
            return (a, o), {}, [np.asarray(o)]
        return make

    # A halide.Buffer's mins count: its region of the input, at (10, 20), covers the output
    # at (10, 20), not one at (11, 20).
    cases += [("blur, halide.Buffers with mins", "blur3x3", halide_buffers([10, 20])),
              ("blur, halide.Buffer output beyond the input", "blur3x3",
               halide_buffers([11, 20]))]

    cases += [("blur by keyword", "blur3x3", by_keyword),
              ("blur, strided input", "blur3x3", strided),
              ("blur, read-only output", "blur3x3", read_only_output),
              ("blur, wrong element type", "blur3x3", wrong_type),
              ("blur, wrong dimensions", "blur3x3", wrong_dimensions),
              ("blur, complex output", "blur3x3", unsupported_type),
              ("blur, missing output", "blur3x3", missing),
              ("blur, unknown keyword", "blur3x3", unknown_keyword),
              ("blur, too many arguments", "blur3x3", too_many),
              ("blur, a str for input", "blur3x3", not_an_array)]

    def mix(alpha, offset, order="C"):
        def make(rng):
            a = np.asarray(rng.integers(0, 256, (9, 7), dtype=np.uint8), order=order)
            b = np.asarray(rng.random((9, 7), dtype=np.float32), order=order)
            o = np.zeros((9, 7), np.float32, order=order)
            return (a, b, alpha, offset, o), {}, [o]
        return make

    # Scalars as CPython's parser converts them for the extension's C types: an int16 given
    # an int wraps (C's conversion), floats take ints, a float for an int is refused.
    cases += [("mix", "mix", mix(0.25, 3)),
              ("mix F", "mix", mix(0.5, -7, "F")),
              ("mix, int alpha", "mix", mix(1, 0)),
              ("mix, offset wraps to int16", "mix", mix(0.5, 70000)),
              ("mix, offset beyond C int", "mix", mix(0.5, 2**40)),
              ("mix, float offset", "mix", mix(0.5, 1.5)),
              ("mix, numpy scalars", "mix", mix(np.float64(0.75), np.int64(-2))),
              ("mix, str alpha", "mix", mix("0.5", 1)),
              ("mix, None offset", "mix", mix(0.5, None))]

    def sum_diff(order):
        def make(rng):
            a = np.asarray(rng.integers(-1000, 1000, (6, 5), dtype=np.int32), order=order)
            b = np.asarray(rng.integers(-1000, 1000, (6, 5), dtype=np.int32), order=order)
            s, d = np.zeros((6, 5), np.int32, order=order), np.zeros((6, 5), np.int32, order=order)
            return (a, b, s, d), {}, [s, d]
        return make

    def sqrt(verbose, negative):
        def make(rng):
            a = rng.random((8, 8), dtype=np.float32) + 1
            if negative:
                a[3, 4] = -1
            o = np.zeros((8, 8), np.float32)
            return (a, verbose, o), {}, [o]
        return make

    def histogram(order):
        def make(rng):
            a = np.asarray(rng.integers(0, 256, (30, 20), dtype=np.uint8), order=order)
            o = np.zeros(256, np.uint32)
            return (a, o), {}, [o]
        return make

    cases += [("sum_diff C", "sum_diff", sum_diff("C")),
              ("sum_diff F", "sum_diff", sum_diff("F")),
              ("checked_sqrt", "checked_sqrt", sqrt(False, False)),
              ("checked_sqrt, bool as 1", "checked_sqrt", sqrt(1, False)),
              ("checked_sqrt, bool as 300", "checked_sqrt", sqrt(300, False)),
              ("checked_sqrt, a negative input", "checked_sqrt", sqrt(False, True)),
              ("histogram C", "histogram", histogram("C")),
              ("histogram F", "histogram", histogram("F"))]
    return cases


def _frozen(array):
    array.flags.writeable = False
    return array


def _u8_image(rng):
    return rng.integers(0, 256, (8, 8), dtype=np.uint8)


def run(functions: dict) -> dict:
    """{label: ("ok", return value's repr, [output bytes...]) or ("error", exception type's
    names along its MRO, text, Halide's message or None, the exception's ``code`` or None)}
    for the cases of the pipelines in ``functions``."""
    seen = {}
    for i, (label, pipeline, make) in enumerate(_cases()):
        if pipeline not in functions:
            continue
        args, kwargs, watched = make(np.random.default_rng(i))
        printed = io.StringIO()
        try:
            with contextlib.redirect_stderr(printed):
                returned = functions[pipeline](*args, **kwargs)
        except Exception as e:  # noqa: BLE001 (what is raised is the observation)
            message = getattr(e, "message", None) or printed.getvalue().strip() or None
            seen[label] = ("error", [c.__name__ for c in type(e).__mro__], str(e), message,
                           getattr(e, "code", None))
        else:
            seen[label] = ("ok", repr(returned),
                           [(w.shape, w.flags.f_contiguous, w.tobytes(order="A")) for w in watched])
    return seen


if __name__ == "__main__":
    folder, out = sys.argv[1], sys.argv[2]
    sys.path.insert(0, folder)
    import importlib
    modules = {name: importlib.import_module(name) for name in PIPELINES}
    assert "shim" not in sys.modules
    with open(out, "wb") as f:
        pickle.dump(run({name: getattr(m, name) for name, m in modules.items()}), f)
