"""Halide generators for the sample and test pipelines, one module per pipeline.

Each module defines one generator, registered under the module's name, and ends with
``hl.main()`` so that ``python -m pipelines.generators.NAME -g NAME ...`` is Halide's usual
generator command line; pipelines/build.py drives it.
"""
