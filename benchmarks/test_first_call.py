"""pytest-benchmark view of benchmarks/first_call.py: per setting (PoCL's kernel cache on or
off), case and side, each round is the first call of the pipeline in a fresh process (started
and prepared untimed, after one earlier process of the same side built it); the round's time
also holds one pipe round trip to the child. The child's own figure of each round is in
extra_info.

    python -m pytest benchmarks/test_first_call.py --benchmark-enable --benchmark-group-by=param:setting,param:case

For the table with ratios and the caches each side used, run the script itself.
"""

import pytest

import first_call


@pytest.fixture(scope="module")
def setups(opencl, tmp_path_factory):
    environment, _ = first_call.device_environment()
    setups = {}
    for setting in first_call.SETTINGS:
        setup = first_call.Setup(setting, tmp_path_factory.mktemp(setting.replace(" ", "-")), environment,
                                 "opencl")
        for case in first_call.CASES:
            first_call.build(first_call.Build(case, "opencl", "bundled"))
            first_call.build(first_call.Build(case, "opencl", "no_runtime"))
            for side in first_call.SIDES:
                setup.first_call(side, case)  # the earlier process that builds (and caches) it
        setups[setting] = setup
    return setups


@pytest.mark.parametrize("side", first_call.SIDES)
@pytest.mark.parametrize("case", list(first_call.CASES))
@pytest.mark.parametrize("setting", list(first_call.SETTINGS))
def test_first_call(benchmark, setups, setting, case, side):
    started, reports = [], []

    def fresh():
        started.append(setups[setting].start(side, case))
        return (started[-1],), {}

    def first(process):
        reports.append(process.call(wait=False))

    benchmark.pedantic(first, setup=fresh, rounds=3, iterations=1)
    for process in started:
        process.finish()
    assert len({r["outputs sha256"] for r in reports}) == 1
    benchmark.extra_info["child's first-call seconds"] = [r["seconds"] for r in reports]
    if side != "stock":
        benchmark.extra_info["program builds"] = [r["program builds"] for r in reports]
