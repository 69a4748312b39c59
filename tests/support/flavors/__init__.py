"""Pipelines of every build flavor of Halide's AOT tests (test/generator), built at test time
the way a user builds them, and a child process that runs them under Halide's stock runtime:
generators.py (the generators), externs.c (the extern stages' C), stock_counters.c (device
allocation counters for a stock-runtime library), build.py (the builds), stock_child.py (the
stock side)."""
