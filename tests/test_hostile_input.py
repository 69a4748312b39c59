"""Hostile input (issue 11): memory that must not be written, foreign byte orders, broadcasts
and shapes too large to copy, values that do not fit, files that are not pipelines. Each is
refused with a named shim exception saying what is wrong, or handled as numpy would; never a
crash, a raw Python error, or silently wrong data."""

import mmap
import signal
import struct
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import shim
from shim.native import CallContext, ffi, lib


@pytest.fixture
def image():
    return np.arange(16 * 16, dtype=np.float32).reshape(16, 16)


def brightened(image):
    """brighten's result with scale=2 and offset=0, which float arithmetic computes exactly."""
    return image.astype(np.float32) * np.float32(2)


def swapped(dtype):
    """``dtype`` in the byte order this machine does not use (big-endian on x86 and ARM)."""
    return np.dtype(dtype).newbyteorder("S")


def peak_bytes_allocated(function):
    """The most memory numpy and Python held at once, above what was there, while ``function``
    ran (numpy reports its allocations to tracemalloc)."""
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- read-only memory as an output -------------------------------------------------------


def read_only_array(kind, tmp_path):
    """A (16, 16) float32 array of zeros over memory nobody may write."""
    if kind == "numpy":
        array = np.zeros((16, 16), np.float32)
        array.flags.writeable = False
        return array
    if kind == "bytes":
        return np.frombuffer(bytes(16 * 16 * 4), np.float32).reshape(16, 16)
    path = tmp_path / "zeros.bin"
    path.write_bytes(bytes(16 * 16 * 4))
    with open(path, "rb") as f:
        memory = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(memory, np.float32).reshape(16, 16)


@pytest.mark.parametrize("kind", ["numpy", "bytes", "mmap"])
def test_a_buffer_over_read_only_memory_is_refused_as_an_output(load, image, tmp_path, kind):
    array = read_only_array(kind, tmp_path)
    with pytest.raises(shim.ArgumentError, match="read-only") as e:
        load("brighten")(image, output=shim.Buffer(array))
    assert e.value.argument == "output"
    assert not array.any()


def test_crops_and_slices_of_read_only_buffers_are_refused_as_outputs(load, image, tmp_path):
    frozen = shim.Buffer(read_only_array("bytes", tmp_path))
    with pytest.raises(shim.ArgumentError, match="read-only"):
        load("brighten")(image, output=frozen.cropped(0, 0, 8))
    planes = np.zeros((16, 16, 2), np.float32)
    planes.flags.writeable = False
    with pytest.raises(shim.ArgumentError, match="read-only"):
        load("brighten")(image, output=shim.Buffer(planes).sliced(0, 1))
    assert not planes.any()


def test_a_read_only_buffer_cannot_be_marked_device_dirty():
    # Device results would be copied back into memory that must not change.
    array = np.zeros(8, np.int32)
    array.flags.writeable = False
    buf = shim.Buffer(array)
    buf.copy_to_device(shim.device("host"))
    with pytest.raises(shim.ArgumentError, match="read-only"):
        buf.set_device_dirty()
    assert not buf.device_dirty()
    buf.device_free()


def test_a_buffer_without_a_device_allocation_cannot_be_marked_device_dirty():
    buf = shim.Buffer(np.arange(6, dtype=np.int32))
    buf.set_host_dirty(False)
    with pytest.raises(shim.ArgumentError, match="no device allocation"):
        buf.set_device_dirty()
    np.testing.assert_array_equal(buf.numpy(), np.arange(6))  # reads still work
    crop = buf.cropped(0, 1, 3)  # the proxy interface: its parent has no allocation either
    with pytest.raises(shim.ArgumentError, match="no device allocation"):
        crop.set_device_dirty()
    np.testing.assert_array_equal(crop.numpy(), [1, 2, 3])


# --- byte order ------------------------------------------------------------------------------


def test_inputs_in_the_other_byte_order_are_read_in_it(load):
    a = np.arange(12, dtype=np.int32).reshape(3, 4) * 1000
    b = np.full((3, 4), 7, np.int32)
    total, diff = load("sum_diff")(a.astype(swapped(a.dtype)), shim.Buffer(b), sum=(3, 4),
                                   diff=(3, 4))
    np.testing.assert_array_equal(np.asarray(total), a + b)
    np.testing.assert_array_equal(np.asarray(diff), a - b)


def test_outputs_in_the_other_byte_order_receive_results_in_it(load, image):
    out = np.zeros(image.shape, swapped(np.float32))
    result = load("brighten")(image.astype(swapped(np.float32)), scale=2.0, offset=0.0, output=out)
    assert result is out and out.dtype == swapped(np.float32)
    np.testing.assert_array_equal(out, brightened(image))


def test_a_buffer_over_memory_in_the_other_byte_order_is_refused():
    # A Buffer wraps memory without copying, so it cannot convert it.
    with pytest.raises(shim.ArgumentError, match=r"newbyteorder\('='\)") as e:
        shim.Buffer(np.zeros(4, swapped(np.float32)))
    assert e.value.argument == "buffer"
    with pytest.raises(shim.ArgumentError, match="byte order") as e:
        shim.Buffer(shape=(4,), dtype=swapped(np.int32))
    assert e.value.argument == "dtype"


# --- broadcasts and sizes ---------------------------------------------------------------------


def test_a_broadcast_too_large_for_halide_is_refused_before_any_copy(load):
    huge = np.broadcast_to(np.float32(1), (65536, 65536))  # 16 GiB if made dense
    with pytest.raises(shim.ArgumentError, match="4294967296 elements; .* at most 2147483647") as e:
        load("brighten")(huge, output=(16, 16))
    assert e.value.argument == "input"


@pytest.mark.parametrize("broadcast", [
    lambda: np.broadcast_to(np.float32(3), (2048, 2048)),                  # x needs a copy
    lambda: np.broadcast_to(np.arange(2048, dtype=np.float32), (2048, 2048)),  # none needed
], ids=["scalar", "row"])
def test_broadcast_inputs_are_not_made_dense(load, broadcast):
    image = broadcast()
    out = np.zeros(image.shape, np.float32)
    peak = peak_bytes_allocated(lambda: load("brighten")(image, scale=2.0, offset=0.0, output=out))
    np.testing.assert_array_equal(out, brightened(image))
    assert peak < out.nbytes // 16  # one row at most, never the whole 16 MiB


def test_outputs_too_large_are_refused_before_allocating(load, image):
    with pytest.raises(shim.ArgumentError, match="1000000000000 elements") as e:
        load("brighten")(image, output=(10**6, 10**6))
    assert e.value.argument == "output"
    with pytest.raises(shim.ArgumentError, match="GiB of memory; this machine has") as e:
        shim.Buffer(shape=(10**6, 10**6), dtype=np.float32)  # 3.6 TiB
    assert e.value.argument == "shape"


def test_empty_arrays_are_refused_as_empty(load):
    with pytest.raises(shim.ArgumentError, match=r"the array is empty \(shape \(0, 16\)\)") as e:
        load("brighten")(np.zeros((0, 16), np.float32), output=(16, 16))
    assert e.value.argument == "input"
    with pytest.raises(shim.ArgumentError, match="empty") as e:
        load("brighten")(np.zeros((16, 16), np.float32), output=(16, 0))
    assert e.value.argument == "output"


def test_output_shapes_must_be_integers(load, image):
    with pytest.raises(shim.ArgumentError, match=r"sequence of integers .*16\.7") as e:
        load("brighten")(image, output=(16.7, 16))
    assert e.value.argument == "output"
    out = load("brighten")(image, scale=2.0, offset=0.0, output=(np.int64(16), np.uint8(16)))
    np.testing.assert_array_equal(np.asarray(out), brightened(image))


def test_messages_about_dimensions_name_the_numpy_axis(load):
    too_narrow = np.zeros((12, 10), np.uint16)  # blur3x3 reads two columns more than it writes
    with pytest.raises(shim.BoundsError, match=r"dimension 0 \(x, numpy axis 1\) over \[0, 12\)"):
        load("blur3x3")(too_narrow, output=(10, 10))


# --- scalars ---------------------------------------------------------------------------------


def test_float_scalars_that_do_not_fit_are_refused(load, image):
    for value in (10**400, 1e39, np.float64(-1e300)):
        with pytest.raises(shim.ArgumentError, match="does not fit in float32") as e:
            load("brighten")(image, offset=value, output=image.shape)
        assert e.value.argument == "offset"
    out = load("brighten")(image, scale=0.0, offset=float("inf"), output=image.shape)
    assert np.isposinf(np.asarray(out)).all()  # infinity itself is a float32 value


def test_complex_scalars_are_refused_not_truncated(load, image):
    for value in (np.complex64(1 + 2j), 2 + 0j):
        with pytest.raises(shim.ArgumentError, match="not complex") as e:
            load("brighten")(image, scale=value, output=image.shape)
        assert e.value.argument == "scale"


def test_integers_too_long_to_print_are_refused_by_size(load):
    with pytest.raises(shim.ArgumentError, match=r"about 10\*\*5000 does not fit in int16"):
        load("mix")(np.ones((4, 4), np.uint8), np.ones((4, 4), np.float32), offset=10**5000,
                    output=(4, 4))


# --- crops and slices ------------------------------------------------------------------------


def test_crop_coordinates_must_be_integers():
    buf = shim.Buffer(np.arange(20, dtype=np.int32).reshape(4, 5))
    with pytest.raises(shim.ArgumentError, match=r"expected an integer, got 1\.5") as e:
        buf.cropped(0, 1.5, 2)
    assert e.value.argument == "min"
    with pytest.raises(shim.ArgumentError) as e:
        buf.cropped([(0, 2.5)])
    assert e.value.argument == "extent"
    with pytest.raises(shim.ArgumentError, match="expected \\(min, extent\\) pairs"):
        buf.cropped([1, 2])
    with pytest.raises(shim.ArgumentError) as e:
        buf.sliced(0.0, 1)
    assert e.value.argument == "dimension"
    crop = buf.cropped(np.int64(0), np.int32(1), np.uint8(2))
    np.testing.assert_array_equal(crop.numpy(), np.arange(20).reshape(4, 5)[:, 1:3])


def test_slicing_down_to_zero_dimensions_gives_one_element():
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    element = shim.Buffer(data).sliced(1, 2).sliced(0, 3)  # y = 2, then x = 3
    assert element.dimensions() == 0 and element.shape == ()
    assert int(np.asarray(element)) == data[2, 3]
    element.numpy()[()] = -1
    assert data[2, 3] == -1  # a view, like every slice
    assert int(np.asarray(element.cropped([]))) == -1  # and so is a crop of it


# --- files that are not pipelines -----------------------------------------------------------


def test_load_without_a_path():
    with pytest.raises(shim.ArgumentError, match="got NoneType") as e:
        shim.load(None)
    assert e.value.argument == "path"


def host_elf_header():
    """The first 20 bytes of an ELF file for this machine: the shim's own native library's."""
    with open(shim._native.__file__, "rb") as f:
        return f.read(20)


def test_an_elf_header_with_offsets_beyond_any_file(tmp_path):
    header = bytearray(host_elf_header() + bytes(44))
    assert header[4] == 2  # this test writes an ELF64 header
    order = "<" if header[5] == 1 else ">"
    struct.pack_into(order + "Q", header, 0x28, 2**64 - 16)  # e_shoff: past the end of any file
    struct.pack_into(order + "HH", header, 0x3A, 64, 1)  # e_shentsize, e_shnum
    path = tmp_path / "random.so"
    path.write_bytes(bytes(header))
    with pytest.raises(shim.ArgumentError, match="not a Halide pipeline: malformed ELF") as e:
        shim.load(path)
    assert e.value.argument == "path"


def test_a_pipeline_for_another_machine(host_pipelines, tmp_path):
    data = bytearray(host_pipelines["brighten", "bundled"].read_bytes())
    order = "<" if data[5] == 1 else ">"
    here, = struct.unpack_from(order + "H", data, 18)
    other, name = (62, "x86-64") if here != 62 else (183, "AArch64")
    struct.pack_into(order + "H", data, 18, other)
    path = tmp_path / "foreign.so"
    path.write_bytes(bytes(data))
    with pytest.raises(shim.ArgumentError, match=f"holds 64-bit .* {name} code; this process runs"):
        shim.load(path)


# --- error text from Halide ------------------------------------------------------------------


def errors_reported(*messages):
    """The error text of a call in which ``messages`` were reported to halide_error, as a
    pipeline's threads report them."""
    context = CallContext.begin()
    try:
        previous = lib.shim_call_enter(context.pointer)
        for message in messages:
            lib.halide_error(ffi.NULL, message)
        lib.shim_call_leave(previous)
        return context.errors()
    finally:
        context.end()


def test_each_error_message_is_a_line_of_its_own():
    assert errors_reported(b"first", b"second\n", b"third") == "first\nsecond\nthird\n"


def test_error_text_cut_at_its_cap_says_so():
    text = errors_reported(b"x" * (70 * 1024), b"lost")
    assert text.startswith("x" * 1000)
    assert text.endswith("... (truncated: error text is capped at 64 KiB)\n")
    assert "lost" not in text


# --- the command line ------------------------------------------------------------------------


def test_run_with_an_input_too_large_is_refused_naming_it(host_pipelines):
    done = subprocess.run([sys.executable, "-m", "shim", "run",
                           str(host_pipelines["brighten", "bundled"]),
                           "--input=random:100000x100000", "scale=1", "offset=0", "output=:"],
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGABRT  # (as RunGen's failures end)
    assert "error: input: shape (100000, 100000) has 10000000000 elements" in done.stderr
    assert "Traceback" not in done.stderr
