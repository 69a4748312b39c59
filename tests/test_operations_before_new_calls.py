"""An operation that waits for the pipeline calls on a Buffer's family (families.await_calls)
goes before new calls: a thread calling pipelines on a Buffer back to back no longer keeps
another thread's copy_to_device on it waiting for good (found by an adversarial pass: 208,536
calls in 30 s, and the copy never got in), and the Buffer ends up holding what was written."""

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
