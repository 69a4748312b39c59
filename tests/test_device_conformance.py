"""The generic device functions behave as Halide 21's: return codes, validation order and
which flag changes when, for every function and buffer state in the table below. The table is
checked against Halide's stock runtime (a bundled-runtime OpenCL pipeline on PoCL, and a Vulkan
one on lavapipe, each in a process without the shim) and against the shim, so it cannot drift
from either."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import shim
from shim.pipelines.build import Build, build
from shim.native import ffi, lib
from support.conformance import STOCK_CRASHES_BY_API, run_table

N = None
# function -> state -> (return code, flags after, has a device allocation after)
# flags: 1 = host-dirty, 2 = device-dirty. "other interface": the buffer lives on the interface
# under test and the call names a different one.
EXPECTED = {
    "copy_to_host": {
        "null": (-38, N, N), "no device": (0, 0, False), "no device, host-dirty": (0, 1, False),
        "device clean": (0, 0, True), "host-dirty": (0, 1, True), "device-dirty": (0, 0, True),
        "both dirty": (-37, 3, True)},
    "copy_to_device": {
        "null": (-38, N, N), "no device": (0, 0, True), "no device, host-dirty": (0, 0, True),
        "device clean": (0, 0, True), "host-dirty": (0, 0, True), "device-dirty": (0, 2, True),
        "both dirty": (-37, 3, True)},
    "copy_to_device(NULL)": {
        "null": (-38, N, N), "no device": (-19, 0, False), "no device, host-dirty": (-19, 1, False),
        "device clean": (0, 0, True), "host-dirty": (0, 0, True), "device-dirty": (0, 2, True),
        "both dirty": (-37, 3, True)},
    "copy_to_device(other interface)": {
        "null": (-38, N, N), "device clean": (-42, 0, True), "host-dirty": (-42, 1, True),
        "device-dirty": (-42, 2, True), "both dirty": (-37, 3, True)},
    "device_malloc": {
        "null": (-38, N, N), "no device": (0, 0, True), "no device, host-dirty": (0, 1, True),
        "device clean": (0, 0, True), "host-dirty": (0, 1, True), "device-dirty": (0, 2, True),
        "both dirty": (-37, 3, True)},
    "device_malloc(other interface)": {
        "null": (-38, N, N), "device clean": (-42, 0, True), "host-dirty": (-42, 1, True),
        "device-dirty": (-42, 2, True), "both dirty": (-37, 3, True)},
    "device_free": {
        "null": (-38, N, N), "no device": (0, 0, False), "no device, host-dirty": (0, 1, False),
        "device clean": (0, 0, False), "host-dirty": (0, 1, False), "device-dirty": (0, 0, False),
        "both dirty": (-37, 3, True)},
    "device_sync": {
        "null": (-38, N, N), "no device": (-19, 0, False), "no device, host-dirty": (-19, 1, False),
        "device clean": (0, 0, True), "host-dirty": (0, 1, True), "device-dirty": (0, 2, True),
        "both dirty": (-37, 3, True)},
    "device_detach_native": {
        "null": (-38, N, N), "no device": (0, 0, False), "no device, host-dirty": (0, 1, False),
        "device clean": (0, 0, False), "host-dirty": (0, 1, False), "device-dirty": (0, 2, False),
        "both dirty": (-37, 3, True)},
    "device_and_host_free": {
        "null": (-38, N, N), "no device": (0, 0, False), "no device, host-dirty": (0, 1, False),
        "device clean": (0, 0, False), "host-dirty": (0, 0, False), "device-dirty": (0, 0, False),
        "both dirty": (-37, 3, True)},
    "device_release_crop": {
        # Halide's own runtime crashes on a NULL buffer here; the shim reports it.
        "null": (-38, N, N), "no device": (0, 0, False), "no device, host-dirty": (0, 1, False),
        "device clean": (0, 0, False), "host-dirty": (0, 1, False), "device-dirty": (0, 2, False),
        "both dirty": (0, 3, False)},
}


def as_table(table):
    return {f: {s: (tuple(v) if isinstance(v, list) else v) for s, v in row.items()}
            for f, row in table.items()}


@pytest.fixture(scope="module", params=["opencl", "vulkan"])
def stock_table(request):
    """(api, the table of Halide's stock runtime for that GPU API), through the API's device
    fixture, which skips where this machine has no such device."""
    api = request.param
    request.getfixturevalue(api)
    library = build(Build("brighten", api, "bundled"))
    script = Path(__file__).parent / "support" / "conformance.py"
    done = subprocess.run([sys.executable, str(script), str(library), api], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    return api, as_table(json.loads(done.stdout))


def test_halide_stock_runtime_matches_the_table(stock_table):
    api, table = stock_table
    crashes = STOCK_CRASHES_BY_API[api]
    expected = {f: {s: ("crash" if (f, s) in crashes else v) for s, v in row.items()}
                for f, row in EXPECTED.items()}
    assert table == expected


@pytest.mark.parametrize("kind", ["host", "opencl", "cuda", "vulkan"])
def test_shim_matches_the_table(request, kind):
    # A GPU kind through its fixture (tests/conftest.py), which skips where there is none.
    backend = shim.device(kind) if kind == "host" else request.getfixturevalue(kind)
    before = backend.live_allocations
    other = lib.shim_backend_interface(  # any other interface of the shim's
        lib.SHIM_BACKEND_HOST if backend.index != lib.SHIM_BACKEND_HOST else lib.SHIM_BACKEND_OPENCL)
    table = run_table(ffi, lib, lib.shim_backend_interface(backend.index), other,
                      host_allocator=lambda n: lib.halide_malloc(ffi.NULL, n))
    assert as_table(table) == EXPECTED
    assert backend.live_allocations == before
