"""atheris target: a file's bytes, as shim.load reads them before anything is loaded.

The input is the whole file, put in a memory file and read through its path, as a library's
is: shim/base/elf.py's readers (architecture, file type, dynamic symbols, pipeline names), then
everything shim/calls/library.py decides from them before it opens the library (a static
library or object file, the pipeline's name, a runtime with prefixes, the runtime functions it
defines itself). Checked: elf.py refuses with NotELF only, and gives str names; the library's
checks refuse with ArgumentError only. The library is never opened: what passes every check
would go to the dynamic loader, whose reading of ELF is not the shim's.
"""

import os

from common import check_error, fuzz, quiet

from shim.base import elf
from shim.calls import library

_file = os.memfd_create("halide-shim-fuzz-elf", os.MFD_CLOEXEC)
PATH = f"/proc/self/fd/{_file}"


def test_one_input(data: bytes) -> None:
    os.ftruncate(_file, 0)
    os.pwrite(_file, data, 0)
    for reader in (elf.architecture, elf.file_type, elf.dynamic_symbols, elf.pipeline_names):
        try:
            result = reader(PATH)
        except elf.NotELF:
            continue
        except Exception as e:  # noqa: BLE001 - the property
            check_error(e, f"elf.{reader.__name__}")
        if reader is elf.dynamic_symbols:
            defined, needed = result
            assert all(isinstance(n, str) and isinstance(s, bool) for n, s in defined.items())
            assert all(isinstance(n, str) for n in needed)
    for name in (None, "fz"):
        try:
            with quiet():
                library._choose_name(PATH, name)
        except Exception as e:  # noqa: BLE001 - the property
            check_error(e, f"the checks of shim.load(name={name!r})")


if __name__ == "__main__":
    fuzz(test_one_input)
