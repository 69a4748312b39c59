"""Smoke test of benchmarks/entry_points.py: its quick form, run once, has a row for every
entry point on every backend here, each with both runtimes' figures. Nothing here asserts
about time (the script's table is the place for the figures).

    python -m pytest benchmarks/test_entry_points.py

For the table, run the script itself.
"""

import pytest

import entry_points

ROWS = [row for kind in entry_points.BACKENDS for row in entry_points.device_rows(kind)] + \
    entry_points.other_rows()

@pytest.fixture(scope="module")
def table():
    lines = []
    table = entry_points.run(entry_points.BACKENDS, samples=3, target=2e-3, progress=lines.append)
    table["lines"] = lines
    return table


def test_every_entry_point_on_every_backend():
    for kind in entry_points.BACKENDS:
        covered = set().union(*(entry_points.entry_points_of(r) for r in entry_points.device_rows(kind)))
        assert covered == set(entry_points.DEVICE_ENTRY_POINTS), kind
    covered = set().union(*(entry_points.entry_points_of(r) for r in entry_points.other_rows()))
    assert covered == set(entry_points.OTHER_ENTRY_POINTS)


def test_the_table_has_every_row(table):
    assert [f"{r['backend']} | {r['entry']} | {r['case']}" for r in table["rows"]] == \
        [row.key for row in ordered(table)]
    assert len(table["lines"]) == len(table["rows"]) + 1 + len(table["skipped"])
    assert set(table["backends"]) | set(table["skipped"]) == set(entry_points.BACKENDS)
    assert {"host", "opencl"} <= set(table["backends"]), table["skipped"]


def ordered(table):
    """The rows in the order the script runs them (device_release last)."""
    rows = [r for r in ROWS if r.backend in table["backends"]]
    return ([r for r in rows if r.op != "device_release"] + entry_points.other_rows()
            + [r for r in rows if r.op == "device_release"])


@pytest.mark.parametrize("key", [row.key for row in ROWS])
def test_both_runtimes_measured(table, key):
    backend = key.split(" | ")[0]
    if backend in table["skipped"]:
        pytest.skip(f"no {backend} device here: {table['skipped'][backend]}")
    row = next(r for r in table["rows"] if f"{r['backend']} | {r['entry']} | {r['case']}" == key)
    for side in ("stock", "shim"):
        assert row[side].get("median_ns", 0) > 0 and row[side]["min_ns"] > 0, row
    assert row["ratio"] > 0
    # Which Python operations the row entered is known for every row (empty: all in C).
    assert all(not name.startswith("failed") for name in row["python"]), row["python"]
