"""A model-based test of the whole Buffer / device layer: Hypothesis drives random sequences
of operations (Buffers, crops of crops, slices, host writes, pipelines into crops and whole
buffers, copies, frees, moves between devices, DLPack, dropped references, injected device
faults) and after every step compares every live Buffer with a plain numpy model of the same
operations, and each device's live allocations with what the model expects.

The model follows the README (Buffer, Devices, Crops, DLPack), and only where it defines the
outcome; where it does not, the test accepts each outcome the README allows (noted at each
place) and re-syncs the model from what it observed.

Beside the operations, disturbances a program brings: a signal handler of its own that raises
(a timeout) at any point inside the device layer, pyopencl.array half-imported by another
thread, and profiles started and stopped on another thread while the machine works.

Examples per run are few in a newcomer's run and more where HALIDE_SHIM_LONG_TESTS=1 (CI);
for a long run by hand:

    HALIDE_SHIM_STATEFUL_EXAMPLES=2000 HALIDE_SHIM_STATEFUL_STEPS=100 \
        python -m pytest tests/test_stateful.py -q -x
"""

import gc
import os
import signal
import sys
import threading
import types
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import shim
from shim.native import interrupts
from shim.pipelines.build import RUNTIMES, Build, build_all
from shim.native import lib
from support.budget import scaled
from support.sanitizers import THREADS_AFTER_FORK, THREADS_BUSY_AT_FORK

EXAMPLES = scaled(15, 100, "HALIDE_SHIM_STATEFUL_EXAMPLES")
STEPS = scaled(30, 40, "HALIDE_SHIM_STATEFUL_STEPS")

SHAPES = [(4, 6), (6, 8), (5, 7)]  # numpy order: (height, width)
DTYPES = [np.int32, np.float32]
HOST_AND_DEVICE_DIRTY = lib.halide_error_code_host_and_device_dirty  # -37
INCOMPATIBLE_INTERFACE = lib.halide_error_code_incompatible_device_interface  # -42

# Rules pick live Buffers by an index taken modulo how many there are: it shrinks well and
# needs no Bundle, which could not forget dropped Buffers.
PICK = st.integers(0, 1 << 16)
# A forked child still running this long after the fork is hung (SIGALRM ends it): a hang
# guard, never a check of speed.
FORK_HANG_GUARD_S = 30

_pipelines = {}

# The device layer's modules: a disturbance strikes as one of their functions is entered.
LAYER_MODULES = {"shim.core.runtime", "shim.memory.aliasing", "shim.memory.families", "shim.native.flags", "shim.native.regions",
                 "shim.core.call_uses", "shim.core.buffer_operations", "shim.core.bridge", "shim.calls.running",
                 "shim.exchange.device_export", "shim.exchange.dlpack_export", "shim.backends.base",
                 "shim.backends.host", "shim.backends.opencl", "shim.backends.pool"}
JOIN_SECONDS = 60  # a thread that does not end by then is stuck: a failure, not a wait


class Interrupted(Exception):
    """What the program's own signal handler raises (a timeout, say)."""


def raise_interrupted(signum, frame):
    raise Interrupted(f"signal {signum}")


class SignalTrap:
    """SIGUSR1, whose handler raises Interrupted, sent as the ``nth`` function of the device
    layer is entered on this thread while handlers are held there. The README: no lock stays
    held, no Buffer is left inconsistent, and the exception comes out as the operation leaves
    the layer, once done."""

    def __init__(self, nth: int):
        self.left, self.fired = nth, False

    def __enter__(self):
        def hook(frame, event, arg):
            if (event == "call" and not self.fired and interrupts.held()
                    and frame.f_globals.get("__name__") in LAYER_MODULES):
                self.left -= 1
                if self.left == 0:
                    self.fired = True
                    signal.raise_signal(signal.SIGUSR1)

        self.previous = signal.signal(signal.SIGUSR1, raise_interrupted)
        sys.setprofile(hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        signal.signal(signal.SIGUSR1, self.previous)


class HalfImported:
    """``name`` in sys.modules as while another thread imports it: the module object, still
    empty (no class of it exists yet)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.previous = sys.modules.get(self.name)
        sys.modules[self.name] = types.ModuleType(self.name)
        return self

    def __exit__(self, *exc):
        if self.previous is None:
            del sys.modules[self.name]
        else:
            sys.modules[self.name] = self.previous


class ProfileToggler(threading.Thread):
    """Starts and stops profiles, over and over, on a thread of its own while the machine
    works on the main thread: stopping one never fails a call, and nothing is left recording
    (the next start would be refused)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.done, self.errors, self.rounds = threading.Event(), [], 0

    def run(self):
        while not self.done.is_set():
            try:
                profile = shim.profile().start()
                self.done.wait(0.002)
                profile.stop()
                self.rounds += 1
            except Exception as e:  # (judged by finish)
                self.errors.append(repr(e))
                return

    def finish(self):
        self.done.set()
        self.join(JOIN_SECONDS)
        assert not self.is_alive(), "the profile thread is stuck"
        assert not self.errors, self.errors


def has_views(machine) -> bool:
    return bool(machine.views)


def pipelines(target: str, runtime: str) -> dict:
    """{"crop_fill": Pipeline, "brighten": Pipeline} built for ``target`` ("host": CPU code)."""
    key = target, runtime
    if key not in _pipelines:
        paths = build_all([Build(name, target, runtime) for name in ("crop_fill", "brighten")],
                          progress=None)
        _pipelines[key] = {spec.name: shim.load(path) for spec, path in paths.items()}
    return _pipelines[key]


def opencl_available() -> bool:
    """Whether this machine has an OpenCL device, without creating a context."""
    return any(kind == "opencl" for kind, _ in shim.devices())


def crop_fill_values(shape, param: int) -> np.ndarray:
    """What crop_fill writes, over a whole root: f(x, y) = x * 100 + y + param * 10000 (a crop
    keeps its mins, so its elements get their root coordinates' values)."""
    ys, xs = np.mgrid[0:shape[0], 0:shape[1]]
    return (xs * 100 + ys + param * 10000).astype(np.int32)


class Root:
    """One family: what each element of the root must read, and its device allocation."""

    def __init__(self, expected: np.ndarray, user_array):
        self.expected = expected
        # The caller's own array the Buffer wraps (None for Buffer(shape=...)): once every
        # Buffer of the family is gone it must hold the data (the README's "nothing is lost").
        self.user_array = user_array
        self.device = None  # kind of the family's device allocation, if it has one
        self.shared = False  # it has (or had) crops or slices: its members share one allocation
        # Elements whose newest data may be on the device only (a GPU pipeline wrote them and
        # nothing brought them home since): the only places where a host write may be refused
        # with -37. A superset: the runtime may bring data home earlier than the model knows.
        self.device_newer = np.zeros(expected.shape, bool)
        self.views: list[View] = []  # every Buffer of the family still alive

    @property
    def shape(self):
        return self.expected.shape


class View:
    """A live Buffer: the root itself, a crop or a slice, as an index into the root's arrays
    (per root axis in numpy order: a slice, or an int where it was sliced away)."""

    def __init__(self, buf, root: Root, index: tuple):
        self.buf = buf
        self.root = root
        self.index = index
        self.holds = False  # whether it has a handle into the family's device allocation
        self.dropped = False  # the test let go of it, but an export still keeps it alive
        root.views.append(self)

    @property
    def axes(self) -> list[int]:
        """The root axes this view keeps, numpy order (Halide dimension d is axes[-1 - d])."""
        return [axis for axis, i in enumerate(self.index) if isinstance(i, slice)]

    @property
    def expected(self) -> np.ndarray:
        return self.root.expected[self.index]

    def describe(self) -> str:
        parts = [f"{i.start}:{i.stop}" if isinstance(i, slice) else str(i) for i in self.index]
        return f"{self.root.expected.dtype}{list(self.root.shape)}[{', '.join(parts)}]"


class BufferMachine(RuleBasedStateMachine):
    """The Buffer / device layer against a numpy model. Subclasses choose the device."""

    device_kind = "host"  # where pipelines run and Buffers are copied to
    other_kind = None  # a second device whole families move to and back from
    faults = False  # inject faults on the (simulated) host device

    def __init__(self):
        super().__init__()
        self.devices = {kind: shim.device(kind) for kind in (self.device_kind, self.other_kind) if kind}
        if "host" in self.devices:
            self.devices["host"].clear_faults()
        gc.collect()
        # Other tests' Buffers may still hold allocations: count from here.
        self.baseline = {kind: dev.live_allocations for kind, dev in self.devices.items()}
        self.roots: list[Root] = []
        self.views: list[View] = []
        self.exports: list[tuple] = []  # (numpy array from np.from_dlpack, View it keeps alive)
        self.counter = 0  # fresh values for every write
        self.armed = False  # a fault is set and has not fired yet
        self.eager = True
        self.disturbance = None  # (kind, n) for the next device operation (see disturb)
        self.toggler = None  # the thread starting and stopping profiles, once started

    # --- helpers ---------------------------------------------------------------------------

    def fresh(self) -> int:
        self.counter += 1
        return self.counter

    def pattern(self, shape, dtype) -> np.ndarray:
        """New values, distinct per element and per write (so a misplaced or stale element is
        seen), small enough to be exact in float32."""
        base = -1000 * self.fresh()
        return (base - np.arange(int(np.prod(shape))).reshape(shape)).astype(dtype)

    def pick(self, i: int, views=None) -> View:
        views = self.views if views is None else views
        return views[i % len(views)]

    def device_op(self, operation, *roots):
        """Run ``operation``. While a fault is armed a DeviceError is an allowed outcome: it is
        returned, the fault is spent, and the allocation state of ``roots`` is re-synced from
        what their Buffers report (the README says a failure raises, not what it leaves). A
        disturbance set for it (see disturb) applies to it: an Interrupted that came out of it
        is returned the same way (the operation is done or not done at all)."""
        if self.disturbance is not None:
            interrupted = self.disturbed(operation)
            if interrupted is not None:
                for root in roots:
                    self.resync_allocation(root)
            return interrupted
        if not self.armed:
            operation()
            return None
        try:
            operation()
        except shim.DeviceError as e:
            if e.code == HOST_AND_DEVICE_DIRTY:
                raise  # a refusal, never what an injected fault causes
            self.disarm()
            for root in roots:
                self.resync_allocation(root)
            return e
        return None

    def disarm(self):
        self.devices["host"].clear_faults()
        self.armed = False

    def disturbed(self, operation) -> Interrupted | None:
        """Run ``operation`` under the disturbance set for it: the program's signal handler
        raising inside the layer (its exception comes out of the operation, which is done or
        not done at all: returned), or pyopencl.array half-imported (no difference at all)."""
        kind, nth = self.disturbance
        self.disturbance = None
        if kind == "half-imported pyopencl.array":
            with HalfImported("pyopencl.array"):
                operation()
            return None
        with SignalTrap(nth) as trap:
            try:
                operation()
            except Interrupted as e:
                assert trap.fired, "Interrupted without the signal"
                return e
        assert not trap.fired, "the handler's exception never came out of the operation"
        return None

    def resync_allocation(self, root: Root):
        live = [view for view in root.views if not view.dropped]
        for view in live:
            view.holds = view.buf.has_device_allocation()
        if any(view.holds for view in root.views if view.dropped):
            # A Buffer only an export keeps alive holds the allocation where it was: the
            # family stays there, whatever the live ones let go (an interrupted device_free
            # of the last live one may have been done before the handler's exception came).
            return
        kinds = {view.buf.device.kind for view in live if view.holds}
        assert len(kinds) <= 1, f"one family on several devices: {kinds}"
        was, root.device = root.device, kinds.pop() if kinds else None
        if was is None and root.device is not None:
            # The interrupted operation allocated the family, which made every member alias
            # it (``allocated``), a Buffer only an export keeps alive too.
            for view in root.views:
                if view.dropped:
                    view.holds = True

    def allocated(self, view: View, kind: str):
        """``view`` was used on device ``kind``: the README's "its first device use allocates
        the whole parent on that device and makes every crop alias it"."""
        root = view.root
        if root.device is None:
            root.device = kind
            for member in root.views:
                member.holds = True
        view.holds = True

    def released(self, view: View):
        """``view`` gave up its handle; the last handle out frees the family's allocation and
        brings what only the device held home."""
        view.holds = False
        root = view.root
        if not any(member.holds for member in root.views):
            root.device = None
            root.device_newer[...] = False

    def came_home(self, view: View):
        """A read or copy_to_host of ``view``: its elements are current on the host."""
        view.root.device_newer[view.index] = False

    def forget(self, view: View):
        """``view``'s Buffer is gone."""
        self.released(view)
        root = view.root
        root.views.remove(view)
        if not root.views:
            self.roots.remove(root)
            if root.user_array is not None:
                np.testing.assert_array_equal(
                    root.user_array, root.expected,
                    err_msg="after every Buffer of a family was dropped, the caller's array "
                            "lacks the family's data")

    def check_read(self, view: View, actual: np.ndarray, how: str):
        np.testing.assert_array_equal(actual, view.expected,
                                      err_msg=f"{how} of {view.describe()} reads wrong data")

    # --- setup -----------------------------------------------------------------------------

    @initialize(eager=st.booleans(), shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES))
    def start(self, eager, shape, dtype):
        # Reading every Buffer after each step (eager) brings every family home, so device-side
        # changes never outlive a step; lazy runs keep them for later steps, and read only in
        # the read rules and at the end.
        self.eager = eager
        self.new_buffer(shape, dtype, "array")  # most rules need a Buffer

    # --- Buffers, crops, slices ------------------------------------------------------------

    @precondition(lambda self: len(self.roots) < 4)
    @rule(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES),
          how=st.sampled_from(["array", "shape", "dlpack"]))
    def add_buffer(self, shape, dtype, how):
        self.new_buffer(shape, dtype, how)

    def new_buffer(self, shape, dtype, how):
        if how == "shape":
            user, buf = None, shim.Buffer(shape=shape, dtype=dtype)
            expected = np.zeros(shape, dtype)
        else:
            user = self.pattern(shape, dtype)
            expected = user.copy()
            # DLPack import of CPU data: a Buffer over the producer's memory, as Buffer(array).
            buf = shim.Buffer(user) if how == "array" else shim.from_dlpack(user)
        root = Root(expected, user)
        self.roots.append(root)
        self.views.append(View(buf, root, tuple(slice(0, n) for n in shape)))

    @precondition(lambda self: 0 < len(self.views) < 12)
    @rule(i=PICK, data=st.data())
    def crop(self, i, data):
        view = self.pick(i)
        axes = view.axes
        ranges = []  # (root axis, lo, hi), Halide dimension order
        dims = range(len(axes)) if data.draw(st.booleans(), "all dimensions") \
            else [data.draw(st.integers(0, len(axes) - 1), "dimension")]
        for d in dims:
            axis = axes[-1 - d]
            have = view.index[axis]
            lo = data.draw(st.integers(have.start, have.stop - 1))
            hi = data.draw(st.integers(lo + 1, have.stop))
            ranges.append((d, axis, lo, hi))
        if len(dims) > 1:
            buf = view.buf.cropped([(lo, hi - lo) for _, _, lo, hi in ranges])
        else:
            d, _, lo, hi = ranges[0]
            buf = view.buf.cropped(d, lo, hi - lo)
        index = list(view.index)
        for _, axis, lo, hi in ranges:
            index[axis] = slice(lo, hi)
        self.add_view(view, buf, tuple(index))

    @precondition(lambda self: any(len(v.axes) == 2 for v in self.views) and len(self.views) < 12)
    @rule(i=PICK, d=st.integers(0, 1), data=st.data())
    def take_slice(self, i, d, data):
        view = self.pick(i, [v for v in self.views if len(v.axes) == 2])
        axis = view.axes[-1 - d]
        have = view.index[axis]
        pos = data.draw(st.integers(have.start, have.stop - 1))
        index = list(view.index)
        index[axis] = pos
        self.add_view(view, view.buf.sliced(d, pos), tuple(index))

    def add_view(self, source: View, buf, index):
        source.root.shared = True
        view = View(buf, source.root, index)
        self.views.append(view)
        if source.holds:
            view.holds = True  # "a crop ... shares ... on the device"
            assert buf.has_device_allocation(), "a crop of a Buffer on a device has no allocation"
        elif source.root.device is not None:
            # A crop of a member that gave up its handle while others keep the allocation: the
            # README says a crop of a parent "without device allocation" carries the proxy, and
            # also "one allocation, one lock": either is accepted.
            view.holds = buf.has_device_allocation()
        else:
            assert not buf.has_device_allocation(), "a crop of a family without device memory has one"

    # --- writes ----------------------------------------------------------------------------

    @precondition(has_views)
    @rule(i=PICK, through_user=st.booleans())
    def write_host(self, i, through_user):
        """Write new values into a Buffer's host memory and say so: numpy() brings device
        changes home first, so the host write may not be refused."""
        view = self.pick(i)
        holder = {}

        def pull():
            holder["host"] = view.buf.numpy()

        if self.device_op(pull, view.root) is not None:
            return  # the download failed on an injected fault: nothing was written
        if "host" not in holder:
            pull()  # (a disturbance's exception came out of numpy() in place of its result)
        self.came_home(view)
        values = self.pattern(view.expected.shape, view.root.expected.dtype)
        root = view.root
        target = root.user_array[view.index] if through_user and root.user_array is not None \
            else holder["host"]
        target[...] = values
        try:
            view.buf.set_host_dirty()
        except shim.DeviceError as e:
            # Marking may bring other members' device changes home first: an injected copy
            # failure may hit that. The write stays in host memory; marking again must work.
            assert self.armed and e.code != HOST_AND_DEVICE_DIRTY, \
                f"set_host_dirty after numpy() of {view.describe()} refused: {e}"
            self.disarm()
            view.buf.set_host_dirty()
        root.expected[view.index] = values
        root.device_newer[view.index] = False

    @precondition(has_views)
    @rule(i=PICK)
    def mark_host_dirty(self, i):
        """set_host_dirty without a write: refused with -37 only where the device may hold
        newer data (README, Crops: "instead of silently losing one side"); if it is not
        refused there, the data must have come home already (the reads check that)."""
        view = self.pick(i)
        try:
            self.device_op(view.buf.set_host_dirty, view.root)
        except shim.DeviceError as e:
            assert e.code == HOST_AND_DEVICE_DIRTY and view.root.device_newer[view.index].any(), (
                f"set_host_dirty on {view.describe()} refused although no newer data can be "
                f"on the device there: {e}")

    @precondition(has_views)
    @rule(i=PICK, on_cpu=st.booleans(), runtime=st.sampled_from(RUNTIMES))
    def run_pipeline(self, i, on_cpu, runtime):
        """crop_fill (int32) or brighten (float32, from a fresh input) into a 2-D Buffer, with a
        fresh value. On the OpenCL machine either the GPU or the CPU build; a GPU pipeline only
        into families not on the other device (moving is the move rule's job)."""
        gpu = self.device_kind != "host" and not on_cpu
        candidates = [v for v in self.views if len(v.axes) == 2
                      and (not gpu or v.root.device in (None, self.device_kind))]
        if not candidates:
            return
        view = self.pick(i, candidates)
        root = view.root
        found = pipelines(self.device_kind if gpu else "host", runtime)
        param = self.fresh()
        if root.expected.dtype == np.int32:
            written = crop_fill_values(root.shape, param)[view.index]

            def call():
                found["crop_fill"](param=param, f=view.buf)
        else:
            source = self.pattern(root.shape, np.float32) % 200 - 100  # exact after * 2 + param
            written = (source * 2 + param)[view.index]

            def call():
                found["brighten"](source, scale=2.0, offset=float(param), output=view.buf)

        if self.device_op(call, root) is not None:
            # The README does not say whether a pipeline whose device call failed wrote its
            # output: either its values or the old ones, whole, but nothing else.
            actual = np.asarray(view.buf)
            self.came_home(view)
            if np.array_equal(actual, written):
                root.expected[view.index] = written
            self.check_read(view, actual, "np.asarray after a failed pipeline")
            return
        root.expected[view.index] = written
        if gpu:
            self.allocated(view, self.device_kind)
            root.device_newer[view.index] = True
        else:
            root.device_newer[view.index] = False

    # --- device methods --------------------------------------------------------------------

    @precondition(has_views)
    @rule(i=PICK, data=st.data(), malloc=st.booleans())
    def copy_to_device(self, i, data, malloc):
        view = self.pick(i)
        kind = data.draw(st.sampled_from(sorted(self.devices)), "device")
        device = self.devices[kind]
        root = view.root
        if root.device not in (None, kind):
            if malloc or root.shared:
                # device_malloc does not move (Halide's -42), nor does one member of a family
                # that shares an allocation (Buffer.copy_to_device: "cannot move alone").
                with pytest.raises(shim.DeviceError) as e:
                    (view.buf.device_malloc if malloc else view.buf.copy_to_device)(device)
                assert e.value.code == INCOMPATIBLE_INTERFACE, str(e.value)
                return
            # A Buffer without crops moves: its data comes home, then goes up to ``kind``.
            if self.device_op(lambda: view.buf.copy_to_device(device), root) is None:
                self.released(view)
                self.allocated(view, kind)
            return
        method = view.buf.device_malloc if malloc else view.buf.copy_to_device
        if self.device_op(lambda: method(device), root) is None:
            self.allocated(view, kind)

    @precondition(has_views)
    @rule(i=PICK)
    def copy_to_host(self, i):
        view = self.pick(i)
        if self.device_op(view.buf.copy_to_host, view.root) is None:
            self.came_home(view)

    @precondition(has_views)
    @rule(i=PICK)
    def device_free(self, i):
        view = self.pick(i)
        held = view.holds
        failed = self.device_op(view.buf.device_free, view.root)
        if failed is None:
            self.released(view)
        elif held and isinstance(failed, shim.DeviceError):
            # README: if copying the results home fails, device_free "raises DeviceError and
            # keeps the allocation: the results are still there".
            assert view.buf.has_device_allocation(), "a failed device_free lost the allocation"

    @precondition(lambda self: self.other_kind and not self.armed
                  and any(r.device and all(not v.dropped for v in r.views) for r in self.roots))
    @rule(i=PICK)
    def move(self, i):
        """Move a whole family to the other device the way a family with crops must: every
        member frees its handle (the last brings the data home), then one member is copied
        to the other device, which all alias again."""
        root = self.pick(i, [r for r in self.roots
                             if r.device and all(not v.dropped for v in r.views)])
        target = self.other_kind if root.device == self.device_kind else self.device_kind
        for view in root.views:
            view.buf.device_free()
            self.released(view)
        assert root.device is None
        view = root.views[-1]
        view.buf.copy_to_device(self.devices[target])
        self.allocated(view, target)

    # --- reads -----------------------------------------------------------------------------

    @precondition(lambda self: self.views and not self.armed)
    @rule(i=PICK, how=st.sampled_from(["asarray", "copy_to_host"]))
    def read(self, i, how):
        view = self.pick(i)
        if how == "copy_to_host":
            view.buf.copy_to_host()
        self.check_read(view, np.asarray(view.buf), how)
        self.came_home(view)

    @precondition(lambda self: self.views and len(self.exports) < 6)
    @rule(i=PICK)
    def export_dlpack(self, i):
        """np.from_dlpack: host memory without a copy where the data is on the CPU, else (data
        on the device) a host copy asked for with device="cpu"."""
        view = self.pick(i)
        on_cpu = view.buf.__dlpack_device__()[0] == 1
        holder = {}

        def export():
            holder["array"] = np.from_dlpack(view.buf) if on_cpu \
                else np.from_dlpack(view.buf, device="cpu")

        if self.device_op(export, view.root) is not None or "array" not in holder:
            return  # (failed, or a disturbance's exception came in place of the array)
        array = holder["array"]
        self.check_read(view, array, "np.from_dlpack")
        self.came_home(view)
        if on_cpu:
            assert np.shares_memory(array, view.buf.numpy()), "a CPU export copied"
        # A zero-copy export keeps its Buffer (and its handle) alive until the array goes.
        self.exports.append((array, view if on_cpu else None))

    @precondition(lambda self: self.exports and not self.armed)
    @rule()
    def release_exports(self):
        kept = [view for _, view in self.exports if view is not None]
        self.collect(self.exports.clear)
        for view in kept:
            if view.dropped and view in view.root.views:
                self.forget(view)

    @precondition(lambda self: self.views and not self.armed)
    @rule(i=PICK)
    def drop(self, i):
        view = self.views.pop(i % len(self.views))
        exported = any(kept is view for _, kept in self.exports)

        def let_go():
            view.buf = None

        view.dropped = True
        self.collect(let_go)
        if not exported:
            self.forget(view)

    def collect(self, release):
        """Drop references (``release``) and collect, failing on a finalizer's error (the
        README: dropping frees device memory and copies device results home)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", shim.DirtyBufferWarning)  # documented, expected
            release()
            gc.collect()
        problems = [str(w.message) for w in caught]
        assert not problems, f"dropping Buffers warned: {problems}"

    # --- fork ------------------------------------------------------------------------------

    # (not under a sanitizer that cannot run such a child: tests/support/sanitizers.py)
    @precondition(lambda self: not self.armed and THREADS_BUSY_AT_FORK is None
                  and THREADS_AFTER_FORK is None)
    @rule(runtime=st.sampled_from(RUNTIMES))
    def fork(self, runtime):
        """os.fork while another thread is in a CPU pipeline's parallel loop. The README: CPU
        pipelines and the host device work in the child. There every Buffer whose family is in
        host memory or on the host device reads as the model says, and a parallel CPU pipeline
        runs right; the child exits, its result through its status."""
        brighten = pipelines("host", runtime)["brighten"]
        source = np.arange(200 * 8, dtype=np.float32).reshape(200, 8)
        stop, calls = threading.Event(), []

        def call_in_a_loop():
            while not stop.is_set():
                brighten(source, scale=2.0, offset=1.0, output=source.shape)
                calls.append(1)

        caller = threading.Thread(target=call_in_a_loop)
        caller.start()
        while not calls and caller.is_alive():
            pass
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nothing of Hypothesis or pytest runs here
            code = 1
            try:
                signal.alarm(FORK_HANG_GUARD_S)
                for view in self.views:
                    if view.root.device in (None, "host"):
                        self.check_read(view, np.asarray(view.buf), "np.asarray in a forked child")
                out = brighten(source, scale=2.0, offset=1.0, output=source.shape).numpy()
                np.testing.assert_array_equal(out, source * 2 + 1)
                code = 0
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                os.write(write, repr(e).encode()[:4000])
            finally:
                os._exit(code)
        os.close(write)
        stop.set()
        caller.join()
        with os.fdopen(read, "rb") as report:
            problem = report.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, \
            f"a forked child (status {os.waitstatus_to_exitcode(status)}): {problem}"

    # --- faults (simulated host device only) -----------------------------------------------

    @precondition(lambda self: self.faults and not self.armed and self.disturbance is None)
    @rule(which=st.sampled_from(["fail_copy", "fail_allocation"]), n=st.integers(1, 3))
    def arm_fault(self, which, n):
        self.devices["host"].set_faults(**{which: n})
        self.armed = True

    @precondition(lambda self: self.armed)
    @rule()
    def clear_faults(self):
        self.disarm()

    # --- what a program brings along ---------------------------------------------------------

    @precondition(lambda self: not self.armed and self.disturbance is None)
    @rule(kind=st.sampled_from(["signal", "half-imported pyopencl.array"]), nth=st.integers(1, 16))
    def disturb(self, kind, nth):
        """The next device operation is disturbed (see disturbed). Faults stay off meanwhile:
        which exception would come out first is not the point."""
        if kind == "signal" and threading.current_thread() is not threading.main_thread():
            pytest.fail("signals land on the main thread: run this test there")
        self.disturbance = (kind, nth)

    @precondition(lambda self: self.toggler is None)
    @rule()
    def profile_from_another_thread(self):
        self.toggler = ProfileToggler()
        self.toggler.start()

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def buffers_read_the_model(self):
        if not self.eager or self.armed:
            return  # (reads copy, and an armed fault would fire in here)
        for view in self.views:
            self.check_read(view, np.asarray(view.buf), "np.asarray")
            self.came_home(view)

    @invariant()
    def allocations_match_the_model(self):
        for view in self.views:
            assert view.buf.has_device_allocation() == view.holds, (
                f"{view.describe()}: has_device_allocation is {view.buf.has_device_allocation()}, "
                f"the model says {view.holds} (family on {view.root.device})")
            if view.holds:
                assert view.buf.device.kind == view.root.device
        for kind, dev in self.devices.items():
            expected = sum(1 for root in self.roots if root.device == kind)
            live = dev.live_allocations - self.baseline[kind]
            assert live == expected, f"{kind}: {live} live allocations, the model has {expected}"

    def teardown(self):
        if self.armed:
            self.disarm()
        if self.toggler is not None:
            self.toggler.finish()
        views, self.views = self.views, []
        if sys.exc_info()[0] is not None:
            # A step failed or was abandoned (teardown runs in Hypothesis's ``finally``): its
            # traceback may keep Buffers alive, so leaks cannot be judged; let go of the rest.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", shim.DirtyBufferWarning)
                self.exports.clear()
                self.roots.clear()
                del views
            return
        for view in views:
            self.check_read(view, np.asarray(view.buf), "final np.asarray")

        def release_everything():
            self.exports.clear()
            for view in views:
                view.buf = None

        self.collect(release_everything)
        for root in list(self.roots):
            for view in list(root.views):
                self.forget(view)
        for kind, dev in self.devices.items():
            assert dev.live_allocations == self.baseline[kind], \
                f"{kind}: allocations left after every Buffer was dropped"


SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow])


class HostDeviceMachine(BufferMachine):
    device_kind = "host"
    faults = True


class OpenCLMachine(BufferMachine):
    device_kind = "opencl"
    other_kind = "host"


TestOnTheHostDevice = HostDeviceMachine.TestCase
TestOnTheHostDevice.settings = SETTINGS

TestOnOpenCL = pytest.mark.skipif(not opencl_available(), reason="no OpenCL device")(
    OpenCLMachine.TestCase)
TestOnOpenCL.settings = SETTINGS
