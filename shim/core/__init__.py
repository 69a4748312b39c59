"""The device layer's core: the bridge between C and Python (``bridge``), the device-interface
operations every backend shares (``runtime``), what a program asks of a Buffer
(``buffer_operations``), calls in flight (``call_uses``), the table of C callbacks, allocation reuse
and an orderly exit. Knows backends only through ``shim.backends.devices``. May import the layers
below: ``shim.base`` to ``shim.profiling``."""
