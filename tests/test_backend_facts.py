"""Each backend fact lives on its backend class (shim/backends/base.py's contract), and
everything that names backends derives from those classes: shim.device's kinds, the CLI's
choices, the profiler's names, DLPack's device types, the default order, the native index.
And ``available()`` behaves alike for every backend: a list, never an exception."""

import contextlib
import sys

import numpy as np
import pytest

import shim
from shim.core import callbacks
from shim.profiling import profiler
from shim.backends.base import Backend, interface_of
from shim.native import lib

devices = sys.modules["shim.backends.devices"]  # (shim.backends.devices is also the function)


def test_every_backend_class_is_registered_once_with_its_own_facts():
    classes = devices.BACKEND_CLASSES
    assert len({cls.kind for cls in classes}) == len({cls.index for cls in classes}) == len(classes)
    # The native indices are the enum's, one interface each, and the proxy is none of them.
    native = {lib.SHIM_BACKEND_HOST, lib.SHIM_BACKEND_OPENCL, lib.SHIM_BACKEND_CUDA,
              lib.SHIM_BACKEND_OPENCL_IMAGE, lib.SHIM_BACKEND_VULKAN}
    assert {cls.index for cls in classes} == native
    assert devices.kinds() == [cls.kind for cls in classes]
    for cls in classes:
        assert devices.backend_class(cls.kind) is cls
        assert devices.kind_of_index(cls.index) == cls.kind
        assert lib.shim_backend_of(lib.shim_backend_interface(cls.index)) == cls.index
        if cls.dlpack_device_type is not None:
            assert devices.kind_for_dlpack(cls.dlpack_device_type) == cls.kind
    assert devices.kind_of_index(lib.SHIM_BACKEND_PROXY) is None


def test_the_default_order_follows_the_classes_ranks():
    ranked = sorted((cls for cls in devices.BACKEND_CLASSES if cls.default_rank is not None),
                    key=lambda cls: cls.default_rank)
    # A CUDA device is always a GPU; OpenCL before Vulkan (shim/backends/vulkan.py says why).
    assert [cls.kind for cls in ranked] == ["cuda", "opencl", "vulkan"]
    assert devices.preferred_kind({"opencl", "cuda"}) == "cuda"
    assert devices.preferred_kind({"vulkan", "opencl"}) == "opencl"
    assert devices.preferred_kind({"vulkan", "metal"}) == "vulkan"
    assert devices.preferred_kind({"opencl", "metal"}) == "opencl"
    assert devices.preferred_kind({"metal"}) is None


def test_the_cli_offers_exactly_the_backends_kinds(capsys):
    from shim.cli import main as cli

    with contextlib.suppress(SystemExit):  # (argparse's help may exit; the CLI's returns)
        cli.main(["run", "--help"])
    usage = capsys.readouterr().out
    assert "{" + ",".join(devices.kinds()) + "}" in usage


def test_the_profiler_names_a_backend_by_its_kind():
    backend = shim.device("host")
    with shim.profile() as prof:
        buf = shim.Buffer(np.zeros((4, 4), np.float32))
        buf.copy_to_device(backend)
        buf.copy_to_host()
    names = {record.backend for record in prof.records if record.kind == "runtime"}
    assert names == {backend.kind}


@pytest.mark.parametrize("cls", devices.BACKEND_CLASSES, ids=lambda cls: cls.kind)
def test_available_is_a_list_of_descriptions(cls):
    found = cls.available()
    assert isinstance(found, list) and all(isinstance(d, str) and d for d in found)


def test_available_never_raises_when_the_driver_is_broken(monkeypatch):
    from shim.backends import cuda, opencl, vulkan

    def broken(*args, **kwargs):
        raise RuntimeError("the driver fell over")

    monkeypatch.setattr(opencl, "_platforms", broken)
    monkeypatch.setattr(cuda, "_device_names", broken)
    monkeypatch.setattr(vulkan, "_device_names", broken)
    assert opencl.OpenCLBackend.available() == []
    assert vulkan.VulkanBackend.available() == []
    with pytest.raises(RuntimeError):  # (cuda's own errors are DeviceUnavailable/BackendError)
        cuda.CUDABackend.available()
    monkeypatch.setattr(cuda, "_device_names", lambda: (_ for _ in ()).throw(
        shim.DeviceUnavailable("no CUDA driver")))
    assert cuda.CUDABackend.available() == []
    assert shim.devices() == [("host", "simulated device in host memory")]


def test_a_backend_that_runs_no_kernels_says_so():
    host = shim.device("host")
    with pytest.raises(Exception, match="runs no kernels"):
        host.module(b"")
    assert isinstance(host, Backend) and interface_of(host) == lib.shim_backend_interface(host.index)


def test_the_callbacks_cover_every_python_function_the_native_library_declares():
    declared = {name for name in dir(lib) if name.startswith("shim_py_")}
    registered = {name for name, _, _ in callbacks.CALLBACKS}
    # The rest are registered where their work is: DLPack's deleters and the launch profile.
    elsewhere = {"shim_py_dlpack_delete", "shim_py_dlpack_delete_versioned",
                 "shim_py_profile_launch_begin", "shim_py_profile_launch_end"}
    assert registered | elsewhere == declared and not registered & elsewhere
    assert profiler.shim_py_profile_launch_begin is not None
