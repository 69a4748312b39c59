"""The sample pipelines: Halide generators (generators/) and the tool that builds them into
shared libraries (build.py, ``python -m shim.pipelines.build``). Installed as shim.pipelines;
in the source tree this folder sits beside shim/, linked from shim/pipelines."""
