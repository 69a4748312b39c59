"""The bottom layer: exceptions and Halide's error codes, element types, critical sections,
the rule for private cache folders, the OpenCL program-binary cache, reading ELF files. May import
only the standard library, numpy and the compiled module ``shim._native`` (for error codes)."""
