"""The defects the fuzz targets (fuzz/, docs/security.md's "Fuzzing") found, each as a plain
test: the input that found it stays in the target's corpus (fuzz/corpus/TARGET/regression-*),
which every fuzz run replays, and this file says the same without the fuzzer."""

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shim
from shim.base import elf
from shim.buffers.buffer_arguments import zeroed
from shim.calls.metadata import read_metadata
from shim.native import ffi

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"


def _metadata(name=b"p", target=b"x86-64-linux", arguments=()):
    """A halide_filter_metadata_t of ``arguments`` ((name, kind, dimensions, code, bits) each),
    and what keeps its memory alive."""
    keep = [ffi.new("char[]", name) if name is not None else ffi.NULL,
            ffi.new("char[]", target) if target is not None else ffi.NULL]
    meta = ffi.new("struct halide_filter_metadata_t *")
    meta.version, meta.name, meta.target = 1, keep[0], keep[1]
    array = ffi.new("struct halide_filter_argument_t[]", max(len(arguments), 1))
    for arg, (arg_name, kind, dimensions, code, bits) in zip(array, arguments):
        keep.append(ffi.new("char[]", arg_name) if arg_name is not None else ffi.NULL)
        arg.name, arg.kind, arg.dimensions = keep[-1], kind, dimensions
        arg.type.code, arg.type.bits, arg.type.lanes = code, bits, 1
    meta.num_arguments, meta.arguments = len(arguments), array
    return meta, keep, array


@pytest.mark.parametrize("where", ["name", "target", "argument name", "arguments"])
def test_metadata_with_a_null_string_or_array_is_refused(where):
    """fuzz/corpus/metadata/regression-null-string: a NULL string in a library's metadata was
    a raw RuntimeError of cffi's (``string()`` of NULL) out of shim.load."""
    meta, _keep, _array = _metadata(
        name=None if where == "name" else b"p", target=None if where == "target" else b"x",
        arguments=[(None if where == "argument name" else b"out", 2, 2, 2, 32)])
    if where == "arguments":
        meta.arguments = ffi.NULL
    with pytest.raises(ValueError, match="NULL"):
        read_metadata(meta)


@pytest.mark.parametrize("code, bits", [(0, 0), (1, 7), (2, 8), (3, 32), (4, 32), (9, 32)])
def test_metadata_with_a_type_halide_has_not_is_refused(code, bits):
    """fuzz/corpus/metadata/regression-type-with-no-bits: a scalar argument of type code 0 with
    0 bits was a raw AttributeError (no field ``i0`` in halide_scalar_value_t) out of
    shim.load."""
    meta, _keep, _array = _metadata(arguments=[(b"k", 0, 0, code, bits)])
    meta.arguments[0].scalar_def = _value = ffi.new("struct halide_scalar_value_t *")
    with pytest.raises(ValueError, match=f"type code {code} with {bits} bits"):
        read_metadata(meta)


def test_every_type_halide_makes_is_read():
    types = [(0, 8), (0, 16), (0, 32), (0, 64), (1, 1), (1, 8), (1, 16), (1, 32), (1, 64),
             (2, 16), (2, 32), (2, 64), (3, 64), (4, 16)]
    meta, _keep, _array = _metadata(arguments=[(f"a{i}".encode(), 0, 0, code, bits)
                                               for i, (code, bits) in enumerate(types)])
    assert [(a.type.code, a.type.bits) for a in read_metadata(meta).arguments] == types


def test_a_shape_with_a_negative_extent_is_an_argument_error():
    """fuzz/corpus/metadata/regression-negative-estimated-extent: an output left out, sized
    from estimates whose extent is negative, was numpy's raw ValueError ("negative dimensions
    are not allowed") out of the call."""
    with pytest.raises(shim.ArgumentError, match="output: shape \\(2, -1\\) has a negative extent"):
        zeroed((2, -1), np.dtype(np.float32), "output")
    assert zeroed((2, 0), np.dtype(np.float32), "output").shape == (2, 0)


@pytest.mark.parametrize("low, extent", [(-2**31 - 1, 16), (0, 2**31), (2**40, 16)])
def test_metadata_with_estimates_no_dimension_holds_is_refused(low, extent):
    """fuzz/corpus/metadata/regression-estimate-beyond-int32: an output left out, sized from
    an estimated min of -236394999971905, was a raw OverflowError of cffi's (the min does not
    fit halide_dimension_t's int32) out of the call."""
    meta, keep, _array = _metadata(arguments=[(b"out", 2, 1, 2, 32)])
    keep += [ffi.new("int64_t *", low), ffi.new("int64_t *", extent)]
    keep.append(ffi.new("int64_t *[]", keep[-2:]))
    meta.arguments[0].buffer_estimates = keep[-1]
    with pytest.raises(ValueError, match=f"estimates min {low}, extent {extent} for dimension 0"):
        read_metadata(meta)
    keep[-3][0], keep[-2][0] = -2**31, 2**31 - 1
    assert read_metadata(meta).arguments[0].buffer_estimates == ((-2**31, 2**31 - 1),)


# --- ELF files (fuzz/corpus/elf_reader) --------------------------------------------------------

def _elf(path, sections, shentsize=64, shnum=None, tail=b""):
    """A 64-bit little-endian shared object whose section headers are ``sections``
    ((sh_type, offset, size, link, entsize) each), followed by ``tail`` (at offset 64)."""
    shoff = 64 + len(tail)
    header = (b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, shentsize,
        len(sections) if shnum is None else shnum, 0))
    table = b"".join(struct.pack("<IIQQQQIIQQ", 0, kind, 2, 0, offset, size, link, 1, 8, entsize)
                     for kind, offset, size, link, entsize in sections)
    path.write_bytes(header + tail + table)
    return path


def _symbols(names_at):
    """A dynamic symbol table: the null symbol, then a global function per name offset."""
    return bytes(24) + b"".join(struct.pack("<IBBHQQ", at, 0x12, 0, 7, 0, 0) for at in names_at)


def test_section_headers_that_do_not_fit_the_file_are_refused(tmp_path):
    """fuzz/corpus/elf_reader/regression-*-read-65535-times: a header's section count and a
    header size of 0 had the reader read one header 65535 times, and the dynamic symbol table
    it describes as often: 60 seconds for a 16 KiB file, for each of the three reads shim.load
    makes."""
    symbols = _symbols([1])
    path = _elf(tmp_path / "lib.so", [(11, 64, len(symbols), 0, 24)], shentsize=0, shnum=65535,
                tail=symbols)
    with pytest.raises(elf.NotELF, match="65535 section headers of 0 bytes"):
        elf.dynamic_symbols(path)
    with pytest.raises(shim.ArgumentError, match="is not a Halide pipeline: malformed ELF"):
        shim.load(path)


def test_only_the_first_dynamic_symbol_table_is_read(tmp_path):
    """(The same, with each header its own: ELF has one table.)"""
    strings = b"\0first_argv\0second_argv\0"
    symbols_1, symbols_2 = _symbols([1]), _symbols([12])
    tail = strings + symbols_1 + symbols_2
    at = 64 + len(strings)
    path = _elf(tmp_path / "lib.so", [(3, 64, len(strings), 0, 0),
                                      (11, at, len(symbols_1), 0, 24),
                                      (11, at + len(symbols_1), len(symbols_2), 0, 24)], tail=tail)
    assert elf.dynamic_symbols(path) == ({"first_argv": True}, frozenset())


def test_a_name_that_runs_past_its_string_table_is_refused(tmp_path):
    """A name read on to the file's end, past its string table (the reader's cost grew with
    the file's size for each symbol)."""
    strings = b"\0name"  # (no NUL: the name runs on into what follows)
    symbols = _symbols([1])
    path = _elf(tmp_path / "lib.so", [(3, 64, len(strings), 0, 0),
                                      (11, 64 + len(strings), len(symbols), 0, 24)],
                tail=strings + symbols)
    with pytest.raises(elf.NotELF, match="malformed"):
        elf.dynamic_symbols(path)


# --- DLPack (fuzz/corpus/dlpack) ---------------------------------------------------------------

@pytest.mark.parametrize("byte_offset", [2**64 - 8, 2**64 - 2**40])
def test_a_host_tensor_beyond_the_address_space_is_refused(byte_offset):
    """fuzz/corpus/dlpack/regression-host-address-beyond-64-bits: a CPU tensor whose data plus
    byte_offset is past 2**64 was numpy's raw OverflowError out of shim.from_dlpack."""
    from test_dlpack_hostile import Hostile

    producer = Hostile(byte_offset=byte_offset)
    with pytest.raises(shim.ArgumentError, match="beyond the 64-bit address space"):
        shim.from_dlpack(producer)
    assert not producer.consumed
    # (elements at the end of the address space: to the byte, taken; one byte past, refused)
    producer = Hostile(data=2**64 - 20, byte_offset=0, shape=(2, 3), strides=(3, 1))
    with pytest.raises(shim.ArgumentError, match="beyond the 64-bit address space"):
        shim.from_dlpack(producer)
    producer = Hostile(data=2**64 - 24, byte_offset=0, shape=(2, 3), strides=(3, 1))
    assert shim.from_dlpack(producer).dim(0).extent() == 3  # (its memory is never read)


# --- arrays (fuzz/corpus/array_likes) ----------------------------------------------------------

def test_a_buffer_of_a_format_numpy_does_not_read_is_an_argument_error(host_pipelines):
    """fuzz/corpus/array_likes/regression-memoryview-of-format-P: a memoryview of pointers
    (format 'P', which numpy does not read) was numpy's raw ValueError out of shim.Buffer and
    out of a pipeline call."""
    pointers = memoryview(bytearray(48)).cast("B").cast("P")
    with pytest.raises(shim.ArgumentError, match="buffer: memoryview's buffer \\(format 'P'"):
        shim.Buffer(pointers)
    brighten = shim.load(host_pipelines["brighten", "no_runtime"])
    with pytest.raises(shim.ArgumentError, match="input: memoryview's buffer \\(format 'P'"):
        brighten(pointers, scale=2.0, offset=1.0)


# --- OpenCL kernel prototypes (fuzz/corpus/opencl_prototypes) ----------------------------------

_EMPTY_NAME = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import shim
from support.opencl_kernels import launch
try:
    launch(b"__kernel void k(__global int *a) {{ a[0] = 1; }}", b"")
except shim.DeviceError as e:
    print("refused:", e)
"""


def test_a_kernel_of_no_name_is_looked_for_in_no_prototype():
    """fuzz/corpus/opencl_prototypes/regression-empty-kernel-name: the prototype reader looked
    for an empty name at every byte of the kernels' source and then past its end, reading the
    heap until something there looked like a prototype, or the process died
    (AddressSanitizer: heap-buffer-overflow). In a child, so that a crash is a failure here."""
    try:
        shim.device("opencl")
    except shim.DeviceUnavailable as e:
        pytest.skip(f"no OpenCL device: {e}")
    done = subprocess.run([sys.executable, "-c", _EMPTY_NAME], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "clCreateKernel" in done.stdout, done.stdout


_REWRITE = """
import sys
from shim.backends.opencl import program_source
source = open(sys.argv[1], "rb").read().split(b"\\0", 1)[1]
rewritten = program_source(source)
print(source.count(b"kernel void"), rewritten.count(b"kernel void"))
"""


def test_a_kernel_declared_inside_anothers_prototype_is_not_rewritten_twice():
    """fuzz/corpus/opencl_prototypes/regression-kernel-declared-inside-a-prototype: the source
    rewrite that gives buffers offsets (opencl_prototypes.c) met a kernel declared inside the
    prototype it had just rewritten and copied the text between them at a negative length
    (AddressSanitizer: negative-size-param; without it, part of the source copied twice, a
    kernel declared once more than the source does). In a child, so that a crash is a failure
    here."""
    found = CORPUS / "opencl_prototypes" / "regression-kernel-declared-inside-a-prototype"
    done = subprocess.run([sys.executable, "-c", _REWRITE, str(found)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    kernels, kernels_rewritten = map(int, done.stdout.split())
    assert kernels_rewritten == kernels == 4
