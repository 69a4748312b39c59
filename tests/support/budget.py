"""How long the suite's long-running kinds of test run: the stateful machines' examples, the
concurrent rounds, the soak's minutes. Short by default, so that a newcomer's
``python -m pytest`` ends in minutes; long where ``HALIDE_SHIM_LONG_TESTS=1``, as .ci/run sets
it. Either way every test runs: the long runs only look harder."""

import os

LONG = os.environ.get("HALIDE_SHIM_LONG_TESTS", "").strip() not in ("", "0")


def scaled(short: int, long: int, variable: str | None = None) -> int:
    """``short``, or ``long`` in a long run; ``$variable``, where it is set, overrides both (a
    longer run by hand)."""
    configured = os.environ.get(variable, "").strip() if variable else ""
    return int(configured) if configured else (long if LONG else short)
