"""Which device a pipeline or Buffer gets when none is named."""

import importlib

import pytest

import shim

devices = importlib.import_module("shim.backends.devices")  # (shim.backends.devices is also the function)


@pytest.fixture
def fake_devices(monkeypatch):
    """Backends that 'exist' by name: device(kind) returns the kind, or raises
    DeviceUnavailable for those not in the set the test gives."""
    monkeypatch.delenv("HALIDE_SHIM_DEVICE", raising=False)
    present = set()

    def device(kind="host", **options):
        if kind != "host" and kind not in present:
            raise shim.DeviceUnavailable(f"no {kind} here")
        return kind

    monkeypatch.setattr(devices, "device", device)
    monkeypatch.setattr(devices, "_unavailable", set())
    return present


def test_cuda_is_preferred_to_opencl_which_may_be_a_cpu(fake_devices):
    fake_devices.update({"opencl", "cuda"})
    assert devices.default_device() == "cuda"


def test_opencl_without_cuda(fake_devices):
    fake_devices.add("opencl")
    assert devices.default_device() == "opencl"


def test_the_host_device_when_there_is_no_gpu(fake_devices):
    assert devices.default_device() == "host"


def test_the_environment_names_the_device(fake_devices, monkeypatch):
    fake_devices.update({"opencl", "cuda"})
    monkeypatch.setenv("HALIDE_SHIM_DEVICE", "opencl")
    assert devices.default_device() == "opencl"
