"""``shim.Buffer``: halide.Buffer's Python API over a ``halide_buffer_t`` the device layer
manages. May import the layers below: ``shim.base`` to ``shim.exchange``."""
