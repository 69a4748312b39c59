"""pytest-benchmark view of benchmarks/allocation_reuse.py: per runtime, case and reuse
setting, each round is ITERATIONS[case] pipeline calls on fresh arrays, or device
malloc + free pairs.

    python -m pytest benchmarks/test_allocation_reuse.py --benchmark-enable --benchmark-group-by=param:case

For the table with ratios, run the script itself.
"""

import sys

import pytest

import allocation_reuse
from sidebyside import ChildProcess


@pytest.fixture(scope="module")
def runners(opencl):
    ours = allocation_reuse.ShimRunner("opencl")
    own = allocation_reuse.ShimRunner("opencl", bare=True)
    methods = allocation_reuse.ShimRunner("opencl", buffer_methods=True)
    child = ChildProcess([sys.executable, allocation_reuse.__file__, "--serve", "--device", "opencl"],
                         env=allocation_reuse.stock_environment("opencl", ours.device))
    yield {"stock": child, "shim": ours, "shim-own-buffer": own, "shim-buffer-methods": methods}
    child.close()
    ours.close()
    own.close()
    methods.close()


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse-on", "reuse-off"])
@pytest.mark.parametrize("case", list(allocation_reuse.ITERATIONS))
@pytest.mark.parametrize("runtime", ["stock", "shim-own-buffer", "shim", "shim-buffer-methods"])
def test_allocation_reuse(benchmark, runners, runtime, case, reuse):
    request = {"case": case, "iterations": allocation_reuse.ITERATIONS[case], "reuse": reuse}
    seconds = benchmark.pedantic(runners[runtime].seconds, kwargs=request, rounds=5, iterations=1,
                                 warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["operations per round"] = request["iterations"]
