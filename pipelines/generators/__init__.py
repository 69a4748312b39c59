"""Halide generators for the sample and test pipelines, one module per pipeline.

Each module defines one generator, registered under the module's name, and ends with
``hl.main()``, Halide's usual generator command line. build.py runs it as
``python -m generators.NAME -g NAME ...`` with the folder above this one on the path, so that
the generator's process does not import the shim package.
"""
