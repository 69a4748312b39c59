"""The ABI cffi sees matches Halide 21's real HalideRuntime.h, byte for byte."""

import os
import subprocess

import halide
import pytest

from shim.native import ffi

STRUCTS = {
    "halide_buffer_t": ["device", "device_interface", "host", "flags", "type", "dimensions",
                        "dim", "padding"],
    "halide_dimension_t": ["min", "extent", "stride", "flags"],
    "struct halide_type_t": ["code", "bits", "lanes"],
    "struct halide_device_interface_t": [
        "device_malloc", "device_free", "device_sync", "device_release", "copy_to_host",
        "copy_to_device", "device_and_host_malloc", "device_and_host_free", "buffer_copy",
        "device_crop", "device_slice", "device_release_crop", "wrap_native", "detach_native",
        "compute_capability", "impl"],
    "struct halide_filter_metadata_t": ["version", "num_arguments", "arguments", "target", "name"],
    "struct halide_filter_argument_t": ["name", "kind", "dimensions", "type", "scalar_def",
                                        "scalar_min", "scalar_max", "scalar_estimate",
                                        "buffer_estimates"],
    "struct halide_scalar_value_t": ["u"],
    # Halide's profiler state (abi/halide_profiler.h)
    "struct halide_profiler_func_stats": [
        "time", "memory_current", "memory_peak", "memory_total", "stack_peak",
        "active_threads_numerator", "active_threads_denominator", "name", "num_allocs"],
    "struct halide_profiler_pipeline_stats": [
        "time", "memory_current", "memory_peak", "memory_total", "active_threads_numerator",
        "active_threads_denominator", "name", "funcs", "next", "num_funcs", "runs", "samples",
        "num_allocs"],
    "struct halide_profiler_state": ["lock", "pipelines", "sampling_thread", "instances",
                                     "get_remote_profiler_state", "sleep_time", "shutdown"],
}


@pytest.fixture(scope="module")
def real_layout(tmp_path_factory):
    """{(struct, field or None): (offset or size)} from a C program compiled against the
    HalideRuntime.h shipped in the halide package."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "HalideRuntime.h"',
             "int main(void) {"]
    for struct, fields in STRUCTS.items():
        lines.append(f'printf("{struct}|-|%zu\\n", sizeof({struct}));')
        for field in fields:
            lines.append(f'printf("{struct}|{field}|%zu\\n", offsetof({struct}, {field}));')
    lines += ["return 0;", "}"]
    work = tmp_path_factory.mktemp("abi")
    source, program = work / "layout.c", work / "layout"
    source.write_text("\n".join(lines))
    include = os.path.join(halide.install_dir(), "include")
    subprocess.run(["cc", "-std=c11", "-I", include, "-o", str(program), str(source)], check=True)
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    layout = {}
    for line in out.splitlines():
        struct, field, value = line.split("|")
        layout[struct, None if field == "-" else field] = int(value)
    return layout


@pytest.mark.parametrize("struct", sorted(STRUCTS))
def test_size_and_every_field_offset_match_the_real_header(real_layout, struct):
    assert ffi.sizeof(struct) == real_layout[struct, None]
    for field in STRUCTS[struct]:
        assert ffi.offsetof(struct, field) == real_layout[struct, field], field


def test_the_device_interface_impl_table_is_sixteen_pointers():
    assert ffi.sizeof("struct halide_device_interface_impl_t") == 16 * ffi.sizeof("void *")


def test_the_buffer_layout_is_the_documented_one():
    # Halide 21, x86-64: 56 bytes, flags at +24, dim at +40 (reference/halide_runtime.md).
    assert ffi.sizeof("halide_buffer_t") == 56
    assert ffi.offsetof("halide_buffer_t", "flags") == 24
    assert ffi.offsetof("halide_buffer_t", "dim") == 40
