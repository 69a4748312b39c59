"""Running test bodies on threads, with a watchdog that turns a deadlock into a failure."""

import faulthandler
import sys
import threading

import pytest

WATCHDOG_SECONDS = 120


def run_threads(count, target):
    """Run ``target(index)`` on ``count`` threads; fail on any exception or a deadlock."""
    errors = []

    def body(index):
        try:
            target(index)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((index, e))

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WATCHDOG_SECONDS)
    if any(t.is_alive() for t in threads):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pytest.fail(f"deadlock: threads still running after {WATCHDOG_SECONDS}s (stacks on stderr)")
    if errors:
        index, error = errors[0]
        raise AssertionError(f"thread {index} failed: {error!r}") from error
