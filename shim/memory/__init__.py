"""Who owns device memory: families (one allocation, one lock, the buffers sharing it) and
aliasing (crops and slices over one allocation, the regions newer on each side). May import the
layers below: ``shim.base``, ``shim.native``, ``shim.backends``."""
