"""The CUDA backend against a fake driver (tests/support/fake_cuda.py), on machines without a
GPU: real CUDA pipelines (PTX that never runs) go through the shim's whole CUDA path, and the
log of driver calls is checked for what the driver would guarantee: the order of kernels,
copies and frees across streams, the caller's context left current, Halide's hooks obeyed,
copies as few 2-D/3-D driver calls that move the right bytes. Each test runs in a child
process, since the backend binds the driver once per process."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shim.pipelines.build import RUNTIMES, Build, build_all

TESTS = Path(__file__).resolve().parent

PRELUDE = """
import json, os, sys
sys.path.insert(0, {tests!r})
from support import fake_cuda
driver = fake_cuda.install(setattr, sms={sms!r})
import numpy as np
import shim
from shim.native import ffi, lib
libraries = json.loads({libraries!r})
"""


@pytest.fixture(scope="module")
def libraries():
    specs = [Build("brighten", "cuda", runtime) for runtime in RUNTIMES]
    return {spec.runtime: str(path) for spec, path in build_all(specs, progress=None).items()}


def run_child(libraries, body: str, sms=(132,), env=None) -> str:
    import json
    import os

    script = PRELUDE.format(tests=str(TESTS), sms=tuple(sms), libraries=json.dumps(libraries))
    script += textwrap.dedent(body) + "\nprint('ok')\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), \
        f"child failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_results_read_after_their_stream_is_gone_wait_for_its_kernels(libraries, runtime):
    run_child(libraries, f"""
        brighten = shim.load(libraries[{runtime!r}])
        image = np.arange(64 * 48, dtype=np.float32).reshape(48, 64)
        stream = driver.cuStreamCreate(1)[1]
        with shim.stream(stream):
            out = brighten(image, scale=2.0, offset=1.0, output=image.shape)
        driver.cuStreamDestroy(stream)       # the application is done with its stream
        start = driver.log()[-1].seq
        out.copy_to_host()                   # on the default stream
        launches = [op for op in driver.log() if op.kind == "launch"]
        copies = [op for op in driver.log() if op.kind == "copy" and op.seq > start]
        assert launches and all(op.stream == stream for op in launches), launches
        assert copies and all(op.stream == 0 for op in copies), copies
        assert all(driver.ordered(k, c) for k in launches for c in copies), driver.log()
        assert not driver.calls_without_context, driver.calls_without_context
    """)


def test_a_call_on_another_stream_waits_for_the_call_that_wrote_its_input(libraries):
    run_child(libraries, """
        brighten = shim.load(libraries["no_runtime"])
        image = np.ones((48, 64), np.float32)
        first, second = driver.cuStreamCreate(1)[1], driver.cuStreamCreate(1)[1]
        with shim.stream(first):
            middle = brighten(image, scale=2.0, offset=0.0, output=image.shape)
        before = driver.log()[-1].seq
        with shim.stream(second):
            brighten(middle, scale=2.0, offset=0.0, output=image.shape)
        writers = [op for op in driver.log() if op.kind == "launch" and op.seq <= before]
        readers = [op for op in driver.log() if op.kind == "launch" and op.seq > before]
        assert readers and all(op.stream == second for op in readers)
        assert all(driver.ordered(w, r) for w in writers for r in readers), driver.log()
    """)


def test_dlpack_consumers_and_frees_wait_for_a_destroyed_streams_kernels(libraries):
    run_child(libraries, """
        sys.path.insert(0, os.path.join(os.path.dirname(fake_cuda.__file__)))
        from producers import Producer
        from shim.exchange import dlpack_capsules
        brighten = shim.load(libraries["no_runtime"])
        image = np.ones((48, 64), np.float32)
        stream, consumer = driver.cuStreamCreate(1)[1], driver.cuStreamCreate(1)[1]
        with shim.stream(stream):
            out = brighten(image, scale=2.0, offset=0.0, output=image.shape)
        driver.cuStreamDestroy(stream)
        launches = [op for op in driver.log() if op.kind == "launch"]
        start = driver.log()[-1].seq
        imported = dlpack_capsules.ImportedTensor(Producer(out), consumer)   # __dlpack__(stream=consumer)
        waits = [op for op in driver.log() if op.kind == "wait" and op.seq > start]
        assert waits and all(op.stream == consumer for op in waits), driver.log()
        assert all(driver.ordered(k, w) for k in launches for w in waits)
        del imported
        out.device_free()
        frees = [op for op in driver.log() if op.kind == "free"]
        assert frees and all(driver.ordered(k, f) for k in launches for f in frees), driver.log()
    """)


def test_the_callers_current_context_is_left_as_it_was(libraries):
    run_child(libraries, """
        brighten = shim.load(libraries["bundled"])
        mine = 0xBEEF
        assert driver.c.cuCtxPushCurrent_v2(__import__("ctypes").c_void_p(mine)) == 0
        out = brighten(np.ones((16, 16), np.float32), scale=1.0, offset=0.0, output=(16, 16))
        out.copy_to_host()
        out.device_free()
        assert driver.c.fake_current_context() == mine and driver.c.fake_context_depth() == 1
        launches = [op for op in driver.log() if op.kind == "launch"]
        assert launches and {op.detail["context"] for op in launches} == {fake_cuda.PRIMARY_CONTEXT}
        assert not driver.calls_without_context, driver.calls_without_context
    """)


@pytest.mark.parametrize("variable, registers", [(None, 64), ("32", 32)])
def test_kernels_load_with_halides_register_cap(libraries, variable, registers):
    env = {"HL_CUDA_JIT_MAX_REGISTERS": variable} if variable else {}
    run_child(libraries, f"""
        brighten = shim.load(libraries["no_runtime"])
        brighten(np.ones((16, 16), np.float32), scale=1.0, offset=0.0, output=(16, 16))
        (module,) = driver.modules
        assert module["options"] == {{driver.CUjit_option.CU_JIT_MAX_REGISTERS: {registers}}}, module
        assert module["context"] == fake_cuda.PRIMARY_CONTEXT
    """, env=env)


def test_the_applications_context_and_stream_hooks_are_obeyed(libraries):
    run_child(libraries, """
        brighten = shim.load(libraries["no_runtime"])
        theirs_context, theirs_stream = 0xABC0, driver.cuStreamCreate(1)[1]
        acquired = []

        @ffi.callback("int(void *, void **, bool)")
        def acquire(uc, ctx, create):
            acquired.append(create)
            ctx[0] = ffi.cast("void *", theirs_context)
            return 0

        @ffi.callback("int(void *, void *, void **)")
        def get_stream(uc, ctx, stream):
            assert int(ffi.cast("uintptr_t", ctx)) == theirs_context
            stream[0] = ffi.cast("void *", theirs_stream)
            return 0

        lib.halide_set_cuda_acquire_context(acquire)
        lib.halide_set_cuda_get_stream(get_stream)
        out = brighten(np.ones((16, 16), np.float32), scale=1.0, offset=0.0, output=(16, 16))
        out.copy_to_host()
        ops = driver.log()
        launches = [op for op in ops if op.kind == "launch"]
        copies = [op for op in ops if op.kind == "copy"]
        assert launches and {op.detail["context"] for op in launches} == {theirs_context}
        assert {op.stream for op in launches + copies} == {theirs_stream}, ops
        assert driver.modules[0]["context"] == theirs_context
        assert acquired
        lib.halide_set_cuda_acquire_context(ffi.NULL)   # back to the shim's own
        lib.halide_set_cuda_get_stream(ffi.NULL)
        assert driver.c.fake_context_depth() == 0
    """)


def test_strided_copies_are_one_driver_call_and_move_the_right_bytes(libraries):
    run_child(libraries, """
        rng = np.random.default_rng(1)
        volume = rng.integers(0, 1 << 30, size=(6, 20, 34), dtype=np.int32)
        view = volume[1:5, 2:18:2, 3:30]              # strided in every dimension
        expected = view.copy()
        buf = shim.Buffer(view)
        start = driver.log()[-1].seq if driver.log() else 0
        buf.copy_to_device(shim.device("cuda"))
        uploads = [op for op in driver.log() if op.kind == "copy" and op.seq > start]
        view[...] = -1                                # host changed behind the shim's back
        buf.set_host_dirty(False)
        buf.set_device_dirty()
        start = driver.log()[-1].seq
        buf.copy_to_host()
        downloads = [op for op in driver.log() if op.kind == "copy" and op.seq > start]
        np.testing.assert_array_equal(view, expected)
        np.testing.assert_array_equal(volume[0], volume[0])
        # 4 slices of 8 rows: one 3-D copy would need the slice pitch to be whole rows (it
        # is: 2 rows of the array's own), so each way is one call.
        assert [op.detail["call"] for op in uploads] == ["cuMemcpy3DAsync"], uploads
        assert [op.detail["call"] for op in downloads] == ["cuMemcpy3DAsync"], downloads
        assert downloads[0].detail["rows"] == 4 * 8
    """)


@pytest.mark.parametrize("sms, variable, chosen", [
    ((80, 132, 132, 64), None, 2),     # -1 (unset): the most multiprocessors, last of equals
    ((80, 132, 132, 64), "-1", 2),
    ((80, 132, 132, 64), "1", 1),
    ((80,), None, 0),
])
def test_the_device_halide_would_choose(libraries, sms, variable, chosen):
    env = {"HL_GPU_DEVICE": variable} if variable is not None else {}
    run_child(libraries, f"""
        assert os.environ.get("HL_GPU_DEVICE") == {variable!r}
        assert shim.device("cuda").ordinal == {chosen}
    """, sms=sms, env={**env, "HALIDE_SHIM_CUDA_DEVICE": ""})


def test_a_device_number_that_is_not_one_is_refused_by_name(libraries):
    body = """
        try:
            shim.device("cuda")
        except shim.DeviceUnavailable as e:
            assert "HL_GPU_DEVICE" in str(e) and "'gpu0'" in str(e), e
        else:
            raise AssertionError("accepted HL_GPU_DEVICE=gpu0")
    """
    run_child(libraries, body, env={"HL_GPU_DEVICE": "gpu0", "HALIDE_SHIM_CUDA_DEVICE": ""})


def test_a_reused_allocation_is_handed_out_only_after_its_last_users_kernels(libraries):
    run_child(libraries, """
        brighten = shim.load(libraries["no_runtime"])
        image = np.ones((48, 64), np.float32)
        stream, other = driver.cuStreamCreate(1)[1], driver.cuStreamCreate(1)[1]
        with shim.stream(stream):
            out = brighten(image, scale=2.0, offset=0.0, output=image.shape)
        first = [op for op in driver.log() if op.kind == "launch"]
        cuda = shim.device("cuda")
        out.device_free()                   # pooled (Halide's reuse), not freed
        allocs = len([op for op in driver.log() if op.kind == "alloc"])
        before = driver.log()[-1].seq
        with shim.stream(other):
            brighten(image, scale=3.0, offset=0.0, output=image.shape)
        assert len([op for op in driver.log() if op.kind == "alloc"]) == allocs  # reused
        second = [op for op in driver.log() if op.kind == "launch" and op.seq > before]
        assert all(driver.ordered(a, b) for a in first for b in second), driver.log()
        assert not [op for op in driver.log() if op.kind == "free"]
        assert lib.halide_cuda_release_unused_device_allocations(ffi.NULL) == 0
        assert [op for op in driver.log() if op.kind == "free"]   # Halide's call empties the pool
        assert cuda.pooled_allocations == 0
    """)


def test_calls_on_many_streams_into_one_allocation_are_all_waited_for(libraries):
    run_child(libraries, """
        import threading
        brighten = shim.load(libraries["no_runtime"])
        parent = shim.Buffer(np.zeros((64, 64), np.float32))
        parent.device_malloc(shim.device("cuda"))
        rows = 16
        barrier = threading.Barrier(4)

        def work(i):
            stream = driver.cuStreamCreate(1)[1]
            crop = parent.cropped([(0, 64), (i * rows, rows)])
            image = shim.Buffer(np.full((64, 64), i, np.float32)).cropped([(0, 64), (i * rows, rows)])
            barrier.wait()
            for _ in range(5):
                with shim.stream(stream):
                    brighten(image, scale=1.0, offset=0.0, output=crop)
            driver.cuStreamDestroy(stream)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        launches = [op for op in driver.log() if op.kind == "launch"]
        assert len({op.stream for op in launches}) == 4 and len(launches) >= 20
        start = driver.log()[-1].seq
        parent.copy_to_host()
        copies = [op for op in driver.log() if op.kind == "copy" and op.seq > start]
        assert copies and all(driver.ordered(k, c) for k in launches for c in copies), driver.log()
    """)


@pytest.mark.parametrize("call", ["cuEventRecord", "cuStreamWaitEvent", "cuCtxPushCurrent_v2",
                                  "cuMemcpy3DAsync"])
def test_a_failing_driver_call_is_a_device_error_and_leaves_everything_ordered(libraries, call):
    # Each step of a two-stream scenario in turn: the n-th call of `call` fails. Whatever
    # failed, the error is a DeviceError, the context stack is balanced, nothing hangs, every
    # later copy and free of the results still follows the kernels, and no event leaks.
    run_child(libraries, f"""
        import faulthandler, gc
        faulthandler.dump_traceback_later(120, exit=True)
        brighten = shim.load(libraries["no_runtime"])
        cuda = shim.device("cuda")
        image = np.ones((48, 128), np.float32)[::2, 1:]    # strided: cuMemcpy3DAsync
        a, b = driver.cuStreamCreate(1)[1], driver.cuStreamCreate(1)[1]

        def scenario():
            with shim.stream(a):
                middle = brighten(image, scale=2.0, offset=0.0, output=image.shape)
            with shim.stream(b):
                out = brighten(middle, scale=2.0, offset=0.0, output=image.shape)
            middle.copy_to_host()
            out.copy_to_host()
            volume = shim.Buffer(np.ones((4, 9, 6, 7), np.float32)[:, ::2, :, 1:])
            volume.copy_to_device(cuda)                     # 4-D: one 3-D copy per slab
            volume.set_host_dirty(False)
            volume.set_device_dirty()
            volume.copy_to_host()
            del middle, out, volume
            gc.collect()
            shim.release_unused_device_allocations()

        def fail(after):
            if {call!r} == "cuCtxPushCurrent_v2":
                driver.c.fake_fail_pushes(after, 1)
            else:
                driver.fail_next({call!r}, after=after)

        errors = 0
        for after in range(12):
            start = driver.log()[-1].seq if driver.log() else 0
            fail(after)
            try:
                scenario()
            except shim.DeviceError as e:
                assert e.code < 0 and e.message, e
                errors += 1
                # The host waited for every copy it enqueued before reporting the failure:
                # none of them still moves bytes in host memory the caller now reuses.
                ops = [op for op in driver.log() if op.seq > start]
                syncs = [op for op in ops if op.kind == "sync"]
                for copy in (op for op in ops if op.kind == "copy"):
                    assert any(driver.ordered(copy, s) for s in syncs), (after, ops)
            gc.collect()
            shim.release_unused_device_allocations()
            fail(1 << 30)                                   # no more failures
            assert driver.c.fake_context_depth() == 0
            ops = [op for op in driver.log() if op.seq > start]
            launches = [op for op in ops if op.kind == "launch"]
            later = [op for op in ops if op.kind == "free" or
                     (op.kind == "copy" and op.detail["dst"] is None)]   # downloads
            for k in launches:
                assert all(driver.ordered(k, op) for op in later if op.seq > k.seq), (after, ops)
        assert errors, "no failure was reached"
        assert cuda.live_allocations == 0 and not driver.allocations
        assert len(set(cuda._spare_events)) == len(cuda._spare_events)
        assert len(driver.events) <= 8, driver.events                  # events are reused
        assert not driver.calls_without_context, driver.calls_without_context
    """)


@pytest.mark.parametrize("handle", [-3, 2, 1 << 64, (1 << 64) + 5, 1 << 70])
def test_a_stream_value_that_is_no_stream_handle_is_refused(handle):
    # A handle is a pointer: one past 64 bits would be cut to another stream (or to 0, the
    # legacy default) on its way to the driver.
    import shim
    from shim.native import streams

    with pytest.raises(shim.ArgumentError):
        streams.as_handle(handle)


@pytest.mark.parametrize("handle, expected", [(None, 0), (0, 0), (1, 0), (3, 3),
                                              ((1 << 64) - 1, (1 << 64) - 1)])
def test_stream_handles_as_the_driver_takes_them(handle, expected):
    from shim.native import streams

    assert streams.as_handle(handle) == expected


# --- the CUDA Array Interface (version 3) ----------------------------------------------------

def test_cuda_array_interface_is_the_buffers_device_memory(libraries):
    run_child(libraries, """
        import ctypes
        cuda = shim.device("cuda")
        data = np.arange(6 * 40, dtype=np.float32).reshape(6, 40)
        buf = shim.Buffer(data.copy())
        buf.copy_to_device(cuda)
        cai = buf.__cuda_array_interface__
        assert cai == {"version": 3, "shape": (6, 40), "typestr": "<f4",
                       "data": (buf.raw.device, False), "strides": (160, 4), "stream": 1}, cai
        # The fake driver's device memory is host memory: the pointer can be read and written.
        memory = np.ctypeslib.as_array((ctypes.c_float * data.size).from_address(cai["data"][0]))
        np.testing.assert_array_equal(memory.reshape(data.shape), data)
        assert buf.device_dirty()        # the consumer may write through the pointer
        memory[:] = -1
        np.testing.assert_array_equal(buf.numpy(), -1)

        crop = buf.cropped([(3, 10), (2, 4)])   # x in [3, 13), y in [2, 6)
        cai = crop.__cuda_array_interface__
        assert cai["data"][0] == buf.raw.device + (2 * 40 + 3) * 4, cai
        assert cai["shape"] == (4, 10) and cai["strides"] == (160, 4), cai
    """)


def test_cuda_array_interface_only_on_cuda_buffers(libraries):
    run_child(libraries, """
        host = shim.Buffer(np.zeros((4, 4), np.float32))
        assert not hasattr(host, "__cuda_array_interface__")
        host.copy_to_device(shim.device("host"))
        assert not hasattr(host, "__cuda_array_interface__")
        try:
            host.__cuda_array_interface__
        except AttributeError as e:
            assert "not in CUDA memory" in str(e), e
        host.copy_to_device(shim.device("cuda"))
        assert hasattr(host, "__cuda_array_interface__")
    """)


def test_cuda_array_interface_uploads_what_the_host_holds_newer(libraries):
    run_child(libraries, """
        import ctypes
        buf = shim.Buffer(np.zeros(64, np.int32))
        buf.copy_to_device(shim.device("cuda"))
        buf.numpy()[:] = 7
        buf.set_host_dirty()
        start = driver.log()[-1].seq
        pointer = buf.__cuda_array_interface__["data"][0]
        uploads = [op for op in driver.log() if op.kind == "copy" and op.seq > start]
        assert len(uploads) == 1, uploads
        memory = np.ctypeslib.as_array((ctypes.c_int32 * 64).from_address(pointer))
        np.testing.assert_array_equal(memory, 7)

        read_only = np.arange(8, dtype=np.int32)
        read_only.setflags(write=False)
        constant = shim.Buffer(read_only)
        constant.copy_to_device(shim.device("cuda"))
        assert constant.__cuda_array_interface__["data"][1] is True
        assert not constant.device_dirty()
    """)


def test_cuda_array_interface_stream_covers_every_stream_the_data_was_written_on(libraries):
    run_child(libraries, """
        brighten = shim.load(libraries["no_runtime"])
        image = np.ones((48, 64), np.float32)
        first, second = driver.cuStreamCreate(1)[1], driver.cuStreamCreate(1)[1]
        parent = shim.Buffer(np.zeros((48, 64), np.float32))
        parent.device_malloc(shim.device("cuda"))
        with shim.stream(first):
            brighten(image, scale=1.0, offset=0.0, output=parent.cropped(1, 0, 24))
        with shim.stream(second):
            brighten(image, scale=1.0, offset=0.0, output=parent.cropped(1, 24, 24))
        driver.cuStreamDestroy(first)    # the application's streams may go: the spec's
        driver.cuStreamDestroy(second)   # stream must outlive the object, so it is the legacy one
        launches = [op for op in driver.log() if op.kind == "launch"]
        assert {op.stream for op in launches} == {first, second}
        start = driver.log()[-1].seq
        assert parent.__cuda_array_interface__["stream"] == 1
        waits = [op for op in driver.log() if op.kind == "wait" and op.seq > start]
        assert waits and all(op.stream == 0 for op in waits), driver.log()
        assert all(driver.ordered(k, w) for k in launches for w in waits), driver.log()
        assert not driver.calls_without_context, driver.calls_without_context
    """)


def test_memory_a_cuda_array_interface_consumer_got_stays_until_the_buffer_goes(libraries):
    run_child(libraries, """
        import gc
        cuda = shim.device("cuda")
        buf = shim.Buffer(np.arange(1024, dtype=np.float32))
        buf.copy_to_device(cuda)
        pointer = buf.__cuda_array_interface__["data"][0]
        buf.__cuda_array_interface__     # read twice: one pin
        buf.device_free()                # the consumer holds the Buffer, not the allocation
        others = [shim.Buffer(np.zeros(1024, np.float32)) for _ in range(4)]
        for other in others:
            other.copy_to_device(cuda)
        assert pointer not in {o.raw.device for o in others}    # never handed out again
        assert driver.allocation_of(pointer) is not None
        assert not [op for op in driver.log() if op.kind == "free" and op.detail["address"] == pointer]
        buf.copy_to_device(cuda)         # new memory for the Buffer
        del buf
        gc.collect()
        frees = [op for op in driver.log() if op.kind == "free" and op.detail["address"] == pointer]
        assert len(frees) == 1, driver.log()   # to the driver, not to the pool
    """)


def test_cuda_array_interface_meets_a_racing_host_write_with_a_buffer_error(libraries):
    # Another thread writes the host memory between the upload and the device-dirty mark
    # (DLPack's device export and to_pyopencl meet it alike: tests/test_device_export.py).
    run_child(libraries, """
        import threading
        from support.hooks import OnEntry
        buf = shim.Buffer(np.zeros(64, np.float32))
        buf.copy_to_device(shim.device("cuda"))

        def write():
            buf.numpy()[:] = 5
            buf.set_host_dirty()

        def on_another_thread():
            writer = threading.Thread(target=write)
            writer.start()
            writer.join()

        with OnEntry(shim.Buffer.set_device_dirty.__code__, on_another_thread):
            try:
                buf.__cuda_array_interface__
            except BufferError as e:
                assert "during the export" in str(e) and repr(buf) in str(e), e
            else:
                raise AssertionError("the export succeeded")
        assert buf.host_dirty() and not buf.device_dirty()   # the write stands
        pointer = buf.__cuda_array_interface__["data"][0]    # and goes up with the next one
        assert buf.device_dirty()
        np.testing.assert_array_equal(np.ctypeslib.as_array(
            (ctypes.c_float * 64).from_address(pointer)), 5)
    """.replace("import threading", "import ctypes, threading"))


def test_a_cuda_array_interface_that_fails_holds_no_pin(libraries):
    # Ordering the legacy stream after the kernel that wrote the Buffer fails: the read is a
    # DeviceError, and the allocation, which no consumer got, is not kept for one: freeing
    # the Buffer's device memory gives it back to the driver at once.
    run_child(libraries, """
        brighten = shim.load(libraries["no_runtime"])
        stream = driver.cuStreamCreate(1)[1]
        buf = shim.Buffer(np.zeros((8, 16), np.float32))
        buf.device_malloc(shim.device("cuda"))
        with shim.stream(stream):
            brighten(np.ones((8, 16), np.float32), scale=1.0, offset=0.0, output=buf)
        pointer = buf.raw.device
        driver.fail_next("cuStreamWaitEvent")
        try:
            buf.__cuda_array_interface__
        except shim.DeviceError as e:
            assert "cuStreamWaitEvent" in str(e), e
        else:
            raise AssertionError("the export succeeded")
        buf.device_free()
        frees = [op for op in driver.log() if op.kind == "free" and op.detail["address"] == pointer]
        assert len(frees) == 1, driver.log()
    """)
