"""The package's version, its one source: setup.cfg reads it from here (attr:), shim exports it
as shim.__version__ and native_stubs/build.py stamps it into shim._native.

A plain assignment in a file that imports nothing, so that setuptools and the build read it
without importing shim, whose import needs the built module."""

__version__ = "0.1.0"
