"""The native library runs on glibc 2.28 and later however new the glibc it is built on
(native_stubs/build.py's GLIBC_PINS): the library this process loaded, built as every build
of it is, takes nothing from glibc at a newer version, and names the libraries that held the
pinned functions before 2.34. tests/test_wheel.py checks the wheel's copy and its tag."""

import pytest

import shim
from support import build_script, glibc

BUILD = build_script.load()
pytestmark = pytest.mark.skipif(
    not BUILD.GLIBC_X86_64,
    reason="the library binds glibc's versions where it is built for x86-64 glibc only")


def test_the_library_needs_nothing_newer_than_glibc_2_28():
    assert glibc.too_new(shim._native.__file__) == {}, \
        "pin these in native_stubs/build.py's GLIBC_PINS, at the version glibc 2.28 had"
    # (and the reading finds what it should: a pinned function at its pinned version)
    assert glibc.needs(shim._native.__file__)["dlopen"] == "GLIBC_2.2.5"


def test_the_library_names_the_libraries_that_held_the_pinned_functions_before_2_34():
    needed = glibc.needed_libraries(shim._native.__file__)
    assert {"libdl.so.2", "libpthread.so.0", "libc.so.6"} <= set(needed)


def test_each_pinned_version_is_the_same_function_as_the_default_here():
    """Pinning changes nothing where the library is built: in the glibc this process runs on,
    every version of a pinned function that a library defines, the pinned one among them, is
    one function (one address)."""
    defined = {symbol: set() for symbol in BUILD.GLIBC_PINS}
    for library in glibc.loaded_libraries():
        for symbol, versions in glibc.exports(library, BUILD.GLIBC_PINS).items():
            assert len(set(versions.values())) <= 1, (library, symbol, versions)
            defined[symbol] |= versions.keys()
    assert {symbol: pinned for symbol, pinned in BUILD.GLIBC_PINS.items()
            if pinned not in defined[symbol]} == {}
