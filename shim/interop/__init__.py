"""Taking another library's memory: DLPack producers (``from_dlpack``) and pyopencl Arrays
(both ways), made into Buffers. May import the layers below: ``shim.base`` to ``shim.buffers``."""
