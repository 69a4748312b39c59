"""Shared fixtures: the sample pipelines, built once per session into the build cache, and
a leak check after every test."""

import gc
import importlib
import signal

import pytest

import shim
from shim.pipelines.build import RUNTIMES, Build, build_all, generator_names
from shim.memory import families
from shim.profiling import halide_profiler
from shim.backends.devices import created

# Pipelines built with Halide's profiler are loaded by several tests; Halide's report of them
# at exit would be printed after the test summary (the report's own tests run children).
halide_profiler.set_exit_report("off")

# Every test's leak check (below) runs the garbage collector twice, which walks every object
# the process holds: once PyTorch is imported, some 200,000 of them, 0.1 s a collection, a few
# minutes of the whole run. The large libraries the tests use in this process are imported now
# and their objects (modules, classes, functions: they live as long as the process) frozen
# out of the collector's sight, so each collection walks what the tests made.
for _module in ("torch", "dask.array", "distributed", "hypothesis", "pyopencl"):
    try:
        importlib.import_module(_module)
    except ImportError:
        pass  # (an optional one; the tests that need it skip, saying so)
gc.collect()
gc.freeze()

# The Ctrl-C tests send SIGINT to children they start, and need it to reach Python as it does
# in a terminal. A shell starts background jobs (``cmd &`` in a script, nohup) with SIGINT
# ignored, and a child inherits that: Python then leaves it ignored and no KeyboardInterrupt
# ever comes. Python's own handler here makes the children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def host_pipelines():
    """{(name, runtime): path} for every sample pipeline built for the host CPU."""
    specs = [Build(name, "host", runtime) for name in generator_names() for runtime in RUNTIMES]
    paths = build_all(specs, progress=None)
    return {(spec.name, spec.runtime): path for spec, path in paths.items()}


@pytest.fixture(scope="session")
def dask_pipeline(tmp_path_factory):
    """dask_pipeline(name, target="host") -> path of one of shim.dask's test pipelines
    (tests/support/dask_pipelines.py), built once a session."""
    from support.dask_pipelines import compile_pipeline

    hl = pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    work = tmp_path_factory.mktemp("dask_pipelines")
    built = {}

    def get(name, target="host"):
        if (name, target) not in built:
            built[name, target] = compile_pipeline(hl, name, target, work)
        return built[name, target]

    return get


@pytest.fixture(params=RUNTIMES)
def runtime(request):
    """Run the test once with each pipeline built with its runtime bundled, once no_runtime."""
    return request.param


@pytest.fixture
def load(host_pipelines, runtime):
    """load(name) -> shim.Pipeline for the sample pipeline ``name`` in this test's runtime."""
    return lambda name: shim.load(host_pipelines[name, runtime])


@pytest.fixture(scope="session")
def opencl():
    """The OpenCL device (PoCL's CPU device from pip where there is no GPU)."""
    try:
        return shim.device("opencl")
    except shim.DeviceUnavailable as e:
        pytest.skip(f"no OpenCL device on this machine: {e}")


@pytest.fixture(scope="session")
def cuda():
    """The CUDA device; the test skips where the driver reports none (and says why)."""
    from shim.backends import cuda as cuda_backend

    reason = cuda_backend.unavailable_reason()
    if reason:
        pytest.skip(f"no CUDA device on this machine: {reason}")
    return shim.device("cuda")


@pytest.fixture(scope="session")
def vulkan():
    """The Vulkan device (Mesa's lavapipe, a CPU device, where there is no GPU); the test
    skips where there is no loader or no device (and says why)."""
    from shim.backends import vulkan as vulkan_backend

    reason = vulkan_backend.unavailable_reason()
    if reason:
        pytest.skip(f"no Vulkan device on this machine: {reason}")
    return shim.device("vulkan")


@pytest.fixture(scope="session", params=["opencl", "cuda", "vulkan"])
def gpu(request):
    """Each GPU backend's device in turn, through its fixture above, so that it skips as that
    one does (saying why) where this machine has no such device."""
    return request.getfixturevalue(request.param)


# --- leaks -------------------------------------------------------------------------------------

@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, for fixtures that need to know whether the
    test itself failed (``item.report_call``)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def live_device_state() -> dict[str, int]:
    """What device memory and the allocation families hold right now, after a full collection:
    live allocations of every backend made so far (none is created for this) and the entries
    of the family registries."""
    gc.collect()
    state = {f"{backend.kind} live allocations": backend.live_allocations for backend in created()}
    state.update({f"families: {name}": count for name, count in families.live_counts().items()})
    return state


@pytest.fixture(autouse=True)
def no_device_leaks(request):
    """Fail the test that leaves more device allocations or family entries alive than there
    were before it. Counts are compared per test, so that session and module fixtures may
    keep their Buffers. Only growth fails: a count may also drop when something an earlier
    test kept alive (say, through a failure's traceback) goes."""
    before = live_device_state()
    yield
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        return  # its traceback keeps its Buffers alive; the failure itself is what to fix
    after = live_device_state()
    # What is alive now (the test's fixtures, modules its imports loaded, caches) leaves the
    # collector's sight, as the libraries above did: every later test's two collections then
    # walk only what that test made, not what the whole session holds (0.05-0.1 s each, a
    # couple of minutes of the run). Garbage among it later is not collected: its memory
    # stays, and its device memory, which no later test's counts include.
    gc.freeze()
    grown = {key: f"{before.get(key, 0)} -> {count}" for key, count in after.items()
             if count > before.get(key, 0)}
    assert not grown, f"this test leaked device state: {grown}"
    # Freed memory kept for reuse is not live (it may grow), but only within the pool's bounds.
    for backend in created():
        assert backend.pooled_allocations <= backend.pool_max_count, backend
        assert backend.pooled_bytes <= (backend.pool_max_bytes or 0), backend
