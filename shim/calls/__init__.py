"""Loading pipelines and calling them: a library's metadata and scalars, turning each
argument into a ``halide_buffer_t`` (``arguments``, ``binding``), running calls (``running``),
``shim.load`` and ``Pipeline`` (``pipeline``), pickling a pipeline. May import the layers below:
``shim.base`` to ``shim.interop``."""
