"""An adversarial pass over the C fast paths' calls on crops and slices (members of a shared
family: native_stubs/fast/shared_records.c, carrying out plans that shim/memory/aliasing.py makes once per
state of the family). They must leave every family exactly as the Python run does
(call_uses.begin_call / end_call), also when attacked: CPU and GPU pipelines taking turns on one
member, one PreparedCall run by several threads while its Buffers join a shared family,
threads making and dropping crops and moving the family between host and device while calls
run, crops dropped by the collector while plans are made, Ctrl-C while plans are made, a
fork, and families that keep reaching new states."""

import _signal
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

import shim
from shim.pipelines.build import Build, build_all
from shim.memory import aliasing
from shim.native import interrupts
from shim.memory.families import dirty_bits
from shim.native import lib
from support.hooks import OnEntry

HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty

_pipelines = {}

JOIN_SECONDS = 120  # a thread still running after this is stuck: the test fails


def pipeline(name: str, target: str = "host") -> shim.Pipeline:
    if (name, target) not in _pipelines:
        path = build_all([Build(name, target, "no_runtime")], progress=None).popitem()[1]
        _pipelines[name, target] = shim.load(path)
    return _pipelines[name, target]


def in_python(p: shim.Pipeline, **arguments) -> None:
    """The call as the Python run makes it: what the fast paths must match."""
    with p.prepare(**arguments) as prepared:
        prepared._run_in_python()


def state(*bufs) -> list:
    """What must be the same after the fast paths as after the Python run: each Buffer's dirty
    bits, its family's regions and recorded uses."""
    return [(buf.host_dirty(), buf.device_dirty(), buf.family.regions, list(buf.family.uses))
            for buf in bufs]


def join_all(threads) -> None:
    for t in threads:
        t.join(JOIN_SECONDS)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads stuck (a hang): {stuck}"


# --- a beginning planned for a GPU call is not a CPU call's ------------------------------------

@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_a_cpu_call_on_a_crop_the_gpu_wrote_before_brings_the_device_changes_home(opencl,
                                                                                  prepared):
    """A CPU call writing a member first brings the family's device-side changes home
    (call_uses.begin_call): the family is never newer on both sides. The beginning the GPU build
    of the same pipeline planned for the member in that state (nothing to bring home) must not
    be taken for the CPU call's: the fast paths left the parent newer on the host (the CPU
    crop) and on the device (its GPU-written sibling) at once."""
    gpu, cpu = pipeline("crop_fill", "opencl"), pipeline("crop_fill", "host")
    worlds = {}
    for world in ("fast", "python"):
        parent = shim.Buffer(np.zeros((4, 8), np.int32))
        left, right = parent.cropped([(0, 4), (0, 4)]), parent.cropped([(4, 4), (0, 4)])
        in_python(gpu, param=1, f=left)
        for _ in range(3):  # the GPU build's plans for `right`, in the states it cycles through
            if world == "fast":
                gpu(param=2, f=right)
            else:
                in_python(gpu, param=2, f=right)
        if world == "python":
            in_python(cpu, param=3, f=right)
        elif prepared:
            with cpu.prepare(param=3, f=right) as run:
                run()
        else:
            cpu(param=3, f=right)
        worlds[world] = (parent, left, right)
    fast, python = worlds["fast"], worlds["python"]
    assert not (fast[0].host_dirty() and fast[0].device_dirty())
    assert state(*fast) == state(*python)
    for parent in (fast[0], python[0]):
        expected = np.zeros((4, 8), np.int32)
        xs, ys = np.meshgrid(np.arange(8), np.arange(4))
        expected[:, :4] = (xs * 100 + ys + 10000)[:, :4]
        expected[:, 4:] = (xs * 100 + ys + 30000)[:, 4:]
        np.testing.assert_array_equal(np.asarray(parent), expected)


# --- one PreparedCall, several threads -----------------------------------------------------

def test_threads_running_one_prepared_call_while_its_input_gets_a_crop():
    """Two threads run the same PreparedCall; while the first runs, its input gets a crop (its
    family becomes shared), so the second records a shared family's use. Each call must end
    its own use: the run kept the Use a call recorded in the PreparedCall, shared by every
    thread, so the first call ended the second's (its own, a plain family's Use, stayed
    recorded for good: every later operation on the input waited forever) and the second
    failed (list.remove(x): x not in list)."""
    cpu_heavy = pipeline("cpu_heavy")
    image = np.random.default_rng(1).random((256, 256), dtype=np.float32)
    source, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
    run = cpu_heavy.prepare(source, rounds=3000, output=out)
    run()
    expected = out.numpy().copy()
    errors = []

    def first():
        try:
            run()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    while not source.family.uses and thread.is_alive():
        pass
    crop = source.cropped([(0, 8), (0, 8)])
    try:
        run()
    except BaseException as e:  # noqa: BLE001 - reported below
        errors.append(e)
    join_all([thread])
    assert errors == []
    assert source.family.uses == [] and out.family.uses == []
    np.testing.assert_array_equal(out.numpy(), expected)
    crop.set_host_dirty(True)  # (waits for no call)
    del crop
    gc.collect()


# --- helpers for the attacks below -----------------------------------------------------------

def assert_consistent(*bufs) -> None:
    """No call left recorded, and every member's dirty bits those its family's regions give."""
    for buf in bufs:
        family = buf.family
        assert family.uses == []
        if family.shared:
            for member in family.members.values():
                bits = lib.shim_flags_get(member.raw) & (HOST_DIRTY | DEVICE_DIRTY)
                assert bits == dirty_bits(member.box, *family.regions), (member.box,
                                                                          family.regions)


def filled(x0: int, y0: int, w: int, h: int, param: int) -> np.ndarray:
    xs, ys = np.meshgrid(np.arange(x0, x0 + w), np.arange(y0, y0 + h))
    return (xs * 100 + ys + param * 10000).astype(np.int32)


# --- threads: calls on crops while the family changes under them ---------------------------------

def test_threads_calling_on_crops_while_others_crop_drop_and_move_the_family(opencl):
    """Workers fill their own crops of one parent (CPU and OpenCL builds, plain and prepared
    calls) and check them after each call; a times_k worker reads one crop of a second family
    into another crop of it; a histogram worker writes 1-D slices; meanwhile other threads
    make and drop crops and slices (0-D too) and read them, and move the parent between host
    and device (copy_to_device, copy_to_host, device_free, set_host_dirty). No thread may fail
    or hang; at the end every family has no use recorded, bits that follow its regions, and
    the data the last calls wrote."""
    cpu_fill, gpu_fill = pipeline("crop_fill"), pipeline("crop_fill", "opencl")
    times_k, histogram = pipeline("times_k"), pipeline("histogram")
    parent = shim.Buffer(np.zeros((8, 32), np.int32))
    crops = [parent.cropped([(8 * i, 8), (0, 8)]) for i in range(3)]
    floats = shim.Buffer(np.random.default_rng(2).random((8, 32), dtype=np.float32))
    expected_floats = floats.numpy().copy()
    # times_k reads its input where it writes: each target's box, through a crop covering it
    # (the target's own box, or wider: another member of the family, read as it is written).
    targets = [floats.cropped([(16 + 8 * j, 8), (0, 8)]) for j in range(2)]
    sources = [[floats.cropped([(16 + 8 * j, 8), (0, 8)]), floats.cropped([(12 + 8 * j, 12), (0, 8)])]
               for j in range(2)]
    image = shim.Buffer(np.random.default_rng(3).integers(0, 256, (16, 16), dtype=np.uint8))
    hist = shim.Buffer(np.zeros((4, 256), np.uint32))
    last = {}
    errors, stop = [], threading.Event()
    rounds = 150

    def guarded(body):
        def run(*args):
            try:
                body(*args)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                stop.set()
        return run

    @guarded
    def filler(i):
        crop = crops[i]
        for n in range(rounds):
            param, p = i * 100 + n, (gpu_fill if n % 2 else cpu_fill)
            if n % 4 < 2:
                p(param=param, f=crop)
            else:
                with p.prepare(param=param, f=crop) as run:
                    run()
                    run()
            last[i] = param
            np.testing.assert_array_equal(np.asarray(crop), filled(8 * i, 0, 8, 8, param))

    @guarded
    def scaler():
        for n in range(rounds):
            j, k = n % 2, float(1 + n % 3)
            source = sources[j][n // 2 % 2]
            if n % 4 == 3:
                times_k(input=source, k=k, output=targets[j])  # (declined: Python's)
            else:
                with times_k.prepare(input=source, k=k, output=targets[j]) as run:
                    run()
            box = (slice(None), slice(16 + 8 * j, 24 + 8 * j))
            expected_floats[box] *= np.float32(k)
            np.testing.assert_array_equal(np.asarray(targets[j]), expected_floats[box])

    @guarded
    def histogrammer():
        for n in range(rounds):
            row = n % 4
            window = image.cropped([(0, 8 + n % 8), (0, 16 - n % 3)])  # (read from (0, 0))
            out = hist.sliced(1, row)
            histogram(input=window, output=out)
            expected = np.bincount(np.asarray(window).ravel(), minlength=256).astype(np.uint32)
            np.testing.assert_array_equal(np.asarray(out), expected)

    @guarded
    def cropper():
        rng = np.random.default_rng(4)
        while not stop.is_set():
            x0, y0 = int(rng.integers(0, 31)), int(rng.integers(0, 7))
            views = [parent.cropped([(x0, int(rng.integers(1, 33 - x0))), (y0, 1)]),
                     parent.sliced(1, y0), parent.sliced(1, y0).sliced(0, x0),
                     floats.cropped([(x0, 1), (y0, 1)])]
            for view in views:
                np.asarray(view)
            del views, view
            if rng.integers(0, 4) == 0:
                gc.collect()

    @guarded
    def mover():
        n = 0
        while not stop.is_set():
            target = (parent, crops[n % 3])[n % 2]
            action = n % 5
            n += 1
            if action == 0:
                target.copy_to_device("opencl")
            elif action == 1:
                target.copy_to_host()
            elif action == 2:
                parent.device_free()
            elif action == 3:
                try:
                    target.set_host_dirty(True)
                except shim.DeviceError as e:  # the device holds changes to it: refused
                    assert "never copied" in str(e)
            else:
                time.sleep(0.001)

    workers = [threading.Thread(target=filler, args=(i,), daemon=True) for i in range(3)]
    workers += [threading.Thread(target=scaler, daemon=True),
                threading.Thread(target=histogrammer, daemon=True)]
    others = [threading.Thread(target=cropper, daemon=True),
              threading.Thread(target=mover, daemon=True)]
    for t in workers + others:
        t.start()
    join_all(workers)
    stop.set()
    join_all(others)
    assert errors == []
    assert_consistent(parent, floats, image, hist, *crops, *sources[0], *sources[1], *targets)
    expected = np.zeros((8, 32), np.int32)
    for i in range(3):
        expected[:, 8 * i:8 * i + 8] = filled(8 * i, 0, 8, 8, last[i])
    np.testing.assert_array_equal(np.asarray(parent), expected)
    np.testing.assert_array_equal(np.asarray(floats), expected_floats)


# --- the collector and Ctrl-C while plans are made ---------------------------------------------

class DropsOnCollection:
    """Garbage in a cycle whose finalizer drops a crop: the collector, run by any allocation
    (here inside the Python code that makes a plan), changes the family's members."""

    def __init__(self, crop):
        self.crop, self.cycle = crop, self

    def __del__(self):
        self.crop = None


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_crops_dropped_by_the_collector_while_plans_are_made(prepared):
    """With the collector running at almost every allocation, finalizers and gc.callbacks drop
    crops of the family while the fast paths make their plans in Python:
    every call must still leave the family consistent and write what it should."""
    cpu_fill = pipeline("crop_fill")
    parent = shim.Buffer(np.zeros((8, 32), np.int32))
    crops = [parent.cropped([(8 * i, 8), (0, 8)]) for i in range(4)]
    made = []

    def on_collection(phase, info):
        if phase == "start" and made:  # (a crop dropped: its finalizer runs here)
            del made[0]

    expected = np.zeros((8, 32), np.int32)
    threshold = gc.get_threshold()
    gc.callbacks.append(on_collection)
    gc.set_threshold(1, 1, 1)
    try:
        for n in range(60):
            i = n % 4
            DropsOnCollection(parent.cropped([(n % 30, 2), (n % 7, 1)]))
            DropsOnCollection(crops[i].sliced(0, 8 * i))
            made.extend(parent.cropped([(k, 1), (0, 8)]) for k in range(n % 3))
            if prepared:
                with cpu_fill.prepare(param=n, f=crops[i]) as run:
                    run()
            else:
                cpu_fill(param=n, f=crops[i])
            expected[:, 8 * i:8 * i + 8] = filled(8 * i, 0, 8, 8, n)
            assert crops[i].family.uses == []
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collection)
    made.clear()
    gc.collect()
    assert_consistent(parent, *crops)
    np.testing.assert_array_equal(np.asarray(parent), expected)


@pytest.fixture
def python_sigint():
    """SIGINT with the shim's handler (which defers Ctrl-C inside the device layer), put back
    in front of the one-shot handler pocl's LLVM installs when OpenCL starts."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))
    assert interrupts.defers(signal.SIGINT)


@pytest.mark.parametrize("maker", ["begin_plan", "end_plan"])
@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_ctrl_c_while_a_plan_is_made_lands_after_the_call(python_sigint, maker, prepared):
    """SIGINT as the fast paths make a plan (Python code called from C, with uses recorded):
    the call must finish, its uses end and the family stay consistent; KeyboardInterrupt comes
    once the call is over."""
    cpu_fill = pipeline("crop_fill")
    code = getattr(aliasing, maker).__code__
    parent = shim.Buffer(np.zeros((8, 16), np.int32))
    for n in range(4):
        crop = parent.cropped([(4 * n, 4), (0, 8)])  # a new member: no plan yet
        hook = OnEntry(code, lambda: signal.raise_signal(signal.SIGINT))
        interrupted = False
        try:
            with hook:
                if prepared:
                    with cpu_fill.prepare(param=n, f=crop) as run:
                        run()
                else:
                    cpu_fill(param=n, f=crop)
            time.sleep(0.2)  # (where a Ctrl-C held past the call would land)
        except KeyboardInterrupt:
            interrupted = True
        assert hook.fired and interrupted
        assert_consistent(parent, crop)
        np.testing.assert_array_equal(np.asarray(crop), filled(4 * n, 0, 4, 8, n))


def test_ctrl_c_sent_at_random_during_calls_on_crops(python_sigint):
    """SIGINT from another thread at random moments of plain and prepared calls on crops
    (unblocked only around the calls): each call either finishes or raises KeyboardInterrupt,
    and the family is left with no use recorded and bits that follow its regions."""
    cpu_fill, times_k = pipeline("crop_fill"), pipeline("times_k")
    parent = shim.Buffer(np.zeros((8, 16), np.int32))
    floats = shim.Buffer(np.ones((8, 16), np.float32))
    main, stop = threading.main_thread().ident, threading.Event()

    def interrupter():
        rng = np.random.default_rng(6)
        while not stop.is_set():
            time.sleep(float(rng.uniform(0, 0.0003)))
            signal.pthread_kill(main, signal.SIGINT)

    held = {signal.SIGINT}
    _signal.pthread_sigmask(signal.SIG_BLOCK, held)
    sender = threading.Thread(target=interrupter, daemon=True)
    sender.start()
    interrupts_seen = 0
    try:
        for n in range(300):
            crop = parent.cropped([(n % 12, 4), (n % 5, 3)]) if n % 3 else parent.cropped(
                [(4 * (n % 4), 4), (0, 8)])
            source, target = floats.cropped([(0, 16), (0, 8)]), floats.cropped([(8, 8), (0, 4)])
            # (Made and dropped with SIGINT blocked: a KeyboardInterrupt landing in a Buffer's
            # finalizer is not what this tests.)
            fill = cpu_fill.prepare(param=n, f=crop) if n % 2 == 0 else None
            scale = times_k.prepare(input=source, k=1.0, output=target)
            try:
                try:
                    _signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
                    if fill is None:
                        cpu_fill(param=n, f=crop)
                    else:
                        fill()
                    scale()
                finally:
                    _signal.pthread_sigmask(signal.SIG_BLOCK, held)  # (then runs the handler)
            except KeyboardInterrupt:
                interrupts_seen += 1
            assert_consistent(parent, crop, floats, source, target)
            del crop, source, target, fill, scale
    finally:
        stop.set()
        sender.join(JOIN_SECONDS)
        signal.signal(signal.SIGINT, lambda signum, frame: None)  # (the last one sent)
        _signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert not sender.is_alive()
    assert interrupts_seen > 0
    np.testing.assert_array_equal(np.asarray(floats), np.ones((8, 16), np.float32))


# --- a family that keeps reaching new states; a fork ----------------------------------------

def test_a_family_that_keeps_reaching_new_states_matches_the_python_run():
    """Calls on many crops, one after another, take a family through far more states than a
    member remembers (families._REMEMBERED_STATES) and replace every plan many times over;
    crops of crops and slices in the mix. After each call the fast world's family must be in
    the Python world's state, and the data the same at the end."""
    cpu_fill, times_k = pipeline("crop_fill"), pipeline("times_k")
    worlds = {}
    for world in ("fast", "python"):
        parent = shim.Buffer(np.zeros((8, 24), np.int32))
        views = [parent.cropped([(x, 3), (y, 2)]) for x in range(0, 24, 3) for y in range(0, 8, 2)]
        views += [view.cropped([(view.dim(0).min() + 1, 2), (view.dim(1).min(), 1)])
                  for view in views[::3]]
        floats = shim.Buffer(np.full((4, 24), 2.0, np.float32))
        rows = [floats.sliced(1, y) for y in range(4)]  # (1-D members, written through crops)
        worlds[world] = (parent, views, floats, rows)
    rng = np.random.default_rng(7)
    for n in range(400):
        i = int(rng.integers(0, len(worlds["fast"][1])))
        how, x = n % 3, int(rng.integers(0, 20))
        for world, (parent, views, floats, rows) in worlds.items():
            if world == "python":
                in_python(cpu_fill, param=n, f=views[i])
            elif how == 0:
                cpu_fill(param=n, f=views[i])
            else:
                with cpu_fill.prepare(param=n, f=views[i]) as run:
                    run()
            if n % 5 == 0:
                out = floats.cropped([(x, 4), (n % 4, 1)])
                source = floats.cropped([(0, 24), (n % 4, 1)])
                if world == "python":
                    in_python(times_k, input=source, k=1.0, output=out)
                else:
                    with times_k.prepare(input=source, k=1.0, output=out) as run:
                        run()
                del out, source
        fast, python = worlds["fast"], worlds["python"]
        assert state(fast[0], *fast[1]) == state(python[0], *python[1]), n
        assert state(fast[2], *fast[3]) == state(python[2], *python[3]), n
    for world in ("fast", "python"):
        assert_consistent(worlds[world][0], *worlds[world][1], worlds[world][2])
    np.testing.assert_array_equal(np.asarray(worlds["fast"][0]), np.asarray(worlds["python"][0]))
    np.testing.assert_array_equal(np.asarray(worlds["fast"][2]), np.full((4, 24), 2, np.float32))


def test_a_forked_child_calls_on_the_crops_its_parent_called_on():
    """Plans made in the parent process (they hold its objects, and the addresses of its
    structs, which the child's copies share) must serve the child: calls on the crops there
    write the child's memory and leave its family consistent."""
    cpu_fill = pipeline("crop_fill")
    parent = shim.Buffer(np.zeros((4, 16), np.int32))
    crops = [parent.cropped([(4 * i, 4), (0, 4)]) for i in range(4)]
    for i, crop in enumerate(crops):
        cpu_fill(param=i, f=crop)
        with cpu_fill.prepare(param=i, f=crop) as run:
            run()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        status = 1
        try:
            for i, crop in enumerate(crops):
                cpu_fill(param=10 + i, f=crop)
                with cpu_fill.prepare(param=20 + i, f=crop) as run:
                    run()
            assert_consistent(parent, *crops)
            expected = np.concatenate([filled(4 * i, 0, 4, 4, 20 + i) for i in range(4)], axis=1)
            status = 0 if np.array_equal(np.asarray(parent), expected) else 2
        finally:
            os.write(write, bytes([status]))
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        reported = pipe.read()
    _, code = os.waitpid(pid, 0)
    assert reported == b"\x00" and os.waitstatus_to_exitcode(code) == 0
    expected = np.concatenate([filled(4 * i, 0, 4, 4, i) for i in range(4)], axis=1)
    np.testing.assert_array_equal(np.asarray(parent), expected)  # the parent's own: unchanged
    assert_consistent(parent, *crops)
