"""The sanitizer runtime this process runs under, if any (.ci/sanitizers preloads one into the
test interpreter: docs/development.md, "Sanitizers"), and what tests cannot do under it, each
as the reason a test gives when it skips (None: it can). Facts of gcc 12's runtimes, the ones
Debian's gcc brings, not of the shim."""

from pathlib import Path

import pytest


def _runtime() -> str | None:
    maps = Path("/proc/self/maps").read_text()
    for name, library in (("address", "/libasan.so"), ("thread", "/libtsan.so")):
        if library in maps:
            return name
    return None


RUNTIME = _runtime()

# A child forked while other threads of its parent allocate memory: AddressSanitizer does not
# hold its allocator's locks across fork(), so the child may wait forever for one that a thread
# of the parent held (seen: fork storms' children hung in SizeClassAllocator64's lock).
THREADS_BUSY_AT_FORK = ("gcc 12's AddressSanitizer is not fork-safe: a child forked while other "
                        "threads allocate may hang in its allocator") if RUNTIME == "address" else None

# A child forked from a process with threads that starts or joins threads: ThreadSanitizer keeps
# the parent's threads in the child's registry, so a thread the child starts may get the id of
# one of them ("dup thread with used id", a report), and joining one (lavapipe's exit handler
# does) waits forever.
THREADS_AFTER_FORK = ("gcc 12's ThreadSanitizer keeps a forked parent's threads: a child that "
                      "starts or joins threads fails in it") if RUNTIME == "thread" else None

# A count of the process's threads: ThreadSanitizer starts a background thread of its own at the
# process's first pthread_create, counted with the rest.
THREAD_COUNT = ("ThreadSanitizer's background thread is counted among the process's"
                if RUNTIME == "thread" else None)


def unless(*reasons: str | None):
    """A mark that skips the test, giving the first of ``reasons`` that is not None."""
    given = [reason for reason in reasons if reason is not None]
    return pytest.mark.skipif(bool(given), reason=given[0] if given else "")
