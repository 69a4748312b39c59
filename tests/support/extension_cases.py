"""Calls of sample pipelines made the same way through a Python extension Halide generated
(``-e python_extension``) and through ``shim.load(path, convention="extension")``, for
tests/test_generated_extension.py. ``run(functions)`` makes every case's arguments afresh
from fixed seeds, calls ``functions[pipeline]`` with them, and says what came of it: the
return value and the outputs' bytes, or the exception's type and text. The generated side
runs in a child process that never imports the shim (``python extension_cases.py DIR OUT``).
"""

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


def run(functions: dict) -> dict:
    """{label: ("ok", return value's repr, [output bytes...]) or ("error", exception type's
    names along its MRO, text)} for the cases of the pipelines in ``functions``."""
    seen = {}
    for i, (label, pipeline, make) in enumerate(_cases()):
        if pipeline not in functions:
            continue
        args, kwargs, watched = make(np.random.default_rng(i))
        try:
            returned = functions[pipeline](*args, **kwargs)
        except Exception as e:  # noqa: BLE001 (what is raised is the observation)
            seen[label] = ("error", [c.__name__ for c in type(e).__mro__], str(e))
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
