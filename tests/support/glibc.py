"""What an ELF file takes from glibc, read as the dynamic linker and auditwheel read it: each
undefined symbol's version (.gnu.version) named in the file's version needs (.gnu.version_r);
and what a glibc library exports under each version (.gnu.version_d). pyelftools parses the
files (auditwheel's own parser, declared in the test extra)."""

import re
from pathlib import Path

from elftools.elf.elffile import ELFFile

# The oldest glibc the native library runs on: manylinux_2_28's (native_stubs/build.py's
# GLIBC_PINS keep it there).
FLOOR = (2, 28)
WHEEL_PLATFORM = f"manylinux_{FLOOR[0]}_{FLOOR[1]}_x86_64"


def version(name: str) -> tuple[int, ...]:
    """GLIBC_2.2.5 -> (2, 2, 5)."""
    match = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", name)
    assert match, f"not a glibc version: {name}"
    return tuple(map(int, match[1].split(".")))


def _version_index(elf, symbols_index: int) -> int | None:
    ndx = elf.get_section_by_name(".gnu.version").get_symbol(symbols_index)["ndx"]
    # (0 and 1, local and global, come as names: no version; 0x8000 is the hidden bit)
    return ndx & 0x7FFF if isinstance(ndx, int) else None


def needs(path) -> dict[str, str]:
    """{symbol: version} of every symbol the file at ``path`` takes from glibc at a GLIBC_
    version."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        needed = elf.get_section_by_name(".gnu.version_r")
        if needed is None:
            return {}
        names = {aux["vna_other"]: aux.name
                 for _, auxes in needed.iter_versions() for aux in auxes}
        found = {}
        for i, symbol in enumerate(elf.get_section_by_name(".dynsym").iter_symbols()):
            if symbol["st_shndx"] != "SHN_UNDEF":
                continue
            name = names.get(_version_index(elf, i))
            if name is not None and name.startswith("GLIBC_"):
                found[symbol.name] = name
        return found


def too_new(path) -> dict[str, str]:
    """Of ``needs(path)``, the symbols at a version newer than FLOOR."""
    return {symbol: name for symbol, name in needs(path).items() if version(name) > FLOOR}


def needed_libraries(path) -> list[str]:
    """The file's DT_NEEDED entries, in order."""
    with open(path, "rb") as f:
        return [tag.needed for tag in ELFFile(f).get_section_by_name(".dynamic").iter_tags()
                if tag.entry.d_tag == "DT_NEEDED"]


def exports(path, symbols) -> dict[str, dict[str, int]]:
    """{symbol: {version: address}} of ``symbols`` as the glibc library at ``path`` defines
    them, under each version it has (the default and the older ones alike)."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        names = {verdef["vd_ndx"]: next(auxes).name
                 for verdef, auxes in elf.get_section_by_name(".gnu.version_d").iter_versions()}
        found = {symbol: {} for symbol in symbols}
        for i, symbol in enumerate(elf.get_section_by_name(".dynsym").iter_symbols()):
            if symbol.name in found and symbol["st_shndx"] != "SHN_UNDEF":
                found[symbol.name][names[_version_index(elf, i)]] = symbol["st_value"]
        return found


def loaded_libraries() -> list[Path]:
    """The libraries of glibc that held the pinned functions (libc.so.6, and libdl.so.2 and
    libpthread.so.0, which the native library loads), as this process maps them."""
    found = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = Path(line.split(maxsplit=5)[-1])
        if path.name in ("libc.so.6", "libdl.so.2", "libpthread.so.0"):
            found[path.name] = path
    assert "libc.so.6" in found, "no libc.so.6 in /proc/self/maps"
    return list(found.values())
