"""Device backends: what moves bytes for each kind of device (``base.Backend`` is the
contract), and ``devices``, the registry of their classes that everything above knows them by.
May import ``shim.base`` and ``shim.native``; never the layers above (``tests/test_architecture.py``)."""
