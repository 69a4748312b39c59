"""The sample pipelines: Halide generators (pipelines/generators/) and the tool that builds
them into shared libraries (pipelines/build.py, ``python -m pipelines.build``)."""
