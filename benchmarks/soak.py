"""Soak test: N threads doing random device operations for M minutes, every read checked.

    python benchmarks/soak.py [--threads 8] [--minutes 5] [--device opencl|host] [--seed 0]

Each thread owns a column band (a crop) of every shared parent, and a whole Buffer of its own.
It runs pipelines (crop_fill) into them, writes them through numpy() + set_host_dirty(),
copies them to the host and the device, frees their device memory, drops and re-makes crops
(and short-lived crops of crops), round-trips its data through DLPack, and reads, uploads
and frees the whole shared parents (checking its own band of them); after every write
and on every read it checks the data against what it wrote itself: a difference is a lost
write. On ``host`` the pipelines are the CPU builds and the Buffers live on the simulated
host device. It also runs a parallel CPU pipeline (brighten) on arrays of its own, and forks
while the others are in the middle of all that: the child (where the README says CPU
pipelines and the host device work) reads the Buffer and runs brighten; a child that fails,
or has not ended FORK_HANG_GUARD_S after the fork, is an error of the fork operation. (A read
there refused because another thread of the parent was using the Buffer's family at the fork,
as docs/threads.md says it is, is no failure.)

What a program brings along (``--no-disturb`` leaves it out): the main thread is one of the
workers, with a signal handler of the program's own that raises (Interrupted, as a timeout
would), and a disturber thread sends it that signal at random moments, starts and stops
profiles over and over, and keeps putting pyopencl.array in sys.modules half-imported, as
another thread importing it would. An operation the handler's exception comes out of is done
or not done at all: the worker forgets what it expected and takes what it next reads (counted
as "interrupted"); the exception turned into a ShimError is an error.

Reported: operations done per kind, errors per kind (exception type and Halide code), lost
writes, resident memory growth (VmRSS after a warm-up and at the end) and the device's live
allocations once everything is dropped. Exit status 1 if a write was lost, an allocation is
left, or any exception other than the documented -37 refusal (host_and_device_dirty, counted
and reported) happened.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import gc
import itertools
import os
import random
import signal
import sys
import threading
import time
import traceback
import types
import warnings

import numpy as np

import shim
from shim.native import lib
from shim.pipelines.build import Build, build_all

HEIGHT = 16
BAND = 8  # columns per thread in each shared parent
PARENTS = 2
WARM_UP_SECONDS = 5
PROGRESS_SECONDS = 10
# The one refusal the README documents for these operations, -37 for a host write over newer
# device data: counted and reported, not fatal. The same code from any other operation is.
DOCUMENTED = {("host_write", "DeviceError", lib.halide_error_code_host_and_device_dirty)}
# A forked child still running this long after the fork is hung (SIGALRM ends it): a hang
# guard, never a check of speed.
FORK_HANG_GUARD_S = 30
# No progress line for this long means the soak itself hangs: every thread's stack goes to
# stderr and the process ends (a hang guard again, never a check of speed).
HANG_GUARD_S = 120


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def crop_fill_values(shape, param: int) -> np.ndarray:
    """crop_fill's f(x, y) = x * 100 + y + param * 10000 over a whole root."""
    ys, xs = np.mgrid[0:shape[0], 0:shape[1]]
    return (xs * 100 + ys + param * 10000).astype(np.int32)


class Stats:
    """Counters shared by the threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ops = collections.Counter()
        self.errors = collections.Counter()
        self.first_error: dict[tuple, str] = {}
        self.first_traceback: dict[tuple, str] = {}
        self.lost = 0
        self.lost_examples: list[str] = []

    def op(self, kind: str) -> None:
        with self.lock:
            self.ops[kind] += 1

    def error(self, operation: str, e: BaseException, where: str) -> None:
        key = (operation, type(e).__name__, getattr(e, "code", None))
        with self.lock:
            self.errors[key] += 1
            if key not in self.first_error:
                self.first_error[key] = f"{where}: {e}"
                self.first_traceback[key] = "".join(traceback.format_exception(e))

    def lost_write(self, message: str) -> None:
        with self.lock:
            self.lost += 1
            if len(self.lost_examples) < 5:
                self.lost_examples.append(message)


class ForkedChildFailed(Exception):
    """A child forked by the fork operation failed, crashed or hung."""


class Interrupted(BaseException):
    """What the program's own signal handler raises (as KeyboardInterrupt, not an Exception)."""


class Alarm:
    """The program's signal handler: raises Interrupted while armed, disarming itself as it
    does, so that its exceptions come out of the operations the main worker armed it for (a
    handler raising anywhere in this script's own loop would test the script, not the shim)."""

    def __init__(self):
        self.armed = False

    def __call__(self, signum, frame):
        if self.armed:
            self.armed = False
            raise Interrupted(f"signal {signum}")


class Disturber(threading.Thread):
    """Sends the main thread SIGUSR1 (whose handler raises Interrupted) at random moments,
    starts and stops profiles, and puts pyopencl.array in sys.modules half-imported and back,
    until ``stop``; what fails is an error of the "profile" operation."""

    def __init__(self, stats: Stats, seed: int):
        super().__init__(daemon=True)
        self.stats, self.random, self.done = stats, random.Random(seed), threading.Event()

    def run(self) -> None:
        main = threading.main_thread().ident
        profile = None
        while not self.done.wait(self.random.uniform(0, 0.004)):
            signal.pthread_kill(main, signal.SIGUSR1)
            try:
                profile = profile.stop() and None if profile else shim.profile().start()
                self.stats.op("profile")
            except Exception as e:  # noqa: BLE001 - counted by kind, judged at the end
                self.stats.error("profile", e, "the disturber")
                profile = None
            self.half_import()
        if profile is not None:
            profile.stop()

    def half_import(self) -> None:
        name, real = "pyopencl.array", sys.modules.get("pyopencl.array")
        if isinstance(real, types.ModuleType) and hasattr(real, "Array"):
            sys.modules[name] = types.ModuleType(name)  # (as another thread's import begins)
            time.sleep(0.0005)
            sys.modules[name] = real


class Target:
    """One Buffer a thread writes (a band of a shared parent, or its own whole Buffer) and
    what it must read; ``expected`` is None after a failed operation left it unknown."""

    def __init__(self, name: str, make, columns: slice, root_shape, parent=None):
        self.name = name
        self.make = make  # -> a new Buffer over the region (a crop again, for bands)
        self.columns = columns  # the region's columns in its root
        self.root_shape = root_shape
        self.parent = parent  # the shared parent, for bands
        self.buf = make()
        self.expected = np.asarray(self.buf).copy()


class SoakThread:
    def __init__(self, index, parents, device, crop_fill, brighten, stats: Stats, seed: int):
        self.index = index
        self.alarm = None  # the main thread's worker: the Alarm it arms around each operation
        self.device = device
        self.crop_fill = crop_fill
        self.brighten = brighten  # its CPU build, a parallel loop over rows
        self.source = np.arange(HEIGHT * 64, dtype=np.float32).reshape(-1, 8)  # brighten's input
        self.stats = stats
        self.random = random.Random(seed * 1000 + index)
        self.values = itertools.count(index * 10_000_000 + 1)
        band = slice(index * BAND, (index + 1) * BAND)
        self.targets = [Target(f"parent {p} band", lambda parent=parent: parent.cropped(0, band.start, BAND),
                               band, parent.shape, parent) for p, parent in enumerate(parents)]
        own = np.full((HEIGHT, BAND * 2), -1, np.int32)
        self.targets.append(Target("own Buffer", lambda: shim.Buffer(own), slice(0, own.shape[1]),
                                   own.shape))
        self.operations = [self.pipeline, self.host_write, self.read, self.copy_to_host,
                           self.copy_to_device, self.device_free, self.recrop, self.sub_crop,
                           self.dlpack, self.parent_read, self.parent_copy_to_device,
                           self.parent_device_free, self.cpu_pipeline, self.fork]

    def step(self) -> None:
        target = self.random.choice(self.targets)
        operation = self.random.choice(self.operations)
        try:
            # (Not around a fork: os.fork runs Python's own at-fork handlers, logging's among
            # them, which an exception cut short leaves with a lock taken or freed twice.)
            if self.alarm is not None and operation != self.fork:
                self.alarm.armed = True
            try:
                operation(target)
            finally:
                if self.alarm is not None:
                    self.alarm.armed = False
            self.stats.op(operation.__name__)
        except Interrupted:
            self.stats.op("interrupted")  # done or not done at all: take what is read next
            target.expected = None
            if target.buf is None:
                target.buf = target.make()  # (recrop, cut between dropping and re-making)
        except Exception as e:  # noqa: BLE001 - counted by kind, judged at the end
            self.stats.error(operation.__name__, e, f"thread {self.index} on {target.name}")
            target.expected = None  # unknown now: the next read re-syncs

    def check(self, target: Target, actual: np.ndarray, after: str) -> None:
        if target.expected is None:
            target.expected = actual.copy()
            return
        if not np.array_equal(actual, target.expected):
            wrong = int(np.count_nonzero(actual != target.expected))
            self.stats.lost_write(f"thread {self.index}, {target.name}: {wrong} of "
                                  f"{actual.size} elements wrong after {after}")
            target.expected = actual.copy()  # count each loss once

    # --- operations ----------------------------------------------------------------------

    def pipeline(self, target: Target) -> None:
        param = next(self.values)
        self.crop_fill(param=param, f=target.buf)
        target.expected = crop_fill_values(target.root_shape, param)[:, target.columns]
        self.check(target, np.asarray(target.buf), "a pipeline call")

    def host_write(self, target: Target) -> None:
        base = -next(self.values) * 1000
        shape = target.buf.shape
        values = (base - np.arange(shape[0] * shape[1])).reshape(shape).astype(np.int32)
        target.buf.numpy()[...] = values  # numpy() brings device changes home first
        target.buf.set_host_dirty()
        target.expected = values
        self.check(target, np.asarray(target.buf), "a host write")

    def read(self, target: Target) -> None:
        self.check(target, np.asarray(target.buf), "a read")

    def copy_to_host(self, target: Target) -> None:
        target.buf.copy_to_host()
        self.check(target, target.buf.numpy(), "copy_to_host")

    def copy_to_device(self, target: Target) -> None:
        target.buf.copy_to_device(self.device)

    def device_free(self, target: Target) -> None:
        target.buf.device_free()

    def recrop(self, target: Target) -> None:
        """Drop the Buffer (a band's unread device data stays with its family; an own Buffer's
        comes home to its array) and make it again."""
        target.buf = None
        if self.random.random() < 0.1:
            gc.collect()
        target.buf = target.make()
        self.check(target, np.asarray(target.buf), "dropping and re-making it")

    def sub_crop(self, target: Target) -> None:
        """A short-lived crop of a crop: reads what the region holds there."""
        y = self.random.randrange(HEIGHT - 1)
        piece = target.buf.cropped(1, y, 2)
        actual = np.asarray(piece).copy()
        del piece
        if target.expected is not None and not np.array_equal(actual, target.expected[y:y + 2]):
            self.stats.lost_write(f"thread {self.index}, {target.name}: a crop of it reads "
                                  f"wrong data")

    # Operations on a whole shared parent, while the other threads work on their bands: they
    # bring home, send up or let go of everyone's data at once.

    def parent_read(self, target: Target) -> None:
        whole = np.asarray(target.parent if target.parent is not None else target.buf)
        self.check(target, whole[:, target.columns], "a read of the whole parent")

    def parent_copy_to_device(self, target: Target) -> None:
        (target.parent if target.parent is not None else target.buf).copy_to_device(self.device)

    def parent_device_free(self, target: Target) -> None:
        """The parent's handle goes; the crops keep the allocation and their data."""
        (target.parent if target.parent is not None else target.buf).device_free()

    def dlpack(self, target: Target) -> None:
        """Export (zero-copy where the data is on the CPU, else a host copy), import the
        exported data back as a Buffer, and read it."""
        buf = target.buf
        exported = np.from_dlpack(buf, device="cpu")  # zero-copy where the data is on the CPU
        self.check(target, exported, "a DLPack export")
        imported = shim.from_dlpack(exported.copy())
        self.check(target, np.asarray(imported), "a DLPack round trip")


    def cpu_pipeline(self, target: Target) -> None:
        """brighten's CPU build on arrays of the thread's own: a parallel loop on Halide's
        thread pool (while other threads fork)."""
        if not self.brightened():
            self.stats.lost_write(f"thread {self.index}: brighten's CPU build computed wrong "
                                  f"values")

    def brightened(self) -> bool:
        out = self.brighten(self.source, scale=2.0, offset=1.0, output=self.source.shape)
        return np.array_equal(out.numpy(), self.source * 2 + 1)

    def fork(self, target: Target) -> None:
        """Fork while the other threads are in pipeline calls and device operations. The child
        reads the target (its data may be only on a device the child cannot use: a
        DeviceError then, as the README says; or another thread was using its family, its
        parent's bands included, at the fork: a ShimError saying so, as docs/threads.md says)
        and runs brighten's CPU build."""
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(FORK_HANG_GUARD_S)
                try:
                    actual = np.asarray(target.buf)
                    code = 3 if target.expected is not None and \
                        not np.array_equal(actual, target.expected) else 0
                except shim.DeviceError:
                    code = 0 if self.device.kind != "host" else 4
                except shim.ShimError as e:
                    code = 0 if "another thread of the parent process" in str(e) else 6
                if not self.brightened():
                    code = 5
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            what = {-signal.SIGALRM: "hung", 3: "read wrong data", 4: "refused the host device",
                    5: "got a wrong result from the CPU pipeline",
                    6: "refused to read the Buffer for another reason"}.get(code, f"ended with {code}")
            raise ForkedChildFailed(f"a forked child {what}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--device", choices=("opencl", "host"), default="opencl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--disturb", action=argparse.BooleanOptionalAction, default=True,
                        help="the main thread works too, with signals whose handler raises, "
                             "profiles started and stopped, pyopencl.array half-imported "
                             "(default: on)")
    parser.add_argument("--switch-interval", type=float, default=1e-5,
                        help="seconds between Python thread switches (default 1e-5; Python's "
                             "own 5 ms lets each thread run dozens of operations alone, and "
                             "the races live in far shorter windows)")
    args = parser.parse_args(argv)
    sys.setswitchinterval(args.switch_interval)

    device = shim.device(args.device)
    specs = Build("crop_fill", args.device, "no_runtime"), Build("brighten", "host", "no_runtime")
    paths = build_all(specs, progress=None)
    crop_fill, brighten = (shim.load(paths[spec]) for spec in specs)
    warnings.simplefilter("ignore", shim.DirtyBufferWarning)  # dropped unread results: expected

    parents = [shim.Buffer(np.full((HEIGHT, BAND * args.threads), -1, np.int32))
               for _ in range(PARENTS)]
    stats = Stats()
    threads = [SoakThread(i, parents, device, crop_fill, brighten, stats, args.seed)
               for i in range(args.threads)]
    stop = threading.Event()

    def body(worker: SoakThread) -> None:
        while not stop.is_set():
            worker.step()

    # With --disturb the main thread is worker 0 (where Python runs signal handlers).
    on_main = threads[0] if args.disturb else None
    runners = [threading.Thread(target=body, args=(t,), daemon=True) for t in threads
               if t is not on_main]
    disturber = Disturber(stats, args.seed) if args.disturb else None
    if disturber is not None:
        on_main.alarm = Alarm()
        signal.signal(signal.SIGUSR1, on_main.alarm)
    started = time.monotonic()
    for runner in runners + ([disturber] if disturber else []):
        runner.start()
    rss_start = None
    deadline = started + args.minutes * 60
    next_report = time.monotonic() + PROGRESS_SECONDS
    faulthandler.dump_traceback_later(HANG_GUARD_S, exit=True)
    while time.monotonic() < deadline:
        if on_main is not None:
            on_main.step()
        else:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if rss_start is None and time.monotonic() >= started + WARM_UP_SECONDS:
            rss_start = rss_kib()
        if time.monotonic() >= next_report:
            next_report += PROGRESS_SECONDS
            with stats.lock:
                done, errors, lost = sum(stats.ops.values()), sum(stats.errors.values()), stats.lost
            print(f"[{time.monotonic() - started:6.0f} s] {done} ops, {errors} errors, "
                  f"{lost} lost writes, VmRSS {rss_kib() / 1024:.1f} MiB", flush=True)
            faulthandler.dump_traceback_later(HANG_GUARD_S, exit=True)
    stop.set()
    if disturber is not None:
        disturber.done.set()
        disturber.join(60)
    for runner in runners + ([disturber] if disturber else []):
        runner.join(60)
    hung = sum(runner.is_alive() for runner in runners + ([disturber] if disturber else []))
    rss_start = rss_kib() if rss_start is None else rss_start
    rss_end = rss_kib()

    # Drop everything; what is left on the device is a leak.
    del threads, parents, runners, on_main
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", shim.DirtyBufferWarning)
        gc.collect()
    live = device.live_allocations
    faulthandler.cancel_dump_traceback_later()

    elapsed = time.monotonic() - started
    print(f"\n{args.threads} threads on {device.kind} for {elapsed:.0f} s")
    print("operations:", ", ".join(f"{k} {n}" for k, n in sorted(stats.ops.items())),
          f"(total {sum(stats.ops.values())})")
    print("errors by kind:" if stats.errors else "errors by kind: none")
    for key, count in sorted(stats.errors.items(), key=lambda kv: -kv[1]):
        note = "documented refusal" if key in DOCUMENTED else "UNEXPECTED"
        print(f"  {key[1]} code {key[2]} in {key[0]}: {count} ({note}); first: "
              f"{stats.first_error[key]}")
        if key not in DOCUMENTED:
            print("    " + stats.first_traceback[key].replace("\n", "\n    "))
    print(f"lost writes: {stats.lost}")
    for example in stats.lost_examples:
        print(f"  {example}")
    print(f"VmRSS: {rss_start / 1024:.1f} MiB after warm-up, {rss_end / 1024:.1f} MiB at the end "
          f"({(rss_end - rss_start) / 1024:+.1f} MiB)")
    print(f"live device allocations after dropping everything: {live}")
    for w in caught:
        print(f"warning while dropping: {w.message}")

    unexpected = [key for key in stats.errors if key not in DOCUMENTED]
    failed = stats.lost > 0 or live != 0 or unexpected or hung or caught
    if hung:
        print(f"{hung} threads did not stop (deadlock?)")
    print("FAIL" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
