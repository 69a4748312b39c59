"""What ``shim.profile()`` records (``profiler``), its report and Perfetto timeline
(``report``), and what Halide itself measures: its profiler's per-Func figures
(``halide_profiler``) and its trace of realizations (``halide_trace``). May import the layers
below: ``shim.base`` to ``shim.memory``."""
