"""An operation that waits for the pipeline calls on a Buffer's family (families.await_calls)
goes before new calls: a thread calling pipelines on a Buffer back to back no longer keeps
another thread's copy_to_device on it waiting for good (found by an adversarial pass: 208,536
calls in 30 s, and the copy never got in), and the Buffer ends up holding what was written."""

import subprocess
import sys
import threading

import numpy as np

import shim
from support.threads import run_threads


def test_a_copy_waiting_for_calls_gets_in_between_back_to_back_calls(load):
    brighten = load("brighten")
    host = np.zeros((64, 64), np.float32)
    source = shim.Buffer(host)
    source.copy_to_device("host")
    out = np.empty_like(host)
    writes = 40
    done = threading.Event()
    calls = [0]

    def work(index):
        if index == 0:  # the caller, as fast as it can
            while not done.is_set():
                brighten(source, 2.0, 1.0, out)
                calls[0] += 1
        else:  # the writer: each write lands on the device before the next
            try:
                for value in range(1, writes + 1):
                    source.numpy()[...] = value
                    source.set_host_dirty()
                    source.copy_to_device()
            finally:
                done.set()

    run_threads(2, work)
    assert calls[0] > 0
    source.set_device_dirty()
    source.copy_to_host()  # what the device holds: the last write
    np.testing.assert_array_equal(source.numpy(), np.full_like(host, writes))
    brighten(source, 2.0, 1.0, out)
    np.testing.assert_array_equal(out, np.full_like(host, writes * 2.0 + 1.0))


FORKED_WHILE_AN_OPERATION_WAITS = """
import os, signal, sys, threading, time
import numpy as np
import shim
brighten = shim.load(sys.argv[1])
source = shim.Buffer(np.zeros((64, 64), np.float32))
source.copy_to_device("host")
out = np.empty((64, 64), np.float32)
family = source.family
stop = threading.Event()

def caller():  # keeps calls in flight, so that the writer waits for them
    while not stop.is_set():
        brighten(source, 2.0, 1.0, out)

def writer():
    while not stop.is_set():
        source.set_host_dirty()
        source.copy_to_device()

threads = [threading.Thread(target=caller, daemon=True), threading.Thread(target=writer, daemon=True)]
for t in threads:
    t.start()
while not family.lock.awaiting:  # the writer waits for the caller's calls: fork now
    time.sleep(0)
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # (a hang guard: SIGALRM ends a child that waits for good)
    fresh = shim.Buffer(np.ones((64, 64), np.float32))
    brighten(fresh, 2.0, 1.0, out)  # (another Buffer: unaffected)
    try:
        brighten(source, 2.0, 1.0, out)  # works, or says the Buffer is the parent's threads'
    except shim.ShimError as e:
        assert "forked" in str(e), e
    os._exit(0)
_, status = os.waitpid(pid, 0)
stop.set()
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_while_an_operation_waits_does_not_wait_for_it(host_pipelines, tmp_path):
    # The waiting writer is the parent's thread: in the child, nothing will ever end its wait.
    script = tmp_path / "forked.py"
    script.write_text(FORKED_WHILE_AN_OPERATION_WAITS)
    done = subprocess.run([sys.executable, str(script), host_pipelines["brighten", "no_runtime"]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "child 0", done.stdout + done.stderr[-2000:]
