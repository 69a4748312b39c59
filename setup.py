# Only the cffi build hook lives here; everything else is in setup.cfg.
from setuptools import setup

setup(cffi_modules=["native_stubs/build.py:ffibuilder"])
