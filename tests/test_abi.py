"""The ABI cffi sees matches Halide 21's real HalideRuntime.h, byte for byte."""

import json
import os
import subprocess
import sys

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
    "struct halide_trace_event_t": ["func", "value", "coordinates", "trace_tag", "type", "event",
                                    "parent_id", "value_index", "dimensions"],
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


# Halide's runtime internals a fork resets or locks (native_stubs/forks/fork.c, abi/shim_fork.h):
# no header has them, so what fork.c assumes of each is observed in a fresh process, with a
# trace file for HL_TRACE_FILE.
FORK_OBJECTS = r"""
import ctypes, json, threading, time
import shim
from shim.native import ffi, lib

seen = {}


def found(name, which):
    size = ffi.new("size_t *")
    address = lib.shim_fork_object(which, size)
    seen[name + " bytes"] = size[0] if address != ffi.NULL else None
    return ffi.buffer(ffi.cast("char *", address), size[0])


def zero(memory):
    return not any(bytes(memory))


lot = found("parking lot", lib.SHIM_FORK_PARKING_LOT)
lock = found("trace file lock", lib.SHIM_FORK_TRACE_FILE_LOCK)
buffer = found("trace buffer", lib.SHIM_FORK_TRACE_BUFFER)
# The memoization cache: its lock, table, LRU ends and size are all zeros in a fresh process.
seen["memoization cache empty"] = [
    zero(found(name, which)) for name, which in [
        ("memoization lock", lib.SHIM_FORK_MEMOIZATION_LOCK),
        ("cache entries", lib.SHIM_FORK_CACHE_ENTRIES),
        ("most recently used", lib.SHIM_FORK_MOST_RECENTLY_USED),
        ("least recently used", lib.SHIM_FORK_LEAST_RECENTLY_USED),
        ("current cache size", lib.SHIM_FORK_CACHE_SIZE)]]

# The parking lot: a thread waiting for a halide_mutex another holds waits in it (a bucket of
# the table holds it; the guard only ends a hang).
seen["parking lot before any wait"] = zero(lot)
so = ctypes.CDLL(shim._native.__file__)
mutex = ctypes.create_string_buffer(ffi.sizeof("struct halide_mutex"))
so.halide_mutex_lock(mutex)
waiter = threading.Thread(target=lambda: (so.halide_mutex_lock(mutex), so.halide_mutex_unlock(mutex)))
waiter.start()
deadline = time.monotonic() + 60
while zero(lot) and time.monotonic() < deadline:
    time.sleep(0.001)
seen["parking lot with a waiter"] = zero(lot)
so.halide_mutex_unlock(mutex)
waiter.join()
seen["trace file lock"] = bytes(lock)[0]

# The trace buffer: a pointer, set at the first event once HL_TRACE_FILE is open, to a header of
# lock, cursor and overage: a begin_pipeline event of Func "f" takes a 32-byte packet
# (halide_trace_packet_t's 28 bytes, "f", an empty tag, rounded up to 4); its end flushes it.


class Event(ctypes.Structure):  # struct halide_trace_event_t
    _fields_ = [("func", ctypes.c_char_p), ("value", ctypes.c_void_p),
                ("coordinates", ctypes.c_void_p), ("trace_tag", ctypes.c_char_p),
                ("type", ctypes.c_uint32), ("event", ctypes.c_int), ("parent_id", ctypes.c_int32),
                ("value_index", ctypes.c_int32), ("dimensions", ctypes.c_int32)]


so.halide_trace.argtypes = [ctypes.c_void_p, ctypes.POINTER(Event)]
pointer = ctypes.c_void_p.from_buffer(buffer)


def header():
    return list((ctypes.c_uint32 * 3).from_address(pointer.value))


seen["trace buffer before any event"] = pointer.value
begin = so.halide_trace(None, Event(b"f", None, None, None, 0, lib.halide_trace_begin_pipeline))
seen["trace buffer after a begin"] = header()
so.halide_trace(None, Event(b"f", None, None, None, 0, lib.halide_trace_end_pipeline, begin))
seen["trace buffer after its end"] = header()
print(json.dumps(seen))
"""


def test_the_halide_internals_a_fork_resets_are_laid_out_as_fork_c_assumes(tmp_path):
    env = dict(os.environ, HL_TRACE_FILE=str(tmp_path / "trace.bin"))
    done = subprocess.run([sys.executable, "-c", FORK_OBJECTS], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen.pop("parking lot bytes") > 0
    assert seen.pop("cache entries bytes") % ffi.sizeof("void *") == 0
    assert seen == {
        "trace file lock bytes": 1, "trace buffer bytes": ffi.sizeof("void *"),
        "memoization lock bytes": ffi.sizeof("struct halide_mutex"),
        "most recently used bytes": ffi.sizeof("void *"),
        "least recently used bytes": ffi.sizeof("void *"), "current cache size bytes": 8,
        "memoization cache empty": [True] * 5,
        "parking lot before any wait": True, "parking lot with a waiter": False,
        "trace file lock": 0,
        "trace buffer before any event": None,
        "trace buffer after a begin": [0, 32, 0],
        "trace buffer after its end": [0, 0, 0],
    }


# Halide 22's structs where they differ from 21's (abi/halide22_runtime.h), as Halide's
# HalideRuntime.h at abbf7ff983 lays them out on x86-64: its offsets, read by compiling that
# header (no Halide 22 is installable to compile it here).
HALIDE22_LAYOUTS = {
    "struct halide22_profiler_func_stats": (192, {
        "name": 0, "parent": 8, "canonical_id": 12, "kind": 16, "buffer_func_id": 20,
        "counters_approximated": 24, "time": 32, "memory_current": 40, "memory_peak": 48,
        "stack_peak": 56, "memory_total": 64, "active_threads_numerator": 72,
        "active_threads_denominator": 80, "num_allocs": 88, "parallel_loops": 96,
        "parallel_tasks": 104, "points_required_at_root": 112, "points_computed": 120,
        "scalar_loads": 128, "vector_loads": 136, "gathers": 144, "bytes_loaded": 152,
        "scalar_stores": 160, "vector_stores": 168, "scatters": 176, "bytes_stored": 184}),
    "struct halide22_profiler_pipeline_stats": (104, {
        "time": 0, "memory_current": 8, "memory_peak": 16, "memory_total": 24,
        "active_threads_numerator": 32, "active_threads_denominator": 40,
        "native_vector_bytes": 48, "name": 56, "funcs": 64, "next": 72, "num_funcs": 80,
        "runs": 84, "billed_runs": 88, "samples": 92, "num_allocs": 96}),
    "struct halide22_trace_event_t": (64, {
        "func": 0, "value": 8, "coordinates": 16, "trace_tag": 24, "type": 32, "lanes": 36,
        "event": 40, "parent_id": 44, "thread_id": 48, "value_index": 52, "dimensions": 56}),
}


@pytest.mark.parametrize("struct", HALIDE22_LAYOUTS)
def test_halide22_structs_are_laid_out_as_halides_own_header_lays_them_out(struct):
    size, offsets = HALIDE22_LAYOUTS[struct]
    assert ffi.sizeof(struct) == size
    for field, offset in offsets.items():
        assert ffi.offsetof(struct, field) == offset, field
