"""A forked child has a copy of its parent's memory but only the thread that forked.

- A process forked after the OpenCL device was used gets a copy of the parent's driver state
  but none of its threads: any OpenCL call there may wait forever. The child must get
  shim.DeviceError for every device use, from Python and from kernel launches in C, while host
  pipelines and the simulated host device keep working.
- A process forked while other threads run pipelines gets Halide's runtime locks and queues as
  those threads left them (native_stubs/forks/fork.c): every child must still finish its call of a
  parallel, -trace_all or -profile build with the right result and exit normally, whether it
  was forked from Python or from C, and its parallel loops run on workers of its own.

Each scenario runs in a subprocess (a hang or crash must not take the test session with it),
in its own process group so that a hung forked child is killed with it."""

import json
import os
import signal
import subprocess
import sys

import pytest

from shim.pipelines.build import Build, build
from support.sanitizers import THREADS_AFTER_FORK, THREADS_BUSY_AT_FORK, unless

TIMEOUT = 120  # seconds for the whole scenario; it takes a few when nothing hangs

SCENARIO = r"""
import os, sys
import numpy as np
import shim

brighten_cl, fill_cl, brighten_cpu = (shim.load(path) for path in sys.argv[1:4])
opencl = shim.device("opencl")
image = np.arange(48, dtype=np.float32).reshape(6, 8)
resident = brighten_cl(image, scale=2.0, offset=0.0, output=image.shape)  # device-dirty
np.testing.assert_array_equal(resident.numpy(), image * 2)
resident.set_device_dirty()  # its current data is on the device again


def refused(what, action):
    try:
        action()
    except shim.DeviceError as e:
        if "parent process" not in str(e) or "fork" not in str(e):
            raise AssertionError(f"{what}: the message does not say why: {e}") from None
        print(f"{what}: refused", flush=True)
        return
    raise AssertionError(f"{what}: no DeviceError")


def child():
    # A kernel whose module the parent compiled (launched from C), one compiled in the child
    # (through Python), uploads, downloads and a DLPack export that must synchronize.
    refused("launch", lambda: brighten_cl(image, scale=2.0, offset=0.0, output=image.shape))
    # (numpy arrays only: the fast path, in C, since the parent's call passed the bounds query)
    refused("arrays", lambda: brighten_cl(image, 2.0, 0.0, np.empty_like(image)))
    refused("compile", lambda: fill_cl(param=1, f=(4, 4)))
    refused("upload", lambda: shim.Buffer(image.copy()).copy_to_device(opencl))
    refused("download", resident.copy_to_host)
    refused("export", lambda: resident.__dlpack__(stream=None, dl_device=(4, 0)))  # kDLOpenCL
    np.testing.assert_array_equal(brighten_cpu(image, scale=3.0, offset=1.0, output=image.shape)
                                  .numpy(), image * 3 + 1)
    host = shim.Buffer(image.copy())
    host.copy_to_device(shim.device("host"))
    host.set_device_dirty()
    host.copy_to_host()
    np.testing.assert_array_equal(host.numpy(), image)
    print("host: works", flush=True)


pid = os.fork()
if pid == 0:
    child()
    sys.exit(0)  # a normal exit: the shim's exit handler runs in the child too
_, status = os.waitpid(pid, 0)
np.testing.assert_array_equal(resident.numpy(), image * 2)  # the parent's device is intact
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.fixture(scope="module")
def libraries(opencl):
    specs = [Build("brighten", "opencl", "no_runtime"), Build("crop_fill", "opencl", "bundled"),
             Build("brighten", "host", "no_runtime")]
    return [str(build(spec)) for spec in specs]


def run_isolated(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the forked child too
        out, err = process.communicate()
        pytest.fail(f"hung for {TIMEOUT} s; output so far:\n{out}\n{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@unless(THREADS_AFTER_FORK)
def test_a_forked_child_gets_device_errors_and_keeps_host_pipelines(libraries):
    done = run_isolated(SCENARIO, *libraries)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:7] == [
        "launch: refused", "arrays: refused", "compile: refused", "upload: refused", "download: refused",
        "export: refused", "host: works"]


# --- fork while other threads run pipelines ---------------------------------------------------

# A child still running this long after it was forked is hung (SIGALRM ends it): a hang guard,
# never a check of speed (a child's call takes milliseconds).
HANG_GUARD_S = 30
# In the parent, CALLERS threads call the pipeline in a loop on a pool of THREADS while the main
# thread forks FORKS children, each of which calls it once: enough contention on Halide's locks
# that before native_stubs/forks/fork.c reset them, 0 to 77 children of the 300 hung in each run (3
# runs of each case below; fewest inside a profile, where trace events go to the shim's buffer
# instead of Halide's), and 22 to 30 of the 30 that exited normally crashed.
CALLERS, THREADS, FORKS = 2, 4, 300
# Every NORMAL_EXIT-th child exits through exit handlers (Python's, Halide's destructors, which
# joined the parent's workers: a crash before); the others with _exit, which is quicker.
NORMAL_EXIT = 10

# argv: the pipeline, which it is ("blur3x3", or "async": async.so below), "python" or "c" (who
# forks), "profiled" or "plain" (whether a shim.profile() records in the parent while it
# forks), the output's height and width, FORKS, then the C helpers' library. Prints what became
# of the children, and of the parent's calls.
STORM = r"""
import ctypes, json, os, signal, sys, threading
import numpy as np
import shim
from shim.profiling import halide_profiler
from shim.native import ffi

path, which, forker, profiled, height, width, forks, helper = sys.argv[1:9]
height, width, forks = int(height), int(width), int(forks)
guard, callers, normal_exit = %(guard)d, %(callers)d, %(normal_exit)d
shim.set_num_threads(%(threads)d)
p = shim.load(path)
rng = np.random.default_rng(0)
if which == "blur3x3":
    inp = rng.integers(0, 1 << 16, (height + 2, width + 2), dtype=np.uint16)
    wide = inp.astype(np.uint32)
    blur_x = (wide[:, :-2] + wide[:, 1:-1] + wide[:, 2:]) // 3
    expected = ((blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) // 3).astype(np.uint16)
else:
    inp = rng.random((height + 1, width), dtype=np.float32)
    expected = inp[:-1] * 2 + inp[1:] * 2


def right():
    return np.array_equal(p(inp, output=(height, width)).numpy(), expected)


def python_child(n):
    signal.alarm(guard)
    if not right():
        os._exit(3)
    if prof is not None:  # the child's call is in its copy of the profile, Halide's figures too
        prof.stop()
        me = threading.get_native_id()
        [record] = [r for r in prof.records if r.kind == "pipeline" and r.thread == me]
        if halide_profiler.builds_profile(p.target) and record.stages is None:
            os._exit(4)
    if n %% normal_exit == 0:
        sys.exit(0)
    os._exit(0)


def buffer(array):
    # a halide_buffer_t of a C-contiguous 2-D uint16 array, x its last axis
    dims = ffi.new("halide_dimension_t[2]")
    dims[0].extent, dims[0].stride = array.shape[1], 1
    dims[1].extent, dims[1].stride = array.shape[0], array.shape[1]
    b = ffi.new("halide_buffer_t *")
    b.host = ffi.cast("uint8_t *", array.ctypes.data)
    b.type.code, b.type.bits, b.type.lanes = 1, 16, 1
    b.dimensions, b.dim = 2, dims
    return b, dims


if forker == "c":
    fork_and_run = ctypes.CDLL(helper).fork_and_run  # (releases the GIL: callers run on)
    fork_and_run.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2
    entry = ctypes.cast(ctypes.CDLL(path).blur3x3, ctypes.c_void_p)
    out = np.empty_like(expected)
    (b_in, d_in), (b_out, d_out) = buffer(inp), buffer(out)
    address = lambda b: int(ffi.cast("uintptr_t", b))

calls, wrong = [0] * callers, [0] * callers
stop = threading.Event()


def caller(i):
    while not stop.is_set():
        wrong[i] += not right()
        calls[i] += 1


assert right()
# (a small trace_limit: each child stops its copy of the profile, and the events recorded are
# made into records then)
prof = shim.profile(trace_limit=100).start() if profiled == "profiled" else None
threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
for t in threads:
    t.start()
while not all(calls):
    pass
children = []
for n in range(forks):
    if forker == "python":
        pid = os.fork()
        if pid == 0:
            python_child(n)
    else:
        pid = fork_and_run(entry.value, address(b_in), address(b_out), expected.ctypes.data,
                           guard, n %% normal_exit == 0)
    children.append(pid)
outcomes = {"finished": 0, "hung": 0, "failed": []}
for pid in children:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        outcomes["hung"] += 1
    elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        outcomes["finished"] += 1
    else:
        outcomes["failed"].append(os.waitstatus_to_exitcode(status))
stop.set()
for t in threads:
    t.join()
if prof is not None:
    prof.stop()
outcomes["parent wrong"] = sum(wrong) + (not right())
# (events go to Halide's handler, and HL_TRACE_FILE, only outside a profile)
outcomes["parent calls outside a profile"] = 2 if prof else sum(calls) + 2
print(json.dumps(outcomes))
""" % {"guard": HANG_GUARD_S, "callers": CALLERS, "threads": THREADS,
       "normal_exit": NORMAL_EXIT}

# C helpers, called through ctypes (which lets go of the GIL meanwhile).
# fork_and_run forks from C, where no Python at-fork hook runs: the child runs the pipeline on
# `in` and `out`, compares `out` with `expected` (uint16) and exits, with exit() where `normal`.
# hold_mutex holds a halide_mutex for `ms` milliseconds, setting *held once it has it.
HELPERS_C = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "HalideRuntime.h"

int fork_and_run(int (*pipeline)(halide_buffer_t *, halide_buffer_t *), halide_buffer_t *in,
                 halide_buffer_t *out, const void *expected, int guard_s, int normal) {
    pid_t pid = fork();
    if (pid != 0) {
        return pid;
    }
    alarm(guard_s);
    size_t bytes = (size_t)out->dim[0].extent * out->dim[1].extent * sizeof(uint16_t);
    int code = pipeline(in, out) != 0 ? 2 : memcmp(out->host, expected, bytes) != 0 ? 3 : 0;
    if (normal) {
        exit(code);
    }
    _exit(code);
}

void hold_mutex(struct halide_mutex *mutex, int ms, volatile int *held) {
    halide_mutex_lock(mutex);
    *held = 1;
    usleep(ms * 1000);
    halide_mutex_unlock(mutex);
}
"""


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    halide = pytest.importorskip("halide", reason="the C helpers include HalideRuntime.h")
    work = tmp_path_factory.mktemp("fork_helpers")
    (work / "helpers.c").write_text(HELPERS_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(halide.install_dir(), "include"),
                    "-o", str(work / "helpers.so"), str(work / "helpers.c")], check=True)
    return str(work / "helpers.so")


# (build features, HL_TRACE_FILE or not, the output's height and width). A parallel loop over
# many short rows keeps the work-queue mutex busy; -trace_all makes events for every load and
# store, so its images are tiny (printed, 300 children and the callers print some 10 MB).
CASES = {
    "parallel": ((), False, 1000, 8),
    "trace_all to HL_TRACE_FILE": (("trace_all",), True, 4, 4),
    "trace_all printed": (("trace_all",), False, 2, 2),
    "profile": (("profile",), False, 1000, 8),
}


def blur3x3_storm(case, forker, profiled, helpers, tmp_path):
    features, to_file, height, width = CASES[case]
    path = str(build(Build("blur3x3", "host", "bundled", features)))
    trace_file = tmp_path / "trace.bin" if to_file else None
    outcomes = storm(path, "blur3x3", forker, profiled, height, width, helpers, trace_file)
    if to_file:
        # One begin and one end of a pipeline per call, the parent's and each child's: a child
        # writes only its own events (the parent's still buffered at the fork are the parent's).
        calls = outcomes["parent calls outside a profile"] + (FORKS if profiled == "plain" else 0)
        assert pipeline_events(trace_file.read_bytes()) == (calls, calls)


def storm(path, which, forker, profiled, height, width, helpers, trace_file=None) -> dict:
    """Runs STORM; checks that every child finished, and the parent's calls; its outcomes."""
    env = dict(os.environ, HALIDE_SHIM_PROFILER_REPORT="off")
    env.pop("HL_TRACE_FILE", None)
    if trace_file is not None:
        env["HL_TRACE_FILE"] = str(trace_file)
    done = run_isolated(STORM, path, which, forker, profiled, str(height), str(width),
                        str(FORKS), helpers, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    outcomes = json.loads(done.stdout.splitlines()[-1])
    assert outcomes["hung"] == 0 and outcomes["failed"] == [], outcomes
    assert outcomes["finished"] == FORKS and outcomes["parent wrong"] == 0, outcomes
    return outcomes


def pipeline_events(trace: bytes) -> tuple[int, int]:
    """(begin_pipeline, end_pipeline) events in a trace file of Halide's binary packets
    (halide_trace_packet_t: uint32 size, int32 id, a halide_type_t, int32 event, ...), which
    must hold whole packets only."""
    begins = ends = offset = 0
    while offset < len(trace):
        size, event = int.from_bytes(trace[offset:offset + 4], "little"), trace[offset + 12]
        assert size >= 28 and offset + size <= len(trace), f"a cut packet at {offset}"
        begins += event == 8  # halide_trace_begin_pipeline
        ends += event == 9  # halide_trace_end_pipeline
        offset += size
    return begins, ends


@unless(THREADS_BUSY_AT_FORK, THREADS_AFTER_FORK)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_child_forked_while_other_threads_call_finishes_its_call(case, helpers, tmp_path):
    """Every child's call of a parallel, -trace_all or -profile build ends with the right
    result and the child exits; the parent's calls stay right. To HL_TRACE_FILE, each call's
    events are in the file once."""
    blur3x3_storm(case, "python", "plain", helpers, tmp_path)


@unless(THREADS_BUSY_AT_FORK, THREADS_AFTER_FORK)
@pytest.mark.parametrize("case", ["profile", "trace_all to HL_TRACE_FILE"])
def test_every_child_forked_inside_a_profile_finishes_its_call(case, helpers, tmp_path):
    """The parent's calls are recorded (Halide's figures per profiled call, trace events into
    the shim's buffer) while it forks; the children record theirs into their copy."""
    blur3x3_storm(case, "python", "profiled", helpers, tmp_path)


@unless(THREADS_BUSY_AT_FORK, THREADS_AFTER_FORK)
@pytest.mark.parametrize("case", ["parallel", "profile"])
def test_every_child_forked_from_c_finishes_its_call(case, helpers, tmp_path):
    """fork() called from C runs no Python at-fork hook: what the child needs of Halide's
    runtime is reset in C."""
    blur3x3_storm(case, "c", "plain", helpers, tmp_path)


@unless(THREADS_BUSY_AT_FORK, THREADS_AFTER_FORK)
def test_every_child_forked_while_other_threads_run_async_stages_finishes_its_call(built,
                                                                                 helpers):
    """Async producers keep the pool's workers on semaphores and jobs most of the time: before
    the fix, 262 of 300 children hung."""
    storm(built["async"], "async", "python", "plain", 200, 16, helpers)


# A parallel loop of n tasks, each of which waits in the extern stage fork_meet until all n
# have arrived: a call ends only once n threads ran its loop at once, whatever the timing.
# out(x, y) = y, one column.
MEET_C = r"""
#include <sched.h>
#include "HalideRuntime.h"

static int arrived;

int fork_meet(int32_t n, halide_buffer_t *out) {
    if (out->host == NULL) {
        return 0; /* a bounds query */
    }
    __atomic_add_fetch(&arrived, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&arrived, __ATOMIC_SEQ_CST) < n) {
        sched_yield();
    }
    ((int32_t *)out->host)[0] = 0;
    return 0;
}

void fork_meet_reset(void) {
    __atomic_store_n(&arrived, 0, __ATOMIC_SEQ_CST);
}
"""

# meet.so: the loop above. memo.so: memo_out(x, y) = table(x) + y, table(x) = x * k memoize()'d.
# async.so: output(x, y) = producer(x, y) + producer(x, y + 1), producer = 2 * inp, computed
# row by row ahead of output on another thread (async).
BUILD = r"""
import os, subprocess, sys
import halide as hl

work = sys.argv[1]
x, y = hl.Var("x"), hl.Var("y")


def link(out, args, name, *extra):
    out.compile_to({hl.OutputFileType.object: os.path.join(work, name + ".o")}, args, name,
                   hl.Target("host"))
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(hl.install_dir(), "include"),
                    "-o", os.path.join(work, name + ".so"), os.path.join(work, name + ".o"),
                    *extra, "-lpthread", "-ldl"], check=True)


n = hl.Param(hl.Int(32), "n", 1)
meet, out = hl.Func("meet"), hl.Func("out")
meet.define_extern("fork_meet", [n], hl.Int(32), [x])
out[x, y] = meet[x] + y
meet.compute_at(out, y)
out.parallel(y)
link(out, [n], "meet", os.path.join(work, "meet.c"))

k = hl.Param(hl.Int(32), "k", 0)
table, out = hl.Func("table"), hl.Func("memo_out")
table[x] = x * k
table.compute_root().memoize()
out[x, y] = table[x] + y
link(out, [k], "memo")

inp = hl.ImageParam(hl.Float(32), 2, "inp")
producer, out = hl.Func("producer"), hl.Func("output")
producer[x, y] = inp[x, y] * 2
out[x, y] = producer[x, y] + producer[x, y + 1]
producer.compute_at(out, y).store_root().fold_storage(y, 4).async_()
link(out, [inp], "async")
"""

WORKERS = r"""
import ctypes, json, os, signal, sys
import numpy as np
import shim

shim.set_num_threads(3)
p, meet = shim.load(sys.argv[1]), ctypes.CDLL(sys.argv[1])  # (meet.so)


def run():
    meet.fork_meet_reset()
    out = np.empty((3, 1), np.int32)
    p(3, out=out)
    assert out[:, 0].tolist() == [0, 1, 2], out


run()  # the parent's pool: this thread and two workers
pid = os.fork()
if pid == 0:
    signal.alarm(%(guard)d)
    threads = shim.num_threads()
    before = len(os.listdir("/proc/self/task"))
    run()
    print(json.dumps({"num_threads": threads, "threads before": before,
                      "threads after": len(os.listdir("/proc/self/task"))}), flush=True)
    sys.exit(0)  # Halide's destructor joins the child's workers
_, status = os.waitpid(pid, 0)
run()
sys.exit(os.waitstatus_to_exitcode(status))
""" % {"guard": HANG_GUARD_S}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{"meet": path, "memo": path, "async": path}"""
    pytest.importorskip("halide", reason="compiling the test pipelines needs halide")
    work = tmp_path_factory.mktemp("fork_pipelines")
    (work / "meet.c").write_text(MEET_C)
    subprocess.run([sys.executable, "-c", BUILD, str(work)], check=True)
    return {name: str(work / f"{name}.so") for name in ("meet", "memo", "async")}


@unless(THREADS_AFTER_FORK)
def test_a_child_keeps_the_thread_count_and_runs_its_loops_on_workers_of_its_own(built):
    """shim.set_num_threads(3) holds in the child, whose first parallel loop starts two workers
    (the parent's do not exist there) and runs its three tasks on three threads at once."""
    done = run_isolated(WORKERS, built["meet"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "num_threads": 3, "threads before": 1, "threads after": 3}


# A thread stalls inside what `stalled` names, computing it for one object, while the main thread
# forks; the child then computes the same for another object: a numpy dtype of a Halide type (a
# pipeline's first call, through Python), or a library's digest (a pickle). Python 3.11's
# functools.cached_property held one lock for all objects meanwhile: the child waited for good.
# argv: what, a pipeline, another pipeline.
STALLED = r"""
import hashlib, os, pickle, signal, sys, threading
import numpy as np
import shim
import shim.calls.library, shim.base.types
from shim.base.types import FLOAT, HalideType

what, path, other = sys.argv[1:4]
parent, inside, forked = os.getpid(), threading.Event(), threading.Event()


class Stalling:
    # numpy or hashlib, whose `name` waits, in the parent's thread `stalling`, until the fork
    def __init__(self, module, name):
        self.module, self.name = module, name

    def __getattr__(self, attribute):
        found = getattr(self.module, attribute)
        if attribute != self.name or threading.current_thread().name != "stalling" \
                or os.getpid() != parent:
            return found

        def stalled(*args):
            inside.set()
            forked.wait()
            return found(*args)
        return stalled


p, q = shim.load(path), shim.load(other)
if what == "dtype":
    shim.base.types.np = Stalling(np, "dtype")
    stall = lambda: HalideType(FLOAT, 16).dtype
    in_child = lambda: p(np.zeros((34, 66), np.uint16), output=(32, 64))  # (uint16: another)
else:
    sys.modules["hashlib"] = Stalling(hashlib, "sha256")  # (the digest imports it when asked)
    stall = lambda: p._library.digest
    in_child = lambda: pickle.dumps(q)
thread = threading.Thread(target=stall, name="stalling")
thread.start()
assert inside.wait(%(guard)d), "the thread never got inside: the test needs updating"
pid = os.fork()
if pid == 0:
    signal.alarm(%(guard)d)
    in_child()
    os._exit(0)
forked.set()
thread.join()
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
""" % {"guard": HANG_GUARD_S}


@unless(THREADS_BUSY_AT_FORK)
@pytest.mark.parametrize("what", ["dtype", "digest"])
def test_a_child_forked_while_another_thread_computes_a_cached_value_computes_its_own(what):
    paths = [str(build(Build(name, "host", "bundled"))) for name in ("blur3x3", "brighten")]
    done = run_isolated(STALLED, what, *paths)
    assert done.returncode == 0, (done.returncode, done.stderr)


# Threads read and reset the counts of calls decided in C (native_stubs/profiling/profile.c, under its
# lock) while the main thread forks; each child reads them once. argv: forks.
COUNTS = r"""
import os, signal, sys, threading
from shim.native import lib

stop = threading.Event()


def count():
    while not stop.is_set():
        lib.shim_profile_count(lib.SHIM_FN_COPY_TO_HOST, 0)  # (cffi releases the GIL)
        lib.shim_profile_reset()


threads = [threading.Thread(target=count) for _ in range(2)]
for t in threads:
    t.start()
children = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        signal.alarm(%(guard)d)
        lib.shim_profile_count(lib.SHIM_FN_COPY_TO_HOST, 0)
        os._exit(0)
    children.append(pid)
stop.set()
for t in threads:
    t.join()
print(sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in children))
""" % {"guard": HANG_GUARD_S}


@unless(THREADS_BUSY_AT_FORK)
def test_a_child_forked_while_other_threads_read_the_c_counts_reads_them():
    """The fork waits for the counts' lock (its holders wait for nothing), so the child gets
    it free and the counts whole. Before: 8 and 41 children of 500 hung (two runs)."""
    done = run_isolated(COUNTS, "500")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"], f"children failed or hung: {done.stdout}"


# A thread holds Halide's memoization cache lock (from C) while the main thread forks; the
# child calls a memoize()'d pipeline: a lookup that hits, one that misses and stores. argv:
# memo.so, the C helpers.
MEMOIZED = r"""
import ctypes, os, signal, sys, threading
import numpy as np
import shim
from shim import _native

p, helpers = shim.load(sys.argv[1]), ctypes.CDLL(sys.argv[2])


def right(k):
    out = np.empty((4, 8), np.int32)
    p(k, memo_out=out)
    return np.array_equal(out, np.arange(8) * k + np.arange(4)[:, None])


assert right(3)
lock = ctypes.c_char.in_dll(ctypes.CDLL(_native.__file__),
                           "_ZN6Halide7Runtime8Internal16memoization_lockE")
held = ctypes.c_int(0)
holder = threading.Thread(target=helpers.hold_mutex, args=(ctypes.byref(lock), 300,
                                                         ctypes.byref(held)))
holder.start()
while not held.value:
    pass
pid = os.fork()
if pid == 0:
    signal.alarm(%(guard)d)
    os._exit(0 if right(3) and right(4) else 3)
holder.join()
assert right(4)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""" % {"guard": HANG_GUARD_S}


@unless(THREADS_BUSY_AT_FORK)
def test_a_child_forked_while_another_thread_is_in_the_memoization_cache_uses_it(built, helpers):
    """The child's cache starts empty, its lock free (the parent's may have been in the middle
    of any change). Before: the child waited for good."""
    done = run_isolated(MEMOIZED, built["memo"], helpers)
    assert done.returncode == 0, (done.returncode, done.stderr)


# A thread holds one of the shim's own short locks (each guards a counter or a dict, never
# work) while the main thread forks; the child uses the host device: a copy up, a copy home,
# an injected copy failure (reported through the bridge), and the device made in the child.
# argv: which lock.
SHIM_LOCK = r"""
import os, signal, sys, threading
import numpy as np
import shim
from shim.core import bridge
from shim.backends.host import HostBackend

devices = sys.modules["shim.backends.devices"]  # (shim.backends.devices is also a function)
which = sys.argv[1]
if which == "device creation":  # the child makes the host device: not yet made here
    assert HostBackend.index not in devices._backends, "the test needs updating"
    lock = devices._creation_lock
else:
    host = shim.device("host")
    lock = {"transfers": host.transfers._lock, "host counters": host._counter_lock,
            "exceptions": bridge._exceptions_guard}[which]
held, forked = threading.Event(), threading.Event()


def hold():
    with lock:
        held.set()
        forked.wait()


holder = threading.Thread(target=hold)
holder.start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(%(guard)d)
    host = shim.device("host")
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = shim.Buffer(data.copy())
    buf.copy_to_device(host)
    buf.set_device_dirty()
    buf.copy_to_host()
    host.set_faults(fail_copy=1)
    buf.set_device_dirty()
    try:
        buf.copy_to_host()
    except shim.DeviceError:
        os._exit(0 if np.array_equal(buf.numpy(), data) else 3)
    os._exit(4)
forked.set()
holder.join()
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""" % {"guard": HANG_GUARD_S}


@unless(THREADS_BUSY_AT_FORK)
@pytest.mark.parametrize("which", ["transfers", "host counters", "exceptions",
                                   "device creation"])
def test_a_child_forked_while_another_thread_holds_a_shim_lock_uses_the_host_device(which):
    """The child renews the lock (before: it waited for good)."""
    done = run_isolated(SHIM_LOCK, which)
    assert done.returncode == 0, (done.returncode, done.stderr)


BUSY_BUFFERS = r"""
import os, signal, sys, threading
import numpy as np
import shim

buf = shim.Buffer(np.arange(16, dtype=np.int32).reshape(4, 4))
held, release = threading.Event(), threading.Event()


def holder():
    # Another thread in the middle of an operation on buf's family, and the only one that
    # holds `mine`, whose family it is using too: in the child, `mine` is freed as Python
    # deletes this thread's state, inside os.fork.
    mine = shim.Buffer(np.zeros((4, 4), np.int32))
    with buf.family.lock, mine.family.lock:
        held.set()
        release.wait()
    del mine


thread = threading.Thread(target=holder)
thread.start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(int(sys.argv[1]))  # (a hang guard)
    try:
        buf.copy_to_device(shim.device("host"))  # (takes the family's lock)
        code = 1  # it went through a family another thread was changing
    except shim.ShimError as e:
        code = 0 if "another thread of the parent" in str(e) else 2
    fresh = shim.Buffer(np.ones((4, 4), np.int32))
    fresh.copy_to_device(shim.device("host"))
    fresh.copy_to_host()
    os._exit(code if fresh.numpy().sum() == 16 else 3)
release.set()
thread.join()
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
buf.copy_to_host()  # (the parent's own use goes on)
"""


@unless(THREADS_BUSY_AT_FORK)
def test_a_child_forked_while_another_thread_uses_buffers_refuses_them_instead_of_hanging():
    """A child inherits the families another thread of the parent was in the middle of (its
    lock held, or a pipeline call on it): that thread never goes on there. The child hung
    right inside os.fork, as Python freed a Buffer only that thread's frame held and its
    finalizer waited for the lock; and an operation on such a Buffer waited for good. Now the
    finalizer lets go, the operation raises ShimError, and fresh Buffers work."""
    done = run_isolated(BUSY_BUFFERS, str(HANG_GUARD_S))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "child 0" in done.stdout, done.stdout + done.stderr
