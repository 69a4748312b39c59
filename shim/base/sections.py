"""The device layer's critical sections, and the work a finalizer leaves until its thread is
out of them.

A dropped Buffer's finalizer gives its device memory back, and that takes the layer's locks
(its family's, a profile's, the allocation pool's, ...). But the finalizer runs wherever its
thread stands when the last reference goes: inside any allocation, when the garbage
collector finds the Buffer in a cycle, or where a weak reference made strong for a moment
turns out to be the last one because another thread dropped its own. That can be inside one
of those very locks on the same thread, which would wait for itself forever (a soak run hung
so: a profile's lock, held while recording a call, taken again by the release of a Buffer
collected inside it).

So the layer's locks count, per thread, the sections their holders are in (``Lock`` here,
and ``families.FamilyLock`` through ``enter``/``leave``), and a finalizer that finds its
thread inside one hands its work to ``later``: the thread does it as it leaves its outermost
section, with none of those locks held.
"""

from __future__ import annotations

import threading


class _Thread(threading.local):
    def __init__(self):
        self.depth = 0  # sections the thread is inside
        self.later: list = []  # work waiting for the thread to leave them
        self.draining = False  # the thread is doing that work (one piece of it at a time)


_thread = _Thread()


def inside() -> bool:
    """Whether the calling thread is inside one of the layer's critical sections."""
    return _thread.depth > 0


def later(work) -> None:
    """Run ``work()`` once the calling thread, which is ``inside()`` one, is out of every
    critical section."""
    _thread.later.append(work)


def enter() -> None:
    """The calling thread begins a critical section (before it takes the section's lock: a
    finalizer run while it waits counts as inside, which only delays its work)."""
    _thread.depth += 1


def leave() -> None:
    """The calling thread has left a critical section (its lock given back); leaving the
    outermost does the work finalizers left."""
    state = _thread
    state.depth -= 1
    if not state.depth and not state.draining:
        # The work takes the layer's locks, so it leaves sections too: the loop here does the
        # next piece, not that piece's leave() (which would nest one call per piece queued,
        # until Python's recursion limit failed the rest).
        state.draining = True
        try:
            while state.later and not state.depth:
                state.later.pop(0)()  # (what one queues as it runs is done as it leaves)
        finally:
            state.draining = False


class Lock:
    """A mutex whose critical sections count (see the module): ``with lock:``."""

    __slots__ = ("_lock",)

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self) -> Lock:
        enter()
        try:
            self._lock.acquire()  # (a signal handler may raise from inside the wait)
        except BaseException:
            leave()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()
        leave()
