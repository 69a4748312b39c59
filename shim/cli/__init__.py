"""``python -m shim``: run/info/profile/demo with RunGen's flags (``main``), the argument
values, sizing through the bounds query, image files, RunGen's adaptive benchmark, chunked runs
on dask, ``--track_memory``. The top layer: may import everything, the public API included."""
