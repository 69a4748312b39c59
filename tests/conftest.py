"""Shared fixtures: the sample pipelines, built once per session into the build cache."""

import pytest

import shim
from pipelines.build import RUNTIMES, Build, build_all, generator_names


@pytest.fixture(scope="session")
def host_pipelines():
    """{(name, runtime): path} for every sample pipeline built for the host CPU."""
    specs = [Build(name, "host", runtime) for name in generator_names() for runtime in RUNTIMES]
    paths = build_all(specs, progress=None)
    return {(spec.name, spec.runtime): path for spec, path in paths.items()}


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
