"""``python -m shim run`` against hostile command lines and files: every bad value is refused
as RunGen refuses it (its message, then SIGABRT), or where RunGen would go on (into memory
nobody wrote, or a crash) with the shim's error naming the argument or flag, never a
traceback, before anything is allocated or run; what it accepts, it computes as numpy does."""

import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

hl = pytest.importorskip("halide")

GENERATORS = textwrap.dedent('''
    import halide as hl

    x, y = hl.vars("x y")


    @hl.generator(name="odd_types")
    class OddTypes:
        """An int16 input; outputs of int16 (input + 1), float64 (input * k) and float16
        (input / 4)."""
        input = hl.InputBuffer(hl.Int(16), 2)
        k = hl.InputScalar(hl.Float(64))
        plus1 = hl.OutputBuffer(hl.Int(16), 2)
        scaled = hl.OutputBuffer(hl.Float(64), 2)
        quarter = hl.OutputBuffer(hl.Float(16), 2)

        def generate(self):
            self.plus1[x, y] = self.input[x, y] + 1
            self.scaled[x, y] = hl.f64(self.input[x, y]) * self.k
            self.quarter[x, y] = hl.cast(hl.Float(16), hl.f32(self.input[x, y]) / 4)
            self.k.parameter().set_default_value(hl.f64(1))


    @hl.generator(name="zero_dim")
    class ZeroDim:
        """0-D buffers: output = input * 2."""
        input = hl.InputBuffer(hl.Float(32), 0)
        output = hl.OutputBuffer(hl.Float(32), 0)

        def generate(self):
            self.output[()] = self.input[()] * 2


    if __name__ == "__main__":
        hl.main()
''')


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """{name: library} of the generators above."""
    work = tmp_path_factory.mktemp("adversarial")
    (work / "gen.py").write_text(GENERATORS)
    libraries = {}
    for name in ("odd_types", "zero_dim"):
        subprocess.run([sys.executable, str(work / "gen.py"), "-g", name, "-f", name, "-o",
                        str(work), "-e", "object", "target=host"], check=True)
        subprocess.run(["cc", "-shared", "-o", str(work / f"{name}.so"), str(work / f"{name}.o"),
                        "-lpthread", "-ldl"], check=True)
        libraries[name] = work / f"{name}.so"
    return libraries


def run(*args, cwd=None, stdout=subprocess.PIPE, **options):
    """``python -m shim run`` with ``args``; RunGen asks a value of every argument: the
    scalars not given take the pipeline's defaults (RunGen's --default_input_scalars) and
    the outputs not given are left out, as a timed run of the shim's (--iterations=1) may."""
    args = [*map(str, args), "--default_input_scalars=default"]
    if not any(a.startswith(("--benchmarks", "--iterations", "--track_memory")) for a in args):
        args.append("--iterations=1")
    done = subprocess.run([sys.executable, "-m", "shim", "run", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, cwd=cwd, **options)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def refused(done, message):
    """Refused as RunGen refuses (SIGABRT after the message), before anything ran."""
    assert done.returncode == -signal.SIGABRT, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
    assert "iteration" not in done.stdout  # nothing ran
    return done


def refused_as_an_option_of_the_shims(done, message):
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "error:" in done.stderr, done.stderr
    assert "iteration" not in done.stdout
    return done


def succeeded(done):
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# --- values ----------------------------------------------------------------------------------

@pytest.mark.parametrize("pipeline, arguments, message", [
    # A constant the element type cannot hold: RunGen's reading refuses it (C++'s, which takes
    # -1 for a uint16 as 65535, as RunGen does).
    ("blur3x3", ["input=constant:70000:[4,4]"], "Invalid value for constant value\n"),
    ("mix", ["a=constant:300:[4,4]", "b=zero:[4,4]"], "Invalid value for constant value\n"),
    ("brighten", ["input=constant:1e39:[2,2]"], "Invalid value for constant value\n"),
    # A finite number beyond any double is not infinity.
    ("brighten", ["input=constant:1e400:[2,2]"], "Invalid value for constant value\n"),
    ("times_k", ["input=zero:[2,2]", "k=-1e400"],
     "Argument value for: k could not be parsed as type float32: -1e400\n"),
    # Extents and mins beyond Halide's 32-bit coordinates, refused before the bounds query.
    ("brighten", ["input=random:0:[99999999999999999999,4]"],
     "Invalid value for extents: 99999999999999999999 ([99999999999999999999,4])\n"),
    ("brighten", ["input=zero:[4,4]", "output=:[2147483647+4,4]"],
     "output: min 2147483647 with extent 4 is beyond Halide's 32-bit"),
    ("brighten", ["input=zero:[4,4]", "--output_extents=[-2147483649+4,4]"],
     "--output_extents: min -2147483649 with extent 4 is beyond Halide's 32-bit"),
    # Terabytes: refused before the bounds query or any allocation.
    ("plane_sum", ["input=zero:[100000,100000,100000]"], "input: shape (100000, 100000, 100000) "
                                                         "has 1000000000000000 elements"),
    # RunGen's seed is an int.
    ("brighten", ["input=random:2147483648:[4,4]"], "Invalid value for seed\n"),
    # Given twice, or given empty: RunGen refuses both.
    ("brighten", ["input=zero:[4,4]", "input=zero:[8,8]"],
     "Argument value specified multiple times for: input\n"),
    ("brighten", ["input=zero:[4,4]", "output="], "Invalid argument: output=\n"),
    ("brighten", ["input=zero:[4,4]", "=5"], "Invalid argument: =5\n"),
    ("brighten", ["input=zero:[4,4]", "--benchmarks", "--benchmark_min_time=inf"],
     "Invalid value for flag: benchmark_min_time\n"),
])
def test_hostile_values_are_refused_naming_the_argument(host_pipelines, pipeline, arguments,
                                                        message):
    done = refused(run(host_pipelines[pipeline, "bundled"], *arguments), message)
    if message.endswith("\n"):  # (RunGen's message, alone)
        assert done.stderr == message


@pytest.mark.parametrize("arguments, message", [
    (["input=zero:auto", "output=:[2147483647,1]"], "input: the bounds query found no size for it"),
    # (the output's error, or, where 8 GiB is more than the machine has, the input's)
    (["input=zero:[1+2147483647,1]"], ": error: "),
])
def test_a_bounds_query_that_overflows_is_no_size(host_pipelines, arguments, message):
    # Near 2^31 the generated bounds query's 32-bit arithmetic overflows (rounding up to whole
    # vectors): its negative extents must not become the sizes of buffers.
    refused(run(host_pipelines["brighten", "bundled"], *arguments), message)


@pytest.mark.parametrize("arguments, message", [
    (["input=random:abc:[1,2]"], "Invalid value for seed"),
    (["input=random:0:[1,,2]"], "Invalid value for extents:  ([1,,2])"),
    (["input=random:0:[-5,3]"], "input: extent -5 in '[-5,3]': each must be at least 1"),
    (["input=random:0:[0,0]"], "input: extent 0 in '[0,0]': each must be at least 1"),
    (["input=random:0:[3+-5,4]"], "Invalid value for extents: 3+-5 ([3+-5,4])"),
    (["input=constant:nan:[2,2]", "scale=1e39"],
     "Argument value for: scale could not be parsed as type float32: 1e39"),
    (["input=zero:[4,4]", "--output_extents=[4,4,4]"], "--output_extents gives 3 extents"),
    (["input=zero:[4,4]", "--benchmarks", "--benchmark_min_time=nan"],
     "Invalid value for flag: benchmark_min_time"),
])
def test_what_was_already_refused(host_pipelines, arguments, message):
    refused(run(host_pipelines["brighten", "bundled"], *arguments), message)


def test_infinity_and_nan_are_accepted_where_asked_for(host_pipelines):
    # (the shim's: RunGen's reading takes no inf or nan)
    done = succeeded(run(host_pipelines["brighten", "bundled"], "input=constant:inf:[2,2]",
                         "output=:[2,2]"))
    assert "output: float32 2x2, min inf, max inf" in done.stdout
    done = succeeded(run(host_pipelines["brighten", "bundled"], "input=constant:nan:[2,2]",
                         "output=:[2,2]"))
    assert "min nan, max nan" in done.stdout


def test_negative_seeds_are_seeds(host_pipelines, tmp_path):
    library = host_pipelines["brighten", "bundled"]
    for name in ("a", "b"):
        succeeded(run(library, "input=random:-1:[16,8]", f"output={tmp_path / name}.npy"))
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    np.testing.assert_array_equal(a, b)
    assert a.std() > 0.1


def test_no_numpy_warnings_among_the_results(odd, tmp_path):
    # -inf, inf and nan in one output: its summary says so without numpy's RuntimeWarnings.
    # (RunGen's random int16s are never negative: the input is a file of -1s and 1s.)
    np.save(tmp_path / "signs.npy", np.resize(np.array([-1, 1], np.int16), (4, 8)))
    done = succeeded(run(odd["odd_types"], f"input={tmp_path / 'signs.npy'}", "k=inf",
                         "scaled=:[8,4]"))
    assert "scaled: float64 8x4, min -inf, max inf, mean nan" in done.stdout
    assert "Warning" not in done.stderr


# --- input files -----------------------------------------------------------------------------

@pytest.mark.parametrize("array, what", [
    (np.zeros((4, 5), dtype=[("a", "<f4"), ("b", "<i4")]), "[('a', '<f4'), ('b', '<i4')]"),
    (np.ones((4, 5), np.complex64), "complex64"),
    (np.array([["ab", "cd"]]), "<U2"),
    (np.array([["2020-01-01"]], dtype="datetime64[D]"), "datetime64[D]"),
])
def test_npy_files_of_things_other_than_numbers_are_refused(host_pipelines, tmp_path, array, what):
    np.save(tmp_path / "in.npy", array)
    refused(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'in.npy'}"),
            f"input: cannot read {tmp_path / 'in.npy'}: its elements are {what}, not numbers")


def test_npy_in_the_other_byte_order(odd, host_pipelines, tmp_path):
    values = np.array([[-3, -1, 0, 1], [2, 300, -32768, 32766]], np.int16)
    np.save(tmp_path / "big.npy", values.astype(">i2"))
    done = succeeded(run(odd["odd_types"], f"input={tmp_path / 'big.npy'}",
                         f"plus1={tmp_path / 'out.npy'}"))
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), values + 1)
    assert "warning" not in done.stderr  # the same type, stored the other way round
    image = np.random.default_rng(0).random((4, 5), dtype=np.float32)
    np.save(tmp_path / "big.npy", image.astype(">f4"))
    done = succeeded(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'big.npy'}",
                         "scale=2", "offset=1", f"output={tmp_path / 'out.npy'}"))
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), image * np.float32(2) + 1)
    assert "warning" not in done.stderr


def test_fortran_ordered_and_0_d_npy_files(host_pipelines, tmp_path):
    image = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.save(tmp_path / "fortran.npy", np.asfortranarray(image))
    library = host_pipelines["brighten", "bundled"]
    succeeded(run(library, f"input={tmp_path / 'fortran.npy'}", "scale=2", "offset=1",
                  f"output={tmp_path / 'out.npy'}"))
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), image * 2 + 1)
    np.save(tmp_path / "scalar.npy", np.array(3.5, np.float32))
    done = succeeded(run(library, f"input={tmp_path / 'scalar.npy'}", "scale=2", "offset=1",
                         f"output={tmp_path / 'out.npy'}"))
    assert done.stderr == ('Warning: Image for Input "input" has 0 dimensions, but this argument '
                           'requires at least 2 dimensions: adding dummy dimensions of extent 1.\n')
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), [[8.0]])


def npy_bytes(header: str, data: bytes = b"", version: int = 1) -> bytes:
    """A .npy file with ``header`` as its header text, whatever it says."""
    width = 2 if version == 1 else 4
    return (b"\x93NUMPY" + bytes([version, 0]) + len(header).to_bytes(width, "little")
            + header.encode("latin1") + data)


def test_npy_headers_as_halide_image_io_writes_them(host_pipelines, tmp_path):
    """halide_image_io (RunGen's --output=x.npy) puts the header's newline before its padding,
    which numpy's np.load refuses from Python 3.12 on ("IndentationError: unexpected indent"):
    read on every Python, as the array it says."""
    image = np.arange(20, dtype=np.float32).reshape(4, 5)
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 5), }\n"
    header += " " * (-(10 + len(header)) % 64)
    (tmp_path / "rungen.npy").write_bytes(npy_bytes(header, image.astype("<f4").tobytes()))
    succeeded(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'rungen.npy'}",
                  "scale=2", "offset=1", f"output={tmp_path / 'out.npy'}"))
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), image * 2 + 1)


GOOD = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }"


@pytest.mark.parametrize("contents, message", [
    (npy_bytes(GOOD, bytes(12)), "its header says 4 elements of 4 bytes, and 12 bytes follow it"),
    (npy_bytes(GOOD, bytes(20)), "its header says 4 elements of 4 bytes, and 20 bytes follow it"),
    (npy_bytes(GOOD)[:20], "a damaged .npy header (the file ends inside it)"),
    (npy_bytes(GOOD.replace("(2, 2)", "(2, -2)"), bytes(16)), "a damaged .npy header (shape"),
    (npy_bytes(GOOD.replace("(2, 2)", "[2, 2]"), bytes(16)), "a damaged .npy header (shape"),
    (npy_bytes(GOOD.replace("(2, 2)", "(10**30, 10**30)"), bytes(16)), "a damaged .npy header"),
    (npy_bytes(GOOD.replace("(2, 2)", "(1099511627776, 1099511627776)"), bytes(16)),
     "its header says 1208925819614629174706176 elements"),
    (npy_bytes(GOOD.replace("False", "0"), bytes(16)), "a damaged .npy header (fortran_order"),
    (npy_bytes(GOOD.replace("'<f4'", "'<q9'"), bytes(16)), "a damaged .npy header (descr"),
    (npy_bytes(GOOD.replace("'<f4'", "'|O'"), bytes(16)), "not numbers"),
    (npy_bytes(GOOD.replace("'descr'", "'kind'"), bytes(16)), "not a dict of descr"),
    (npy_bytes("__import__('os').system('false')", bytes(16)), "a damaged .npy header"),
    (npy_bytes("[" * 20000 + "]" * 20000, version=2), "at most 10000 are read"),
    (npy_bytes("(" * 5000 + ")" * 5000, version=2), "a damaged .npy header"),
    (npy_bytes(GOOD, bytes(16))[:6] + bytes([7, 0]) + npy_bytes(GOOD, bytes(16))[8:],
     "a damaged .npy header (format version 7)"),
])
def test_damaged_npy_headers_are_refused_saying_why(host_pipelines, tmp_path, contents,
                                                    message):
    (tmp_path / "in.npy").write_bytes(contents)
    refused(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'in.npy'}"), message)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.one_of(st.text(max_size=200), st.sampled_from([
           GOOD, GOOD + "\n   ", GOOD.replace("'<f4'", "'>i2'"), GOOD.replace("False", "True"),
           GOOD.replace("(2, 2)", "()"), GOOD.replace("(2, 2)", "(0, 3)")])),
       version=st.sampled_from([1, 2, 3]), data=st.binary(max_size=40), cut=st.integers(0, 300))
def test_any_npy_bytes_read_as_an_array_or_refused_saying_why(tmp_path, header, version, data,
                                                              cut):
    """Whatever a .npy file holds (a header of any text, data of any length, cut anywhere), the
    reader gives the array numpy's np.load gives for it (with the header's whitespace as numpy
    writes it: np.load's own parser refuses others from Python 3.12 on), or a shim ArgumentError
    naming the argument: never another exception."""
    import shim
    from shim.cli import images

    contents = npy_bytes(header.encode("utf8", "surrogatepass").decode("latin1"), data, version)
    contents = contents[:len(contents) - cut] if cut < len(contents) else contents
    path = tmp_path / "in.npy"
    path.write_bytes(contents)
    try:
        got = images.read(str(path), "input")
    except shim.ArgumentError as e:
        assert str(e).startswith("input:"), e
        return
    # Read: the same file with its header as numpy writes one (no whitespace before the
    # newline that ends it), which np.load takes on every Python, must give the same array.
    width = 2 if contents[6] == 1 else 4
    length = int.from_bytes(contents[8:8 + width], "little")
    header = contents[8 + width:8 + width + length].strip() + b"\n"
    normal = tmp_path / "numpy.npy"
    normal.write_bytes(contents[:8] + len(header).to_bytes(width, "little") + header
                       + contents[8 + width + length:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = np.load(normal, allow_pickle=False)
    np.testing.assert_array_equal(got, expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype.newbyteorder("=")


def test_0_d_buffers(odd, tmp_path):
    library = odd["zero_dim"]
    np.save(tmp_path / "two_d.npy", np.array([[1.5, 7], [9, 9]], np.float32))
    done = succeeded(run(library, f"input={tmp_path / 'two_d.npy'}", f"output={tmp_path / 'o.npy'}"))
    assert ('Warning: Image for Input "input" has 2 dimensions, but only the first 0 were used; '
            'data loss may have occurred.') in done.stderr
    assert np.load(tmp_path / "o.npy") == np.float32(3)
    # An 8-bit image into it: its first pixel, converted (numpy's arithmetic on a 0-D array
    # gives a scalar, which no Buffer takes).
    iio = pytest.importorskip("imageio.v3")
    iio.imwrite(tmp_path / "gray.png", np.array([[51, 255], [0, 0]], np.uint8))
    succeeded(run(library, f"input={tmp_path / 'gray.png'}", f"output={tmp_path / 'o.npy'}"))
    assert np.load(tmp_path / "o.npy") == np.float32(0.4)
    for extents in ("estimate", "auto", "[]"):
        done = succeeded(run(library, f"input=constant:4:{extents}", f"output={tmp_path / 'o.npy'}"))
        assert np.load(tmp_path / "o.npy") == np.float32(8)


@pytest.mark.parametrize("make, message", [
    (lambda path: path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64)), "is not a .npy file"),
    (lambda path: path.write_text("hello\n"), "is not a .npy file"),
    (lambda path: path.mkdir(), "is a directory"),
])
def test_input_files_that_are_not_what_they_say(host_pipelines, tmp_path, make, message):
    make(tmp_path / "in.npy")
    done = refused(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'in.npy'}"),
                   f"input: {tmp_path / 'in.npy'} {message}")
    assert "pickle" not in done.stderr


def test_an_npy_header_cut_open(host_pipelines, tmp_path):
    np.save(tmp_path / "in.npy", np.zeros((4, 5), np.float32))
    header = (tmp_path / "in.npy").read_bytes()
    (tmp_path / "in.npy").write_bytes(header.replace(b"}", b"(", 1))  # np.load: TokenError
    refused(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'in.npy'}"),
            f"input: cannot read {tmp_path / 'in.npy'}: ")


def test_an_npy_header_that_claims_petabytes(host_pipelines, tmp_path):
    with open(tmp_path / "liar.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (100000, 100000, 100000)})
        f.write(bytes(64))
    refused(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'liar.npy'}"),
            f"input: cannot read {tmp_path / 'liar.npy'}: its header says 1000000000000000 "
            f"elements of 4 bytes, and 64 bytes follow it")  # (checked before allocating)


def _png(width, height, bits, colour):
    """A PNG's bytes: this header, and a hundred zero bytes of pixels."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, bits, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(100)))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("library, contents, message", [
    # Ten billion pixels: Pillow's decompression-bomb refusal (8-bit gray).
    ("PIL", _png(100000, 100000, 8, 0), "Image size (10000000000 pixels) exceeds limit"),
    # 16-bit RGB, which pypng reads: too little data, cut short, a damaged header.
    ("png", _png(10, 10, 16, 2), "Wrong size for decompressed IDAT chunk"),
    ("png", _png(10, 10, 16, 2)[:40], "End of file whilst reading chunk"),
    ("png", _png(10, 10, 16, 2)[:30] + b"\xff" + _png(10, 10, 16, 2)[31:], "Checksum error in IHDR"),
], ids=["bomb", "short_data", "cut", "bad_checksum"])
def test_malformed_png_files(host_pipelines, tmp_path, library, contents, message):
    pytest.importorskip(library)
    (tmp_path / "in.png").write_bytes(contents)
    done = refused(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / 'in.png'}"),
                   f"input: cannot read {tmp_path / 'in.png'}: ")
    assert message in done.stderr


@pytest.mark.parametrize("suffix, length", [
    (".png", 0), (".png", 1), (".png", 8), (".jpg", 1), (".jpg", 3), (".pgm", 1), (".tif", 8),
    (".tif", 9),
])
def test_image_files_cut_short(host_pipelines, tmp_path, suffix, length):
    # Pillow raises what it meets on a damaged file: struct.error, SyntaxError, IndexError...
    iio = pytest.importorskip("imageio.v3")
    rng = np.random.default_rng(0)
    image = rng.random((8, 9), dtype=np.float32) if suffix == ".tif" else \
        rng.integers(0, 256, (8, 9), dtype=np.uint8)
    iio.imwrite(tmp_path / f"whole{suffix}", image)
    (tmp_path / f"in{suffix}").write_bytes((tmp_path / f"whole{suffix}").read_bytes()[:length])
    refused(run(host_pipelines["brighten", "bundled"], f"input={tmp_path / f'in{suffix}'}"),
            f"input: cannot read {tmp_path / f'in{suffix}'}: ")


# --- outputs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, message", [
    ("missing/out.npy", "no such directory"),
    ("missing/out.png", "no such directory"),
    ("a_directory.npy", "is a directory"),
])
def test_an_output_that_cannot_be_written_is_refused_before_any_run(host_pipelines, tmp_path,
                                                                    name, message):
    (tmp_path / "a_directory.npy").mkdir()
    refused(run(host_pipelines["brighten", "bundled"], "input=zero:[4,4]",
                f"output={tmp_path / name}"), f"output: cannot write {tmp_path / name}: {message}")


def test_an_upper_case_suffix_is_written_where_it_says(host_pipelines, tmp_path):
    succeeded(run(host_pipelines["brighten", "bundled"], "input=constant:1:[4,3]",
                  "output=OUT.NPY", cwd=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["OUT.NPY"]
    np.testing.assert_array_equal(np.load(tmp_path / "OUT.NPY"), np.full((3, 4), 3, np.float32))


@pytest.mark.parametrize("name", ["out.png", "out.npy"])
def test_a_full_disk_is_an_error_naming_the_output(host_pipelines, tmp_path, name):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    (tmp_path / name).symlink_to("/dev/full")
    done = run(host_pipelines["brighten", "bundled"], "input=zero:[4,4]",
               f"output={tmp_path / name}")
    assert done.returncode == -signal.SIGABRT
    assert f"output: cannot write {tmp_path / name}: [Errno 28] No space left" in done.stderr
    assert "Exception ignored" not in done.stderr


def test_two_outputs_to_one_file_are_refused(host_pipelines, tmp_path):
    refused(run(host_pipelines["sum_diff", "bundled"], "a=zero:[4,4]", "b=zero:[4,4]",
                f"sum={tmp_path / 'x.npy'}", f"diff={tmp_path / 'x.npy'}"),
            f"diff: sum is saved to {tmp_path / 'x.npy'} too")


def test_a_profile_that_cannot_be_written_is_refused_before_any_run(host_pipelines, tmp_path):
    refused_as_an_option_of_the_shims(
        run(host_pipelines["brighten", "bundled"], "input=zero:[4,4]",
            f"--profile={tmp_path / 'missing' / 't.json'}"),
        f"--profile: cannot write {tmp_path / 'missing' / 't.json'}: no such directory")


def test_a_float16_output_saved_as_png(odd, tmp_path):
    iio = pytest.importorskip("imageio.v3")
    succeeded(run(odd["odd_types"], "input=constant:2:[4,3]", f"quarter={tmp_path / 'q.png'}"))
    written = iio.imread(tmp_path / "q.png")
    assert written.dtype == np.uint16
    assert (written == 32768).all()  # 0.5 of 65535, rounded


@pytest.mark.parametrize("values, dtype, expected", [
    (np.array([0.0, 0.5, 1.0], np.float16), np.uint16, [0, 32768, 65535]),
    (np.array([0.0, 0.5, 1.0], np.float16), np.uint8, [0, 128, 255]),
    # Halide converts to 32 bits in double precision: 1.0 is 2^32 - 1, not 0.
    (np.array([0.0, 0.5, 1.0], np.float32), np.uint32, [0, 2147483648, 4294967295]),
    (np.array([1.0], np.float32), np.int32, [-1]),
])
def test_float_conversions_do_not_overflow(values, dtype, expected):
    from shim.cli.images import convert

    with np.errstate(all="raise"):
        converted = convert(values, dtype)
    assert converted.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(converted, np.array(expected, dtype))


# --- the process -----------------------------------------------------------------------------

def test_out_of_memory_is_an_error_not_a_traceback(host_pipelines):
    resource = pytest.importorskip("resource")

    def limit():  # 3 GiB of address space; the input needs 3.35 GiB
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = run(host_pipelines["brighten", "bundled"], "input=zero:[30000,30000]",
               preexec_fn=limit)
    assert done.returncode != 0
    assert "out of memory" in done.stderr or "this machine has" in done.stderr, done.stderr


def test_a_huge_benchmark_min_time_caps_the_iterations_per_sample(monkeypatch):
    from types import SimpleNamespace

    from shim.cli import timing

    # A clock on which the first three samples take a microsecond, and each later one an age.
    steps = iter([1e-6] * 6 + [1e306] * 2)
    now = [0.0]

    def clock():
        now[0] += next(steps)
        return now[0]

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    result = timing.benchmark(lambda: None, 1e305)  # min_time / 3e-6 is beyond any float
    assert result.best == pytest.approx(1e-6)
    assert (result.samples, result.iterations) == (4, 3 + 1_000_000)


def test_a_closed_stdout_still_saves_the_outputs(host_pipelines, tmp_path):
    # (| head -1: the reader leaves before the run has said everything)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = run(host_pipelines["brighten", "bundled"], "input=constant:1:[4,3]",
                   f"output={tmp_path / 'out.npy'}", "--success", stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), np.full((3, 4), 3, np.float32))


def test_a_device_that_is_not_here_is_an_error_naming_the_flag(host_pipelines):
    from shim.backends import cuda as cuda_backend

    if not cuda_backend.unavailable_reason():
        pytest.skip("this machine has CUDA")
    refused_as_an_option_of_the_shims(
        run(host_pipelines["brighten", "bundled"], "input=zero:[4,4]", "--device=cuda"),
        "error: --device: ")
