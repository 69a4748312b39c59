"""The thread pool (native_stubs/calls/thread_pool.c), the shim's own with Halide's semantics:
- Halide's API, called as generated code and applications call it, under the shim and under
  Halide's own standalone runtime side by side (tests/support/pool_scenarios.c): loops cover
  their ranges, errors come back, serial tasks, semaphores, min_threads, nesting, the thread
  count, the hooks, shutdown;
- pipelines built here with Halide: the five schedules of Halide's async_deadlock test (chains
  of async producers folded to two rows, gated by semaphores both ways, some nested), run over
  and over on pools of 1 to 4 threads; extern stages failing inside parallel loops and async
  producers (where Halide 21's own pool hangs); many Python threads at once; a shutdown while
  calls run; exit with work in flight; Ctrl-C during parallel calls.
Everything that could hang runs in a child process or on threads under a watchdog."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shim
from support import pool_scenarios
from support.budget import scaled
from support.sanitizers import THREAD_COUNT, unless
from support.threads import run_threads

WATCHDOG_SECONDS = 300
# (PYTHONFAULTHANDLER: a child the watchdog ends with SIGABRT prints every thread's stack)
CHILD_ENV = {**{k: v for k, v in os.environ.items() if k not in ("HL_NUM_THREADS", "HL_NUMTHREADS")},
             "PYTHONFAULTHANDLER": "1"}


def _start(script: str, args, env: dict | None) -> subprocess.Popen:
    # (from the checkout's root, where the children import pipelines.stock)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=pool_scenarios.ROOT,
                            env={**CHILD_ENV, **(env or {})})


def run_child(script: str, *args: str, env: dict | None = None,
              watchdog: float = WATCHDOG_SECONDS) -> subprocess.CompletedProcess:
    """``script`` in a new Python process (its own process group); a hang fails the test."""
    process = _start(script, args, env)
    try:
        out, err = process.communicate(timeout=watchdog)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGABRT)  # (its threads' stacks, then the end)
        try:
            out, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        pytest.fail(f"hung for {watchdog} s; output so far:\n{out[-3000:]}\n{err[-6000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def hangs(script: str, *args: str, env: dict | None = None, watchdog: float = 10) -> bool:
    """Whether ``script``, in a new process, is still running when the watchdog ends it (its
    calls take milliseconds)."""
    process = _start(script, args, env)
    try:
        process.communicate(timeout=watchdog)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return True


# --- Halide's API, under the shim and under Halide's own runtime ------------------------------

# Scenarios that share one process (HL_NUM_THREADS=4); those that need a fresh pool run alone.
SHARED = ["par_for_covers", "threads_at_once", "par_for_errors", "sibling_errors", "serial",
          "semaphores_gate", "nested", "hooks", "semaphores"]


@pytest.fixture(scope="module")
def side_by_side():
    """{runtime: {scenario: values}} for the SHARED scenarios, under the shim and under Halide."""
    return {runtime: pool_scenarios.run(runtime, SHARED, HL_NUM_THREADS="4")
            for runtime in pool_scenarios.RUNTIMES}


def test_loops_cover_their_ranges_as_halides_do(side_by_side):
    shim_seen, stock = side_by_side["shim"], side_by_side["stock"]
    # (result, every index once) for ranges of 1000, 33 from -7, 1, 0 and -2 iterations
    assert shim_seen["par_for_covers"] == stock["par_for_covers"] == [0, 1] * 5
    # a loop of 4 tasks on a pool of 4 runs them at once, on 4 threads
    assert shim_seen["threads_at_once"] == stock["threads_at_once"] == [4, 0, 4]
    # loops inside loops' tasks: halide_do_par_for, halide_do_parallel_tasks (task_parent)
    assert shim_seen["nested"] == stock["nested"] == [0, 1, 0, 1]


def test_a_failing_task_returns_its_code_and_stops_its_siblings(side_by_side):
    shim_seen, stock = side_by_side["shim"], side_by_side["stock"]
    # one of the failing iterations' codes (which one is unspecified), nothing reported by the pool
    assert shim_seen["par_for_errors"] == stock["par_for_errors"] == [1, 0]
    # [the failing task's code, its sibling stopped early, the same where the sibling's work is a
    # job nested in it, that nested job stopped early]
    assert shim_seen["sibling_errors"] == [-7, 1, -9, 1]
    # Halide's pool returns the same codes, but does not reliably stop the other jobs: its
    # workers never look at a job's status, and its owner removes a failed job only once no
    # worker is on it (it let a nested job run to its end every time; its header promises no
    # more: the shim's pool stops them).
    assert stock["sibling_errors"][0::2] == [-7, -9]


def test_serial_tasks_and_semaphores_as_halides(side_by_side):
    shim_seen, stock = side_by_side["shim"], side_by_side["stock"]
    # [result, overlapping calls, calls out of order, iterations]
    assert shim_seen["serial"] == stock["serial"] == [0, 0, 0, 500]
    # [result, iterations that ran before their semaphores' releases, iterations], for acquires
    # of 1 and of 2 (built up by releases of 1)
    assert shim_seen["semaphores_gate"] == stock["semaphores_gate"] == [0, 0, 600, 0, 0, 300]
    # init, release and try_acquire's values
    assert shim_seen["semaphores"] == stock["semaphores"] == [2, 5, 0, 1, 1, 0, 0, 1]


def test_an_applications_hooks_are_called_as_halides_are(side_by_side):
    shim_seen, stock = side_by_side["shim"], side_by_side["stock"]
    assert shim_seen["hooks"] == stock["hooks"]
    assert shim_seen["hooks"] == [
        1, 1,        # the setters return the defaults first
        0, 0, 1,     # a loop and a parallel task run through the hooks, every index once
        20, 10,      # do_task once per loop iteration, do_loop_task once per task iteration
        1, 1,        # and return the hooks when the defaults are put back
        1, 0, 1, 1, 1,  # an application's own do_par_for runs the loop, and is returned
        4, 1,        # halide_set_custom_parallel_runtime's semaphore_init is called
        1, 1]        # until the defaults are put back


def test_jobs_that_may_block_complete_on_a_pool_of_one_thread():
    """Three tasks with min_threads 1 that each wait for the other two: the pool, asked for one
    thread, grows to three (and still says 1) rather than leave them waiting for good."""
    seen = {runtime: pool_scenarios.run(runtime, ["min_threads"], HL_NUM_THREADS="1")
            for runtime in pool_scenarios.RUNTIMES}
    assert seen["shim"] == seen["stock"] == {"min_threads": [0, 3, 1]}


@unless(THREAD_COUNT)
def test_shutdown_joins_the_workers_and_the_next_loop_starts_new_ones():
    seen = {runtime: pool_scenarios.run(runtime, ["shutdown"])
            for runtime in pool_scenarios.RUNTIMES}
    # [result, workers after a loop, after shutdown, the count kept, result, workers, after two
    # more shutdowns]
    assert seen["shim"] == seen["stock"] == {"shutdown": [0, 3, 0, 4, 0, 3, 0]}


@pytest.mark.parametrize("variable, value, expected", [
    (None, None, os.sysconf("SC_NPROCESSORS_ONLN")), ("HL_NUM_THREADS", "7", 7),
    ("HL_NUMTHREADS", "5", 5), ("HL_NUM_THREADS", "0", 1), ("HL_NUM_THREADS", "999", 256)])
def test_the_thread_count_as_halide_reads_sets_and_answers_it(variable, value, expected):
    environment = {variable: value} if variable else {}
    seen = {runtime: {**pool_scenarios.run(runtime, ["num_threads"], **environment),
                      **pool_scenarios.run(runtime, ["first_use"], **environment)}
            for runtime in pool_scenarios.RUNTIMES}
    assert seen["shim"] == seen["stock"]
    # get before any use, set(3) -> the previous, get, set(0) (the default), get, set(1000),
    # get (clamped), set(-1) (an error, reported), get (clamped), errors reported
    assert seen["shim"]["num_threads"] == [0, 0, 3, 3, expected, expected, 256, 256, 1, 1]
    # get before any use, a loop, get: the default, read at the first loop
    assert seen["shim"]["first_use"] == [0, 0, expected]


def test_shim_num_threads_reads_hl_num_threads_and_sets_the_pool():
    done = run_child("""
        import shim
        from shim.native import lib
        print(shim.num_threads(), shim.set_num_threads(2), shim.num_threads(),
              lib.halide_get_num_threads())
    """, env={"HL_NUM_THREADS": "3"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "3", "2", "2"]


# --- pipelines ------------------------------------------------------------------------------

# Halide's async_deadlock test (test/correctness/async_deadlock.cpp): A(x, y) = x + y,
# B(x, y) = A(x, y), and five chains of async producers folded to two rows, the wrappers (.in())
# copy_to_host, some computed at the outermost loop of their consumer. Also: an extern stage
# (rows.c) filling rows x + y, or failing with `code` at `bad_row`, computed per row of a
# parallel loop, of an async consumer, and of an async consumer nested in another; and nested
# parallel loops. argv: the folder.
BUILD = r'''
import os, subprocess, sys
import halide as hl

work = sys.argv[1]
x, y, xo, xi = hl.Var("x"), hl.Var("y"), hl.Var("xo"), hl.Var("xi")
include = os.path.join(hl.install_dir(), "include")


def link(func, arguments, name, runtime="bundled", extra=()):
    target = hl.Target("host" if runtime == "bundled" else "host-no_runtime")
    obj = os.path.join(work, f"{name}-{runtime}.o")
    func.compile_to({hl.OutputFileType.object: obj}, arguments, name, target)
    subprocess.run(["cc", "-shared", "-fPIC", "-I", include, "-o",
                    os.path.join(work, f"{name}-{runtime}.so"), obj, *extra, "-lpthread", "-ldl"],
                   check=True)


def async_chain(schedule):
    a, b = hl.Func("a"), hl.Func("b")
    a[x, y] = x + y
    b[x, y] = a[x, y]
    top = hl.Var.outermost()
    first, second = a.in_(), a.in_().in_() if schedule >= 4 else None
    inside = {1: b, 2: b, 3: first, 4: b, 5: first}[schedule]
    a.store_root().compute_at(inside, top if inside is first else y).fold_storage(y, 2).async_()
    if schedule >= 2:
        place = second if schedule == 5 else b
        first.store_root().compute_at(place, top if place is second else y).fold_storage(y, 2)
        first.copy_to_host().async_()
    if schedule >= 4:
        second.store_root().compute_at(b, y).fold_storage(y, 2).copy_to_host().async_()
    return b


for schedule in range(1, 6):
    for runtime in ("bundled", "no_runtime"):
        link(async_chain(schedule), [], f"async_deadlock{schedule}", runtime)

code, bad_row = hl.Param(hl.Int(32), "code"), hl.Param(hl.Int(32), "bad_row")
rows_c = [os.path.join(work, "rows.c")]
for kind in ("parallel", "async", "async_nested"):
    rows, out = hl.Func("rows"), hl.Func("out")
    rows.define_extern("pool_rows", [code, bad_row], hl.Int(32), [x, y])
    out[x, y] = rows[x, y] * 2
    if kind == "parallel":
        rows.compute_at(out, y)
        out.parallel(y)
    elif kind == "async":
        rows.compute_at(out, y).store_root().fold_storage(y, 2).async_()
    else:
        rows.compute_at(rows.in_(), hl.Var.outermost()).store_root().fold_storage(y, 2).async_()
        rows.in_().compute_at(out, y).store_root().fold_storage(y, 2).async_()
    link(out, [code, bad_row], f"rows_{kind}", extra=rows_c)

loops = hl.Func("loops")
loops[x, y] = 3 * x + y
loops.split(x, xo, xi, 16).parallel(y).parallel(xo)
link(loops, [], "nested_loops")
'''

ROWS_C = r"""
#include "HalideRuntime.h"

int pool_rows(int32_t code, int32_t bad_row, halide_buffer_t *out) {
    if (out->host == NULL) {
        return 0; /* a bounds query */
    }
    const halide_dimension_t *d = out->dim;
    for (int y = d[1].min; y < d[1].min + d[1].extent; y++) {
        if (y == bad_row) {
            return code;
        }
        for (int x = d[0].min; x < d[0].min + d[0].extent; x++) {
            ((int32_t *)out->host)[(x - d[0].min) * d[0].stride + (y - d[1].min) * d[1].stride] =
                x + y;
        }
    }
    return 0;
}
"""

SCHEDULES = [f"async_deadlock{n}-{runtime}" for n in range(1, 6)
             for runtime in ("bundled", "no_runtime")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: library} for the pipelines BUILD makes."""
    pytest.importorskip("halide", reason="compiling the test pipelines needs halide")
    work = tmp_path_factory.mktemp("thread_pool")
    (work / "rows.c").write_text(ROWS_C)
    subprocess.run([sys.executable, "-c", BUILD, str(work)], check=True)
    return {path.stem: str(path) for path in work.glob("*.so")}


def sums(height, width, scale=1):
    """(x + y) * scale in numpy's order."""
    return (np.add.outer(np.arange(height), np.arange(width)) * scale).astype(np.int32)


# argv: thread count, how it is set ("environment": HL_NUM_THREADS; "set": shim.set_num_threads
# before the first loop), rounds, libraries. Each round calls each library once; a round that
# does not end within the guard dumps the stacks and ends the process.
STRESS = """
    import faulthandler, sys
    import numpy as np
    import shim

    threads, how, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    if how == "set":
        shim.set_num_threads(threads)
    assert shim.num_threads() == threads
    pipelines = [shim.load(path) for path in sys.argv[4:]]
    expected = np.add.outer(np.arange(256), np.arange(256)).astype(np.int32)
    out = np.empty((256, 256), np.int32)
    for r in range(rounds):
        faulthandler.dump_traceback_later(60, exit=True)
        for p in pipelines:
            out.fill(-1)
            p(out)
            if not np.array_equal(out, expected):
                sys.exit(f"round {r}: {p.name} wrong at {np.argwhere(out != expected)[:5]}")
    print("rounds", rounds)
"""


@pytest.mark.parametrize("threads, how, runtime", [
    (1, "environment", "bundled"), (2, "set", "no_runtime"), (3, "environment", "no_runtime"),
    (4, "set", "bundled")])
def test_async_deadlock_schedules_finish_right_round_after_round(built, threads, how, runtime):
    """Each round runs the five schedules, 256 x 256; every output is checked. Halide's pool
    before 22 could park for good on these (a semaphore release that woke nobody); a long run
    (HALIDE_SHIM_LONG_TESTS=1) makes 300 rounds a case: 6,000 calls of the four cases together.
    (A round costs about 0.17 s: the copy stages' copies still enter Python, issue 41.)"""
    rounds = scaled(12, 300, "HALIDE_SHIM_POOL_ROUNDS")
    done = run_child(STRESS, str(threads), how, str(rounds),
                     *(built[f"async_deadlock{n}-{runtime}"] for n in range(1, 6)),
                     env={"HL_NUM_THREADS": str(threads)} if how == "environment" else None,
                     watchdog=WATCHDOG_SECONDS + rounds * 2)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert done.stdout.split() == ["rounds", str(rounds)]


# argv: library, name. Calls failing at each row in turn, under Halide's own runtime.
STOCK_FAILING_CALLS = """
    import sys
    import numpy as np
    from pipelines.stock import StockPipeline

    p = StockPipeline(sys.argv[1], sys.argv[2])
    for bad in range(64):
        p.bind({"code": -5, "bad_row": bad, p.arguments[-1][0]: np.zeros((64, 32), np.int32)})
        try:
            p.run()
        except RuntimeError as e:
            assert "returned non-zero value: -5" in str(e), e
"""

# argv: rounds, libraries. Calls each library with a failing row everywhere in turn, and with
# none; prints the codes seen.
FAILING_CALLS = """
    import sys
    import numpy as np
    import shim

    rounds = int(sys.argv[1])
    codes = set()
    for path in sys.argv[2:]:
        p = shim.load(path)
        for r in range(rounds):
            bad = r % 70  # (64 rows: some calls have none failing)
            try:
                out = p(-5 - bad % 3, bad, (64, 32))
            except shim.PipelineError as e:
                assert bad < 64, e
                assert e.code == -5 - bad % 3 and "pool_rows returned non-zero value" in str(e), e
                codes.add(e.code)
            else:
                assert bad >= 64 and np.array_equal(out.numpy(), np.add.outer(np.arange(64), np.arange(32)) * 2)
    print(sorted(codes))
"""


def test_a_failing_async_producer_ends_the_call_where_halides_pool_hangs(built):
    """An async producer (an extern stage) that fails: Halide 21's pool marks its consumer
    failed but wakes neither the call's owner nor the thread stalled as owner of the job nested
    in the consumer, and every thread sleeps for good (seen at the first call failing at row 1,
    every time). The shim's
    pool ends the call, which raises the stage's code, every time, on pools of 1 to 4 threads."""
    assert hangs(STOCK_FAILING_CALLS, built["rows_async-bundled"], "rows_async",
                 env={"HL_NUM_THREADS": "3"}), \
        "Halide's own pool no longer hangs here: this test's claim needs updating"
    rounds = scaled(70, 700)
    for threads in (1, 2, 3, 4):
        done = run_child(FAILING_CALLS, str(rounds),
                         *(built[f"rows_{kind}-bundled"] for kind in ("async", "async_nested")),
                         env={"HL_NUM_THREADS": str(threads)})
        assert done.returncode == 0, done.stderr[-5000:]
        assert done.stdout.split("\n")[-2] == "[-7, -6, -5]"


@pytest.mark.parametrize("schedule, stages", [(2, 1), (4, 2)])
def test_copy_stages_copy_their_rows_in_c(built, schedule, stages):
    """A copy_to_host() stage's halide_buffer_copy, one a row between the pipeline's own host
    buffers, is copied by the native library (native_stubs/devices/host_copy.c): a profile
    counts each as served in C and records no call of the Python core."""
    for runtime in ("bundled", "no_runtime"):
        p = shim.load(built[f"async_deadlock{schedule}-{runtime}"])
        out = np.full((256, 256), -1, np.int32)
        with shim.profile() as prof:
            p(out)
        np.testing.assert_array_equal(out, sums(256, 256))
        assert prof.calls("buffer_copy") == []
        assert prof.decided_in_c["buffer_copy"]["served"] >= 256 * stages


def test_an_extern_stage_failing_inside_a_parallel_loop_raises_its_code(built):
    p = shim.load(built["rows_parallel-bundled"])

    def calls(_):
        for bad in (0, 17, 63):
            with pytest.raises(shim.PipelineError, match="pool_rows returned non-zero value: -7") \
                    as e:
                p(-7, bad, (64, 32))
            assert e.value.code == -7
        np.testing.assert_array_equal(p(-7, -1, (64, 32)).numpy(), sums(64, 32, 2))

    run_threads(1, calls)


def test_nested_parallel_loops_cover_their_output(built):
    p = shim.load(built["nested_loops-bundled"])

    def calls(_):
        for height, width in [(1, 16), (3, 17), (64, 256), (200, 33)]:
            expected = 3 * np.arange(width)[None, :] + np.arange(height)[:, None]
            np.testing.assert_array_equal(p((height, width)).numpy(), expected)

    run_threads(1, calls)


def test_many_python_threads_call_parallel_and_async_pipelines_at_once(built):
    """Eight threads, each calling (in its own order) the async schedules, a parallel loop with
    an extern stage failing in some calls, the async failing producers and nested loops."""
    schedules = [shim.load(built[name]) for name in SCHEDULES]
    rows = {kind: shim.load(built[f"rows_{kind}-bundled"])
            for kind in ("parallel", "async", "async_nested")}
    loops = shim.load(built["nested_loops-bundled"])
    calls = scaled(8, 100)  # (long: 800 rounds in all; the copy stages enter Python, issue 41)

    def caller(index):
        rng = np.random.default_rng(index)
        for _ in range(calls):
            for p in rng.permutation(schedules):
                np.testing.assert_array_equal(p((96, 80)).numpy(), sums(96, 80))
            kind = rng.choice(list(rows))
            bad = int(rng.integers(0, 80))
            if bad < 48:
                with pytest.raises(shim.PipelineError) as e:
                    rows[kind](-3, bad, (48, 40))
                assert e.value.code == -3
            else:
                np.testing.assert_array_equal(rows[kind](-3, bad, (48, 40)).numpy(),
                                              sums(48, 40, 2))
            np.testing.assert_array_equal(loops((40, 70)).numpy(),
                                          3 * np.arange(70)[None, :] + np.arange(40)[:, None])

    run_threads(8, caller)


# argv: libraries. Three threads call them while the main thread shuts the pool down over and
# over, 100 times and until 300 calls were made; prints the wrong outputs, and the process's
# threads before any call and after a last shutdown, once the callers are done.
SHUTDOWN_WHILE_CALLING = """
    import ctypes, sys, threading, time
    import numpy as np
    import shim
    from shim import _native

    def threads():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))

    pool = ctypes.CDLL(_native.__file__)
    pipelines = [shim.load(path) for path in sys.argv[1:]]
    expected = np.add.outer(np.arange(128), np.arange(128)).astype(np.int32)
    before = threads()
    stop, wrong, calls = threading.Event(), [], [0]

    def caller():
        out = np.empty((128, 128), np.int32)
        while not stop.is_set():
            for p in pipelines:
                out.fill(-1)
                p(out)
                calls[0] += 1
                if not np.array_equal(out, expected):
                    wrong.append(p.name)

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    shutdowns = 0
    while shutdowns < 100 or calls[0] < 300:  # (the calls go on meanwhile: the watchdog else)
        pool.halide_shutdown_thread_pool()
        shutdowns += 1
        time.sleep(0.001)
    stop.set()
    for t in callers:
        t.join()
    pool.halide_shutdown_thread_pool()
    print(len(wrong), before, threads())
"""


def test_shutting_the_pool_down_while_other_threads_call_pipelines(built):
    """Each shutdown retires the workers while calls are in flight: the calls go on (on
    workers started again for them) with the right results, and a last shutdown leaves none."""
    done = run_child(SHUTDOWN_WHILE_CALLING, built["async_deadlock1-bundled"],
                     built["async_deadlock1-no_runtime"], built["async_deadlock3-no_runtime"],
                     env={"HL_NUM_THREADS": "3"})
    assert done.returncode == 0, done.stderr[-5000:]
    wrong, before, after = done.stdout.split()
    assert wrong == "0"
    assert after == before


# argv: the scenarios library, pipelines. Daemon threads call the pipelines in a loop, and one
# runs a job two of whose iterations block workers for good; then the interpreter exits.
EXIT_IN_FLIGHT = """
    import ctypes, sys, threading, time
    import numpy as np
    import shim

    scenarios = ctypes.CDLL(sys.argv[1])
    pipelines = [shim.load(path) for path in sys.argv[2:]]

    def forever(p):
        out = np.empty((256, 256), np.int32)
        while True:
            p(out)

    for p in pipelines:
        threading.Thread(target=forever, args=(p,), daemon=True).start()
    threading.Thread(target=scenarios.pool_block_forever, args=(3,), daemon=True).start()
    while scenarios.pool_blocked_workers() < 2:  # (two workers in a task that never ends)
        time.sleep(0.01)
    time.sleep(0.2)
    print("exiting", flush=True)
"""


def test_exit_with_work_in_flight_and_workers_that_never_finish_their_task(built):
    """At exit the pool joins its idle workers and leaves those inside a task that never ends
    (Halide's own joins them all, and waits for good); calls in flight do not hang the exit."""
    library = pool_scenarios.library("shim")
    for _ in range(3):  # exit races with the work in flight: more than once
        done = run_child(EXIT_IN_FLIGHT, str(library),
                         *(built[f"async_deadlock{n}-no_runtime"] for n in (1, 3, 5)),
                         env={"HL_NUM_THREADS": "4"})
        assert done.returncode == 0, done.stderr[-5000:]
        assert done.stdout.strip() == "exiting"
        for sign in ("terminate called", "Fatal Python error", "Segmentation", "Aborted"):
            assert sign not in done.stderr, done.stderr[-5000:]


# argv: an async pipeline (x + y) and nested parallel loops (3x + y). SIGINT every few
# milliseconds at the main thread, which calls them: each call is done (the output whole) or not
# done at all (untouched), never half; prints the counts.
CTRL_C = """
    import signal, sys, threading, time
    import numpy as np
    import shim

    x, y = np.arange(512)[None, :], np.arange(512)[:, None]
    pipelines = [(shim.load(sys.argv[1]), (x + y).astype(np.int32)),
                 (shim.load(sys.argv[2]), (3 * x + y).astype(np.int32))]
    main, stop = threading.main_thread().ident, threading.Event()
    counts = {"interrupted": 0, "completed": 0, "half done": 0}
    SIGINT = {signal.SIGINT}

    def interrupted(signum, frame):
        # Python's own handler's exception; and until the next try unblocks it, no other SIGINT
        # (pending, it waits): one landing between an except and the next try would escape it.
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGINT)
        raise KeyboardInterrupt

    def unblocked():
        # A SIGINT sent while blocked is dropped, not delivered at once: the next call would
        # always be interrupted as it starts where calls are slow (under a sanitizer).
        signal.sigtimedwait(SIGINT, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGINT)

    signal.signal(signal.SIGINT, interrupted)
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGINT)  # (until the loop below is in its try)

    def sender():
        while not stop.is_set():
            time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGINT)

    def steps(deadline):
        while time.monotonic() < deadline:
            for p, expected in pipelines:
                out = np.full((512, 512), -1, np.int32)
                try:
                    unblocked()
                    p(out)
                except KeyboardInterrupt:
                    counts["interrupted"] += 1
                    whole = np.array_equal(out, expected) or (out == -1).all()
                else:
                    counts["completed"] += 1
                    whole = np.array_equal(out, expected)
                counts["half done"] += not whole

    thread = threading.Thread(target=sender)
    thread.start()
    deadline = time.monotonic() + 3
    while not stop.is_set():
        try:  # (a signal may also land in the test's own code)
            unblocked()
            steps(deadline)
            stop.set()
            thread.join()
            time.sleep(0.05)  # the last signal
        except KeyboardInterrupt:
            pass
    for p, expected in pipelines:  # and the pool is as good as new
        out = np.full((512, 512), -1, np.int32)
        p(out)
        counts["half done"] += not np.array_equal(out, expected)
    print(counts["interrupted"] > 0, counts["completed"] > 0, counts["half done"])
"""


def test_ctrl_c_during_parallel_calls_leaves_each_call_done_or_not_done(built):
    done = run_child(CTRL_C, built["async_deadlock1-bundled"], built["nested_loops-bundled"],
                     env={"HL_NUM_THREADS": "3"})
    assert done.returncode == 0, done.stderr[-5000:]
    assert done.stdout.split() == ["True", "True", "0"]
