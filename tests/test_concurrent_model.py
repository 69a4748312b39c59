"""Concurrent workers on shared parents, checked against what each one wrote.

Each worker owns a region (a crop) of every shared parent and does random operations on it:
pipelines into it, host writes through numpy() + set_host_dirty(), copies both ways, frees,
dropping the crop and making it again, DLPack exports. With DISJOINT regions every read right
after a worker's own write must show that write (anything else is a lost write), and nothing
may be refused. With OVERLAPPING regions only what is well-defined is checked: the last write
wins, so after all workers end each element holds the last value some worker wrote there
(exactly that worker's, where only one worker covers it), and a host write may be refused with
-37 when another worker's device write to the overlap is newer (the README's refusal; the
worker then copies that over first and writes again, as the README says to).

A third thread works on the parents themselves meanwhile: reads them whole, copies them to the
device, frees their handles (the crops keep the allocation).

Longer runs: HALIDE_SHIM_LONG_TESTS=1 (400 rounds), or HALIDE_SHIM_CONCURRENT_ROUNDS=2000
"""

import faulthandler
import gc
import itertools
import random
import sys
import threading

import numpy as np
import pytest

import shim
from shim.pipelines.build import Build, build_all
from shim.native import lib
from support.budget import scaled

ROUNDS = scaled(40, 400, "HALIDE_SHIM_CONCURRENT_ROUNDS")
WORKERS = 4
PARENTS = 2
HEIGHT, WIDTH = 8, 32
WATCHDOG_SECONDS = 300
HOST_AND_DEVICE_DIRTY = lib.halide_error_code_host_and_device_dirty
OPERATIONS = ("pipeline", "host write", "read", "copy_to_device", "copy_to_host", "device_free",
              "recrop", "dlpack")

_values = itertools.count(1)  # fresh values for every write, across threads
_values_lock = threading.Lock()


def fresh() -> int:
    with _values_lock:
        return next(_values)


def crop_fill_values(param: int) -> np.ndarray:
    """crop_fill's f(x, y) over a whole parent (a crop keeps its parent's coordinates)."""
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH]
    return (xs * 100 + ys + param * 10000).astype(np.int32)


@pytest.fixture(params=["host", "opencl"])
def setting(request):
    """(device, crop_fill built for it): the CPU build with Buffers on the simulated host
    device (copies there sleep a little, to widen race windows), or the OpenCL build."""
    kind = request.param
    if kind == "opencl":
        device = request.getfixturevalue("opencl")
    else:
        device = shim.device("host")
        device.set_faults(delay=0.0002)
    (path,) = build_all([Build("crop_fill", kind, "no_runtime")], progress=None).values()
    # (Device memory left once the test's Buffers are gone fails it: tests/conftest.py.)
    yield device, shim.load(path)
    if kind == "host":
        device.clear_faults()


class Worker:
    """One thread's region of every parent, and what it last wrote there."""

    def __init__(self, index: int, parents, columns: tuple, device, crop_fill, disjoint: bool):
        self.index = index
        self.parents = parents
        self.lo, self.hi = columns
        self.device = device
        self.crop_fill = crop_fill
        self.disjoint = disjoint
        self.random = random.Random(index)
        self.crops = [self.make_crop(p) for p in range(len(parents))]
        # What this worker's region of each parent holds after its last write (a full-parent
        # array, only columns [lo, hi) meaningful).
        self.written = [np.asarray(parent).copy() for parent in parents]
        self.lost: list[str] = []
        self.refusals = 0  # documented -37 refusals (overlapping regions only)
        self.history: list[str] = []  # the last operations, for failure messages

    def make_crop(self, p: int):
        return self.parents[p].cropped(0, self.lo, self.hi - self.lo)

    def region(self, array: np.ndarray) -> np.ndarray:
        return array[:, self.lo:self.hi]

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            p = self.random.randrange(len(self.parents))
            operation = self.random.choice(OPERATIONS)
            self.history = (self.history + [f"{operation} on parent {p}"])[-8:]
            getattr(self, operation.replace(" ", "_"))(p)

    def check(self, p: int, actual: np.ndarray, after: str) -> None:
        """A read of this worker's own region: with disjoint regions it must show exactly the
        worker's last write (no one else writes there)."""
        if not self.disjoint:
            return
        expected = self.region(self.written[p])
        if not np.array_equal(actual, expected):
            wrong = int(np.count_nonzero(actual != expected))
            self.lost.append(f"worker {self.index}, parent {p}: {wrong} of {expected.size} "
                             f"elements wrong in a read after {after} (operations: "
                             f"{self.history})")

    def pipeline(self, p: int) -> None:
        param = fresh()
        self.crop_fill(param=param, f=self.crops[p])
        self.region(self.written[p])[...] = self.region(crop_fill_values(param))
        self.check(p, np.asarray(self.crops[p]), "its pipeline call")

    def host_write(self, p: int) -> None:
        values = -fresh() * 1000 - np.arange(HEIGHT * (self.hi - self.lo), dtype=np.int32)
        values = values.reshape(HEIGHT, self.hi - self.lo)
        crop = self.crops[p]
        for _attempt in range(100):
            crop.numpy()[...] = values  # numpy() brings device changes home first
            try:
                crop.set_host_dirty()
                break
            except shim.DeviceError as e:
                # Only another worker's newer device write to the overlap may refuse this.
                if self.disjoint or e.code != HOST_AND_DEVICE_DIRTY:
                    raise
                self.refusals += 1
                crop.copy_to_host()  # "copy the other side over first", then write again
        else:
            raise AssertionError("a host write was refused 100 times in a row")
        self.region(self.written[p])[...] = values
        self.check(p, np.asarray(crop), "its host write")

    def read(self, p: int) -> None:
        self.check(p, np.asarray(self.crops[p]), "a read")

    def copy_to_device(self, p: int) -> None:
        self.crops[p].copy_to_device(self.device)

    def copy_to_host(self, p: int) -> None:
        self.crops[p].copy_to_host()
        self.check(p, self.crops[p].numpy(), "copy_to_host")

    def device_free(self, p: int) -> None:
        self.crops[p].device_free()

    def recrop(self, p: int) -> None:
        """Drop the crop (its unread device data stays with the family) and make it again."""
        self.crops[p] = None
        if self.random.random() < 0.3:
            gc.collect()
        self.crops[p] = self.make_crop(p)
        self.check(p, np.asarray(self.crops[p]), "dropping its crop and cropping again")

    def dlpack(self, p: int) -> None:
        # Asked for the CPU (zero-copy where the data is there): asking __dlpack_device__ first
        # races with the parents' thread moving the family to the device in between.
        exported = np.from_dlpack(self.crops[p], device="cpu")
        self.check(p, exported, "a DLPack export")


def parent_work(parents, device, stop: threading.Event, errors: list) -> None:
    """Operations on the parents while the workers run: none of them may fail."""
    rng = random.Random(1234)
    while not stop.is_set():
        parent = rng.choice(parents)
        operation = rng.choice(("read", "copy_to_device", "device_free"))
        try:
            if operation == "read":
                np.asarray(parent)
            elif operation == "copy_to_device":
                parent.copy_to_device(device)
            else:
                parent.device_free()
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"parent thread, {operation}: {type(e).__name__}: {e}")
            return


def run_workers(device, crop_fill, regions, rounds: int):
    """Run one worker per region on shared parents; returns (workers, parents, errors)."""
    parents = [shim.Buffer(np.full((HEIGHT, WIDTH), -1, np.int32)) for _ in range(PARENTS)]
    disjoint = all(a[1] <= b[0] for a, b in zip(regions, regions[1:]))
    workers = [Worker(i, parents, region, device, crop_fill, disjoint)
               for i, region in enumerate(regions)]
    errors: list[str] = []
    start = threading.Barrier(len(workers))
    stop = threading.Event()

    def body(worker):
        start.wait()
        try:
            worker.run(rounds)
        except Exception as e:  # noqa: BLE001 - reported by the test
            code = f" (code {e.code})" if hasattr(e, "code") else ""
            errors.append(f"worker {worker.index}: {type(e).__name__}{code}: {e} "
                          f"(operations: {worker.history})")

    threads = [threading.Thread(target=body, args=(w,), daemon=True) for w in workers]
    side = threading.Thread(target=parent_work, args=(parents, device, stop, errors), daemon=True)
    # Python switches threads every 5 ms, long enough for a worker to do several operations
    # alone; the races are in much shorter windows.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads + [side]:
            t.start()
        for t in threads:
            t.join(WATCHDOG_SECONDS)
        stop.set()
        side.join(WATCHDOG_SECONDS)
    finally:
        sys.setswitchinterval(interval)
    if any(t.is_alive() for t in threads + [side]):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pytest.fail(f"deadlock: threads still running after {WATCHDOG_SECONDS}s (stacks on stderr)")
    return workers, parents, errors


def test_disjoint_regions_lose_no_writes(setting):
    device, crop_fill = setting
    width = WIDTH // WORKERS
    regions = [(i * width, (i + 1) * width) for i in range(WORKERS)]
    workers, parents, errors = run_workers(device, crop_fill, regions, ROUNDS)
    lost = [message for w in workers for message in w.lost]
    # After everyone is done, each parent holds every worker's last write.
    for p, parent in enumerate(parents):
        final = np.asarray(parent)
        for w in workers:
            if not np.array_equal(w.region(final), w.region(w.written[p])):
                lost.append(f"parent {p} at the end: worker {w.index}'s last write is missing")
    assert not (errors or lost), (f"{len(errors)} failed operations, {len(lost)} lost writes; "
                                  f"first failure: {(errors or ['-'])[0]}; "
                                  f"first lost write: {(lost or ['-'])[0]}")


def test_overlapping_regions_keep_a_last_write(setting):
    device, crop_fill = setting
    # Each region overlaps the next by half: columns [0, 12), [6, 18), [12, 24), [18, 30).
    width = 12
    regions = [(i * width // 2, i * width // 2 + width) for i in range(WORKERS)]
    workers, parents, errors = run_workers(device, crop_fill, regions, ROUNDS)
    wrong = []
    for p, parent in enumerate(parents):
        final = np.asarray(parent)
        for x in range(WIDTH):
            covering = [w for w in workers if w.lo <= x < w.hi]
            if not covering:
                continue
            for y in range(HEIGHT):
                candidates = {int(w.written[p][y, x]) for w in covering}
                if int(final[y, x]) not in candidates:
                    wrong.append(f"parent {p} at x={x}, y={y}: {final[y, x]}, not one of the "
                                 f"last writes there {sorted(candidates)}")
    assert not (errors or wrong), (f"{len(errors)} failed operations, {len(wrong)} elements hold "
                                   f"no worker's last write; first failure: {(errors or ['-'])[0]}; "
                                   f"first wrong element: {(wrong or ['-'])[0]}")
