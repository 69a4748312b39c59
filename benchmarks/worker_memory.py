"""A process's peak memory, as dask workers are measured here (benchmarks/dask_scaling.py,
tests/test_dask_stored.py): the kernel's high-water mark of its resident set, ``VmHWM`` in
``/proc/self/status``, which ``reset`` brings down to the present resident set (Linux 4.0
on).

Why not ``resource.getrusage(RUSAGE_SELF).ru_maxrss``: a worker process that a nanny spawns
starts as a fork of it, and Linux carries the parent's high-water mark across the exec into
``ru_maxrss``, so a worker spawned by a test process holding a 600 MiB image reports 600 MiB
before it has done anything. ``VmHWM`` is the new program's own.
"""

from __future__ import annotations


def peak_mib() -> float:
    """This process's peak resident set since it started, or since the last ``reset``, MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # (kB)
    raise OSError("/proc/self/status has no VmHWM: not Linux")


def reset() -> None:
    """Bring this process's peak down to its present resident set."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def worker_peaks(client) -> dict:
    """{worker address: peak MiB} of every worker of a distributed ``client``."""
    return client.run(peak_mib)


def reset_workers(client) -> None:
    client.run(reset)
