"""The C fast paths on crops (native_stubs/fast/shared_records.c) against the Python run, side by
side: Hypothesis drives the same random sequence of operations on two identical worlds, one
whose pipeline calls take the fast paths (a plain call, a prepared call run twice), one whose
calls all run in Python (PreparedCall._run_in_python, the code the fast paths replace). After
every step each Buffer must have the same dirty bits in both worlds, each family the same
regions and no call left recorded; at the end both worlds' data must be equal and equal to a
numpy model of what the pipelines wrote.

The operations: crops of crops, dropped crops, crop_fill into any view (the CPU build, and on
OpenCL the GPU build too), times_k reading a view of one family (its whole root, or a crop
of it) into a view of another or of the same family, device copies both ways,
set_host_dirty, device_free.
"""

import gc
import os

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shim
from shim.pipelines.build import Build, build_all
from support.budget import scaled

EXAMPLES = scaled(25, 150, "HALIDE_SHIM_STATEFUL_EXAMPLES")
STEPS = int(os.environ.get("HALIDE_SHIM_STATEFUL_STEPS", "30"))

SHAPE = (6, 8)  # numpy order: (height, width)
PICK = st.integers(0, 1 << 16)
WORLDS = ("fast", "python")

_pipelines = {}


def opencl_available() -> bool:
    return any(kind == "opencl" for kind, _ in shim.devices())


def pipeline(name: str, target: str) -> shim.Pipeline:
    if (name, target) not in _pipelines:
        path = build_all([Build(name, target, "no_runtime")], progress=None).popitem()[1]
        _pipelines[name, target] = shim.load(path)
    return _pipelines[name, target]


def run(world: str, p: shim.Pipeline, **arguments) -> None:
    """A call of ``p`` in ``world``: fast, a plain call then a prepared call run twice (the
    plain call makes the plans, the prepared runs find them); python, the same runs in
    Python."""
    if world == "fast":
        p(**arguments)
        with p.prepare(**arguments) as prepared:
            prepared()
            prepared()
    else:
        for _ in range(3):
            with p.prepare(**arguments) as prepared:
                prepared._run_in_python()


def family_of(buf: shim.Buffer):
    return buf.family


class View:
    """A Buffer in each world, and where it lies in its root (numpy index)."""

    def __init__(self, bufs: dict, family: int, index: tuple):
        self.bufs, self.family, self.index = bufs, family, index


class SideBySide(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.device = "opencl" if opencl_available() else None
        # Families 0 and 1: int32 (crop_fill writes them); 2 and 3: float32 (times_k).
        self.models = [np.zeros(SHAPE, np.int32), np.zeros(SHAPE, np.int32),
                       np.arange(48, dtype=np.float32).reshape(SHAPE),
                       np.zeros(SHAPE, np.float32)]
        self.views = [View({world: shim.Buffer(model.copy()) for world in WORLDS}, f,
                           (slice(0, SHAPE[0]), slice(0, SHAPE[1])))
                      for f, model in enumerate(self.models)]
        self.param = 0

    def pick(self, i: int, families=None) -> View:
        views = [v for v in self.views if families is None or v.family in families]
        return views[i % len(views)]

    def both(self, action) -> None:
        """``action(world)`` in each world: the same outcome, an exception or none, in both."""
        outcomes = []
        for world in WORLDS:
            try:
                action(world)
                outcomes.append(None)
            except shim.ShimError as e:
                outcomes.append(type(e).__name__)
        assert outcomes[0] == outcomes[1], f"fast: {outcomes[0]}, python: {outcomes[1]}"

    @rule(i=PICK, data=st.data())
    def crop(self, i, data):
        view = self.pick(i)
        shape = view.bufs["fast"].shape
        y0 = data.draw(st.integers(0, shape[0] - 1))
        x0 = data.draw(st.integers(0, shape[1] - 1))
        h = data.draw(st.integers(1, shape[0] - y0))
        w = data.draw(st.integers(1, shape[1] - x0))
        mins = [view.bufs["fast"].dim(d).min() for d in (0, 1)]
        bufs = {world: buf.cropped([(mins[0] + x0, w), (mins[1] + y0, h)])
                for world, buf in view.bufs.items()}
        rows, cols = view.index
        index = (slice(rows.start + y0, rows.start + y0 + h),
                 slice(cols.start + x0, cols.start + x0 + w))
        self.views.append(View(bufs, view.family, index))

    @precondition(lambda self: len(self.views) > 4)
    @rule(i=PICK)
    def drop(self, i):
        crops = self.views[4:]
        view = crops[i % len(crops)]
        self.views.remove(view)
        view.bufs.clear()
        gc.collect()

    @rule(i=PICK, gpu=st.booleans())
    def fill(self, i, gpu):
        view = self.pick(i, families=(0, 1))
        target = self.device if gpu and self.device else "host"
        self.param += 1
        p, param = pipeline("crop_fill", target), self.param
        self.both(lambda world: run(world, p, param=param, f=view.bufs[world]))
        h, w = view.bufs["fast"].shape
        x0, y0 = (view.bufs["fast"].dim(d).min() for d in (0, 1))
        xs, ys = np.meshgrid(np.arange(x0, x0 + w), np.arange(y0, y0 + h))
        self.models[view.family][view.index] = xs * 100 + ys + param * 10000

    @rule(i=PICK, j=PICK, whole_input=st.booleans())
    def scale(self, i, j, whole_input):
        """times_k from family 2 (its root, or a crop of it that covers the output's box) into a
        view of family 3 or of family 2 itself."""
        out = self.pick(j, families=(2, 3))
        source = self.views[2]
        if not whole_input:
            covering = [v for v in self.views if v.family == 2 and v is not out
                        and covers(v, out)]
            source = covering[i % len(covering)] if covering else source
        k = float(1 + (self.param % 3))
        self.param += 1
        p = pipeline("times_k", "host")
        model_in = self.models[2].copy()
        self.both(lambda world: run(world, p, input=source.bufs[world], k=k,
                                    output=out.bufs[world]))
        # Three runs: an output inside the input's family reads what the run before wrote.
        result = self.models[out.family].copy()
        for _ in range(3):
            result[out.index] = model_in[out.index] * np.float32(k)
            if out.family == 2:
                model_in = result.copy()
        self.models[out.family] = result

    @precondition(lambda self: self.device is not None)
    @rule(i=PICK)
    def to_device(self, i):
        view = self.pick(i)
        self.both(lambda world: view.bufs[world].copy_to_device(self.device))

    @rule(i=PICK)
    def to_host(self, i):
        view = self.pick(i)
        self.both(lambda world: view.bufs[world].copy_to_host())

    @rule(i=PICK)
    def host_dirty(self, i):
        view = self.pick(i)
        self.both(lambda world: view.bufs[world].set_host_dirty(True))

    @rule(i=PICK)
    def free(self, i):
        view = self.pick(i)
        self.both(lambda world: view.bufs[world].device_free())

    @invariant()
    def same_state(self):
        for view in self.views:
            fast, python = view.bufs["fast"], view.bufs["python"]
            assert (fast.host_dirty(), fast.device_dirty()) == (python.host_dirty(), python.device_dirty())
            assert family_of(fast).uses == [] and family_of(python).uses == []
            if family_of(fast).shared:
                assert family_of(fast).regions == family_of(python).regions

    def teardown(self):
        for view in self.views[:4]:
            for world in WORLDS:
                np.testing.assert_array_equal(np.asarray(view.bufs[world]),
                                              self.models[view.family])
        self.views.clear()
        gc.collect()


def covers(outer: View, inner: View) -> bool:
    (a, b), (c, d) = outer.index, inner.index
    return a.start <= c.start and c.stop <= a.stop and b.start <= d.start and d.stop <= b.stop


def test_fast_paths_on_crops_match_the_python_run():
    pipeline("crop_fill", "host"), pipeline("times_k", "host")
    if opencl_available():
        pipeline("crop_fill", "opencl")
    SideBySide.TestCase.settings = settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
        suppress_health_check=list(HealthCheck))
    SideBySide.TestCase().runTest()
