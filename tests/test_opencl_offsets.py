"""Crops at any offset bound in place on OpenCL: programs are built from Halide's source with
an element offset per buffer (native_stubs/backends/opencl_prototypes.c), so a crop at an offset
no sub-buffer can start at is launched as its allocation plus that offset, not staged. Results
against numpy, inside each crop and around it; staging (test_opencl_staging.py) only where a
kernel casts a buffer to a vector pointer, which needs the vector's alignment."""

import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import shim
from shim.backends import opencl as opencl_backend
from shim.native import ffi
from shim.pipelines.build import TARGETS

SENTINEL = -7
K = 3


@pytest.fixture(scope="module")
def times_k_plus_7(tmp_path_factory):
    """out(x, y) = inp(x, y) * k + 7, int32, gpu_tile'd 16 x 16: every buffer indexed by
    element."""
    import halide as hl

    x, y, xo, yo, xi, yi = hl.vars("x y xo yo xi yi")
    inp = hl.ImageParam(hl.Int(32), 2, "inp")
    k = hl.Param(hl.Int(32), "k")
    # (a name no other test's Func has: Halide renames a Func whose name the process used
    # before, as an earlier test's in-process build may have, "out" becoming "out$4")
    out = hl.Func("times_k_plus_7_out")
    out[x, y] = inp[x, y] * k + 7
    out.gpu_tile(x, y, xo, yo, xi, yi, 16, 16, hl.TailStrategy.GuardWithIf)
    work = tmp_path_factory.mktemp("offsets")
    obj, library = work / "times_k_plus_7.o", work / "times_k_plus_7.so"
    out.compile_to({hl.OutputFileType.object: str(obj)}, [inp, k], "times_k_plus_7",
                   hl.Target(f"{TARGETS['opencl']}-no_runtime"))
    subprocess.run(["cc", "-shared", "-o", str(library), str(obj)], check=True)
    return shim.load(library)


def device_contents(parent: shim.Buffer) -> np.ndarray:
    parent.set_device_dirty()
    parent.copy_to_host()
    return np.asarray(parent).copy()


def on_device(device, data: np.ndarray) -> shim.Buffer:
    buf = shim.Buffer(data)
    buf.copy_to_device(device)
    return buf


def staged_counts(profile) -> list:
    return [r.launch["staged"] for r in profile.records if r.kind == "launch"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=st.integers(0, 47), y=st.integers(0, 5), width=st.integers(1, 40),
       height=st.integers(1, 6), in_x=st.integers(0, 47), in_y=st.integers(0, 5))
def test_misaligned_crops_are_launched_in_place(times_k_plus_7, opencl, x, y, width, height,
                                                in_x, in_y):
    """Input and output crops of two parents on the device, at any offsets and sizes: numpy's
    values in the output crop, the sentinel around it, the input as it was, nothing staged."""
    data = np.arange(12 * 96, dtype=np.int32).reshape(12, 96) - 500
    source = on_device(opencl, data.copy())
    parent = on_device(opencl, np.full((12, 96), SENTINEL, np.int32))
    inp = source.cropped([(in_x, width), (in_y, height)])
    out = parent.cropped([(x, width), (y, height)])
    for crop in (inp, out):
        crop.set_min([0, 0])
    with shim.profile() as profile:
        times_k_plus_7(inp, K, out)
    assert staged_counts(profile) and all(n == 0 for n in staged_counts(profile))
    expected = np.full((12, 96), SENTINEL, np.int32)
    expected[y:y + height, x:x + width] = data[in_y:in_y + height, in_x:in_x + width] * K + 7
    np.testing.assert_array_equal(device_contents(parent), expected)
    np.testing.assert_array_equal(device_contents(source), data)


def test_a_misaligned_crop_gets_no_sub_buffer_and_no_staging(times_k_plus_7, opencl):
    parent = on_device(opencl, np.full((4, 40), SENTINEL, np.int32))
    out = parent.cropped([(1, 9), (1, 3)])
    out.set_min([0, 0])
    struct = ffi.cast("shim_cl_handle *", out.raw.device)
    assert struct.launch_mem == ffi.NULL  # (no sub-buffer can start there)
    times_k_plus_7(on_device(opencl, np.ones((3, 9), np.int32)), 2, out)
    assert struct.staging == ffi.NULL
    expected = np.full((4, 40), SENTINEL, np.int32)
    expected[1:4, 1:10] = 9
    np.testing.assert_array_equal(device_contents(parent), expected)


def test_only_element_aligned_uses_get_offsets():
    """What the rewrite gives an offset: buffers indexed by element, through a cast to a
    scalar no larger, or in vloadN / vstoreN; not one cast to a vector pointer, used bare, or
    read as a larger scalar; never the __local one or a scalar."""
    source = (b"#define __address_space__a __global\n"
              b"__kernel void k(__address_space__a const float *restrict _a, __global int *_b, "
              b"__global float *_c, __global uchar *_d, __global short *_e, __global int *_f, "
              b"const int _n, __local int16* __shared) {\n"
              b" float4 v = vload4(0, (__address_space__a float*)_a + _n); // _a bare in a comment\n"
              b" _b[_n] = ((__global int *)_c)[_n];\n"
              b" vstore4(v, 0, (__global float*)_c + _n);\n"
              b" ((__global int4 *)_d)[0] = (int4)(0);\n"
              b" _f[0] = *(_f + 1) + ((__global int *)_e)[0];\n"
              b"}\n")
    text = opencl_backend.program_source(source).decode()
    assert "shim_base_0" in text and "shim_base_1" in text and "shim_base_2" in text
    assert "shim_base_3" not in text and "shim_base_4" not in text and "shim_base_5" not in text
    assert text.count("shim_offset_") == 6  # three parameters, three uses
    assert "_a = shim_base_0 + shim_offset_0;" in text
    assert "// _a bare in a comment" in text  # (the rest of the source as it was)


def test_the_rewritten_program_compiles_and_runs_with_two_kernels(opencl):
    """A program of two kernels, one rewritten and one not: each launches with its own
    arguments (see test_opencl_staging.py's hand-written kernels for launches)."""
    text = opencl_backend.program_source(
        b"__kernel void a(__global int *_p, __local int16 *s) { _p[get_global_id(0)] = 1; }\n"
        b"__kernel void b(__global int *_q, __local int16 *s) "
        b"{ ((__global int2 *)_q)[get_global_id(0)] = (int2)(2); }\n")
    assert text.count(b"shim_base_") == 2 and b"_q = shim_base" not in text


def test_the_program_cache_keys_on_the_rewritten_source(opencl, tmp_path, monkeypatch):
    """An entry stored under the key of Halide's unrewritten source (the key an older shim
    used) is never loaded for the rewritten program: the build is from source, and the
    pipeline is right at a misaligned offset."""
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(tmp_path))
    monkeypatch.setattr(opencl_backend, "program_builds", opencl_backend.Counter())
    source = (b"__kernel void fill(__global int *_p, const int _v, __local int16 *s) "
              b"{ _p[get_global_id(0)] = _v; }\n")
    assert opencl_backend.program_source(source) != source
    cache = opencl_backend._program_cache()
    stale = opencl._build_from_source(source)  # its binary takes no offset
    binary = stale.get_info(opencl_backend._cl().program_info.BINARIES)[0]
    assert cache.store(opencl._program_cache_key(source), bytes(binary))
    opencl_backend.program_builds.clear()
    opencl.module(source)
    assert opencl_backend.program_builds["source"] == 1
    assert opencl_backend.program_builds["binary"] == 0
