"""Handing a Buffer's memory to another library: DLPack capsules and exports, the CUDA
Array Interface, and the pins that keep exported device memory alive (``device_export``). Sits
under ``shim.buffers``, whose Buffer methods (``__dlpack__``...) call down into it. May import the
layers below: ``shim.base`` to ``shim.core``."""
