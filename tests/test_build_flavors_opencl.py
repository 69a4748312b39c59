"""The build flavors of Halide's AOT tests (test/generator at v21.0.0) that need a GPU,
on OpenCL (PoCL's CPU device where there is no GPU), each checked against Halide's stock
runtime in a child process and against numpy: an extern stage on OpenCL running its own
kernel (define_extern_opencl), GPU pipelines built with user_context on many threads
(gpu_multi_context_threaded), a call failing midway freeing its device memory
(cleanup_on_error), halide_buffer_copy between host and device buffers of different shapes
and crops, and copy stages between device and host stages (buffer_copy), async and
double-buffered. The pipelines are tests/support/flavors/generators.py's; see
test_build_flavors.py for the CPU flavors."""

import ctypes
import gc
import threading

import numpy as np
import pytest

import shim
from shim.backends import opencl as opencl_backend
from shim.native import ffi, lib
from support.flavors.build import run_stock, shared_builds
from support.threads import run_threads
from support.flavors.hooks import FailingSecondMalloc

pytest.importorskip("halide", reason="building the flavor pipelines needs halide")

RUNTIMES = ("bundled", "no_runtime")
CL = "host-opencl"


def target(base: str, runtime: str) -> str:
    return f"{base}-no_runtime" if runtime == "no_runtime" else base


def _specs():
    """One library of every OpenCL flavor, as test_build_flavors.py's CPU one: "bundled", it
    carries Halide's runtime (flv_cl_extern is built with it, the others no_runtime),
    "no_runtime" none; "counted", for the stock runtime only, is "bundled" with the
    application's own halide_device_malloc / halide_device_free counting the allocations
    (stock_counters.c; the shim's runtime replaces such definitions)."""
    others = [(g, CL + "-no_runtime") for g in ("flv_copy_stages", "flv_copy_frames", "flv_cleanup")]
    others += [(g, CL + "-user_context-no_runtime") for g in ("flv_gpu_add", "flv_gpu_mul")]
    specs = {}
    for runtime in RUNTIMES:
        specs[runtime] = ([("flv_cl_extern", target(CL, runtime))] + others, ["externs_opencl.c"])
    specs["counted"] = (specs["bundled"][0], ["externs_opencl.c", "stock_counters.c"])
    return {key: (f"cl-{key}", *spec) for key, spec in specs.items()}


def load(libs, runtime: str, name: str):
    return shim.load(libs[runtime], name=name)


@pytest.fixture(scope="module")
def libs(opencl, tmp_path_factory):
    return shared_builds(tmp_path_factory).libraries(_specs())


def stock_loader() -> str:
    """The ICD loader the stock child binds the extern stage's OpenCL calls to: the one
    pipelines/stock.py loads for Halide's runtime (pyopencl's)."""
    return opencl_backend._icd_loader_path()


def copy_input():
    return np.random.default_rng(3).random((70, 100), dtype=np.float32)


def frames_input():
    return (np.arange(5 * 30 * 40) % 251).astype(np.int32).reshape(5, 30, 40)


def counted():
    return np.arange(128 * 96, dtype=np.int32).reshape(96, 128) % 1009


# halide_buffer_copy steps (Halide's coordinates: (min, extent) per dimension, x first), as
# Halide's buffer_copy_aottest has them and more: src is `counted()`, 128 x 96.
COPIES = [
    # host -> host: a crop of the source into a destination whose mins are elsewhere
    dict(crop=[(0, 128), (0, 96)], src_on_device=False, dst_shape=(30, 40), dst_mins=(20, 10),
         dst_on_device=None, to_device=False),
    # a host crop -> a new device buffer
    dict(crop=[(16, 48), (8, 32)], src_on_device=False, dst_shape=(32, 48), dst_mins=(16, 8),
         dst_on_device=None, to_device=True),
    # a crop on the device only (its host memory damaged) -> host memory
    dict(crop=[(16, 48), (8, 32)], src_on_device=True, dst_shape=(32, 48), dst_mins=(16, 8),
         dst_on_device=None, to_device=False),
    # a device crop -> a smaller region, already allocated on the device
    dict(crop=[(8, 100), (4, 80)], src_on_device=True, dst_shape=(20, 36), dst_mins=(50, 30),
         dst_on_device="allocated", to_device=True),
    # a host crop -> part of it into an allocated device buffer
    dict(crop=[(3, 101), (5, 61)], src_on_device=False, dst_shape=(17, 29), dst_mins=(40, 33),
         dst_on_device="allocated", to_device=True),
]


@pytest.fixture(scope="module")
def stock(libs, tmp_path_factory):
    chains_shape = (32, 32)
    requests = {
        "cl_extern": ("cl_extern", dict(library=libs["bundled"], name="flv_cl_extern",
                                        loader=stock_loader(),
                                        values={"input": np.arange(250, dtype=np.int32) - 40,
                                                "output": np.zeros(250, np.int32)})),
        "copy_stages": ("run", dict(library=libs["bundled"], name="flv_copy_stages",
                                    values={"input": copy_input(),
                                            "output": np.zeros((70, 100), np.float32)})),
        "copy_frames": ("run", dict(library=libs["bundled"],
                                    name="flv_copy_frames",
                                    values={"input": frames_input(),
                                            "output": np.zeros((30, 40), np.int32)})),
        "cleanup": ("failing_malloc", dict(library=libs["counted"], name="flv_cleanup",
                                           size=64, device_counts=True)),
        "copies": ("buffer_copies", dict(library=libs["bundled"],
                                         steps=[{**step, "src": counted()} for step in COPIES])),
        "chains": ("gpu_chains", dict(library=libs["bundled"], rounds=3, threads=3,
                                      shape=chains_shape)),
    }
    answers = run_stock(shared_builds(tmp_path_factory).folder, list(requests.values()))
    return dict(zip(requests, answers))


# --- an extern stage on OpenCL -----------------------------------------------------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_opencl_extern_stage_runs_its_own_kernel_on_the_runtimes_queue(libs, stock, opencl,
                                                                          runtime):
    """An extern stage given device buffers (DeviceAPI.OpenCL) takes its input to the device
    with halide_copy_to_device, gets the context and queue from halide_acquire_cl_context and
    the cl_mem from halide_opencl_get_cl_mem, and leaves its kernel queued as it returns; the
    GPU stage after it must see what it wrote. Equal to the stock runtime's and numpy's,
    once and from several Python threads at once."""
    library = ctypes.CDLL(str(libs[runtime]))
    assert library.flv_cl_use(opencl_backend._icd_loader_path().encode()) == 0
    pipeline = load(libs, runtime, "flv_cl_extern")
    theirs = stock["cl_extern"]
    assert theirs["result"] == 0 and theirs["launches"] == 1, theirs["errors"]
    image = np.arange(250, dtype=np.int32) - 40
    expected = (image + 1) * 3 + 7 - 5
    np.testing.assert_array_equal(theirs["outputs"]["output"], expected)
    launches = library.flv_cl_launches()
    out = pipeline(image, output=image.shape)
    assert out.device_dirty()  # (read from the device below)
    np.testing.assert_array_equal(out.numpy(), expected)
    assert library.flv_cl_launches() == launches + 1

    def calls(index):
        values = np.arange(64 + 16 * index, dtype=np.int32) * (index + 1)
        for _ in range(10):
            result = pipeline(values, output=values.shape)
            np.testing.assert_array_equal(result.numpy(), (values + 1) * 3 + 2)

    run_threads(4, calls)
    assert library.flv_cl_launches() == launches + 1 + 40


# --- GPU pipelines on many threads, with user_context ------------------------------------------------

def chain_value(rounds):
    """add -> mul -> add, ``rounds`` times, from zeros: a <- 3 (a + 2), b = a + 2."""
    a = 0
    for _ in range(rounds):
        a = 3 * (a + 2)
    return a + 2


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_gpu_pipelines_on_many_threads_with_user_context(libs, stock, opencl, runtime):
    """Halide's gpu_multi_context_threaded in the shim's terms: user_context GPU pipelines
    called from several threads at once, their buffers staying on the device from one
    pipeline to the next, while another thread calls halide_device_release (under the stock
    runtime that would pull the context from under the others: the shim's only empties its
    pools); then the same pipelines called directly, as a C program calls them, each thread
    with a user_context of its own (a pointer the runtime must pass along, never read).
    Results equal to the stock runtime's (its threads, without the release) and numpy's."""
    add = load(libs, runtime, "flv_gpu_add")
    mul = load(libs, runtime, "flv_gpu_mul")
    assert [a.name for a in add.arguments] == ["input", "output"]
    assert "user_context" in add.target.split("-")
    rounds, shape = 3, (32, 32)
    for k, result in stock["chains"].items():
        np.testing.assert_array_equal(result, chain_value(rounds), err_msg=f"stock thread {k}")
    interface = lib.shim_backend_interface(opencl.index)
    done = threading.Event()

    def chains(index):
        if index == 0:  # the releasing thread
            while not done.is_set():
                lib.halide_device_release(ffi.NULL, interface)
                done.wait(0.002)
            return
        try:
            for _ in range(3):
                a = shim.Buffer(np.zeros(shape, np.int32))
                b = shim.Buffer(np.zeros(shape, np.int32))
                for _ in range(rounds):
                    add(a, output=b)
                    mul(b, output=a)
                    add(a, output=b)
                assert b.device_dirty() and a.device_dirty()
                np.testing.assert_array_equal(b.numpy(), stock["chains"][0])
        finally:
            if index == 1:
                done.set()

    run_threads(4, chains)

    # The pipelines' own functions, called with argv as a C program would, each thread its
    # own user_context.
    library = ctypes.CDLL(str(libs[runtime]))
    functions = []
    for name in ("flv_gpu_add_argv", "flv_gpu_mul_argv"):
        function = getattr(library, name)
        function.restype, function.argtypes = ctypes.c_int, [ctypes.c_void_p]
        functions.append(function)
    contexts = (ctypes.c_int * 4)()

    def direct(index):
        context = ctypes.c_void_p(ctypes.addressof(contexts) + index * ctypes.sizeof(ctypes.c_int))
        a = shim.Buffer(np.zeros(shape, np.int32))
        b = shim.Buffer(np.zeros(shape, np.int32))
        add_argv, mul_argv = functions
        for _ in range(rounds):
            for function, source, dest in ((add_argv, a, b), (mul_argv, b, a), (add_argv, a, b)):
                structs = [int(ffi.cast("uintptr_t", x.raw)) for x in (source, dest)]
                argv = (ctypes.c_void_p * 3)(ctypes.addressof(context), *structs)
                assert function(argv) == 0
        np.testing.assert_array_equal(b.numpy(), chain_value(rounds))

    run_threads(4, direct)


# --- a call failing midway frees its device memory -----------------------------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_call_failing_midway_frees_its_device_memory(libs, stock, opencl, runtime):
    """A GPU stage's buffer is allocated (on the device and the host), then the application's
    halide_malloc refuses the next stage's: the call fails with the stock runtime's code, and
    everything it allocated is freed, host and device, as many device allocations made as
    freed, as under the stock runtime (whose counts come from the application's own
    halide_device_malloc / halide_device_free, as in Halide's test)."""
    pipeline = load(libs, runtime, "flv_cleanup")
    theirs = stock["cleanup"]
    assert theirs["device_mallocs"] == theirs["device_frees"] == 1
    gc.collect()
    live = opencl.live_allocations
    counting = FailingSecondMalloc()
    with shim.profile() as prof, counting.hooks():
        with pytest.raises(shim.PipelineError) as e:
            pipeline(output=np.zeros(64, np.int32))
    assert e.value.code == theirs["result"]
    assert (counting.mallocs, counting.failed, counting.frees, counting.errors) == \
        (theirs["mallocs"], theirs["failed"], theirs["frees"], theirs["errors"])
    assert not counting.live
    # (Records: the calls that allocated or freed; a device_malloc of a buffer that has its
    # allocation already is a no-op, counted apart, as stock_counters.c leaves it out.)
    names = [r.name for r in prof.records if r.kind == "runtime"]
    allocations = names.count("device_malloc") + names.count("device_and_host_malloc")
    frees = names.count("device_free") + names.count("device_and_host_free")
    assert allocations == frees == theirs["device_mallocs"]
    del e
    gc.collect()
    assert opencl.live_allocations == live
    np.testing.assert_array_equal(pipeline(output=np.zeros(64, np.int32)), np.full(64, -6))


# --- halide_buffer_copy between host and device buffers of different shapes ---------------------

def _view(array, crop):
    return array[tuple(slice(lo, lo + extent) for lo, extent in reversed(crop))]


def shim_copies(device):
    """COPIES run through the shim's runtime with shim.Buffers, on ``device``: per step, the
    copy's result, dst's flags just after it, and dst's contents."""
    interface = lib.shim_backend_interface(device.index)
    answers = []
    for step in COPIES:
        data = counted()
        parent = shim.Buffer(data)
        src = parent.cropped(step["crop"])
        if step["src_on_device"]:
            src.copy_to_device(device)
            _view(data, step["crop"])[...] = 0  # damaged: only the device has the data now
            src.set_host_dirty(False)
            src.set_device_dirty()
        dst = shim.Buffer(np.full(step["dst_shape"], -1, np.int32))
        dst.set_host_dirty(False)
        dst.set_min(list(step["dst_mins"]))
        if step["dst_on_device"] == "allocated":
            dst.device_malloc(device)
            dst.set_host_dirty(False)
        with shim.core.bridge.runtime_call("buffer_copy") as check:
            result = lib.halide_buffer_copy(ffi.NULL, src.raw,
                                            interface if step["to_device"] else ffi.NULL, dst.raw)
            flags = int(dst.raw.flags) & 3
            check(result)
        answers.append({"result": result, "dst": dst.numpy().copy(), "dst_flags": flags})
    return answers


@pytest.mark.parametrize("kind", ["host", "opencl"])
def test_buffer_copies_between_host_and_device_buffers_of_other_shapes(stock, kind, request):
    """halide_buffer_copy as Halide's buffer_copy_aottest uses it, and more: host to host, a
    host crop to the device, a crop living on the device only to the host, device to device
    into a smaller allocated buffer, a host crop into part of a device buffer; destinations
    with mins elsewhere. On OpenCL each step's result, the destination's flags and contents
    are the stock runtime's; on the simulated host device (which the stock runtime does not
    have) they are the same, and numpy's."""
    device = shim.device("host") if kind == "host" else request.getfixturevalue("opencl")
    mine = shim_copies(device)
    for step, ours, theirs in zip(COPIES, mine, stock["copies"]):
        expected = _view(counted(), [(lo, extent) for lo, extent in
                                     zip(step["dst_mins"], reversed(step["dst_shape"]))])
        assert theirs["result"] == 0, theirs["errors"]
        np.testing.assert_array_equal(theirs["dst"], expected)
        assert ours["result"] == 0
        assert ours["dst_flags"] == theirs["dst_flags"] & 3, step
        np.testing.assert_array_equal(ours["dst"], expected, err_msg=str(step))


# --- copy stages between device and host stages ----------------------------------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
def test_copy_stages_between_device_and_host_stages(libs, stock, opencl, runtime):
    """Device, host, device, host, with copy_to_device / copy_to_host stages between them
    at two tilings (a tile of a bigger buffer, a whole buffer): equal to the stock runtime's
    and numpy's, into a fresh array, into a crop of a Buffer, and from several threads."""
    pipeline = load(libs, runtime, "flv_copy_stages")
    image = copy_input()
    expected = stock["copy_stages"]["outputs"]["output"]
    assert stock["copy_stages"]["result"] == 0
    np.testing.assert_allclose(expected, (image * 2 + 3) ** 2 - 1, rtol=1e-6)
    np.testing.assert_array_equal(pipeline(image, output=image.shape).numpy(), expected)
    # (The copy stage's storage is folded at multiples of 32 rows: a region starting
    # elsewhere is refused by Halide's own check, bad_extern_fold, under either runtime.)
    canvas = shim.Buffer(np.full((120, 160), -1, np.float32))
    crop = canvas.cropped([(48, 100), (32, 70)])
    pipeline(shim.Buffer(image, mins=[48, 32]), output=crop)
    whole = canvas.numpy()
    np.testing.assert_array_equal(whole[32:102, 48:148], expected)
    assert (whole[:32] == -1).all() and (whole[102:] == -1).all()
    assert (whole[:, :48] == -1).all() and (whole[:, 148:] == -1).all()

    def calls(index):
        for _ in range(3):
            np.testing.assert_array_equal(pipeline(image, output=image.shape).numpy(), expected)

    run_threads(3, calls)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_async_folded_copy_to_device_stage(libs, stock, opencl, runtime):
    """Frames computed on the host, each taken to the device by an async copy_to_device stage
    double-buffered with fold_storage while the GPU sums the previous one (device calls from
    Halide's worker threads): every run equal to the stock runtime's."""
    pipeline = load(libs, runtime, "flv_copy_frames")
    frames = frames_input()
    expected = stock["copy_frames"]["outputs"]["output"]
    assert stock["copy_frames"]["result"] == 0
    np.testing.assert_array_equal(expected, sum(frames[t] * (t + 1) for t in range(5)))
    for _ in range(6):
        np.testing.assert_array_equal(pipeline(frames, output=(30, 40)).numpy(), expected)
    shared = shim.Buffer(frames)
    shared.copy_to_device(opencl)

    def calls(index):
        for _ in range(4):
            np.testing.assert_array_equal(pipeline(shared, output=(30, 40)).numpy(), expected)

    run_threads(2, calls)
