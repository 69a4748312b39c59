"""The names a shared library exports, read from its ELF dynamic symbol table.

A Halide AOT pipeline exports NAME_argv and NAME_metadata but nothing says what NAME is, so
shim.load reads the table: enough of ELF64/ELF32 to list defined global function symbols.
"""

from __future__ import annotations

import struct

SHT_DYNSYM = 11
STB_GLOBAL, STB_WEAK = 1, 2
STT_FUNC = 2
SHN_UNDEF = 0


class NotELF(ValueError):
    """The file is not an ELF shared object this reader understands."""


def exported_functions(path) -> set[str]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise NotELF("not an ELF file")
    elf_class, endian = data[4], data[5]
    if elf_class not in (1, 2) or endian not in (1, 2):
        raise NotELF("unsupported ELF class or byte order")
    is64 = elf_class == 2
    order = "<" if endian == 1 else ">"

    def unpack(fmt, offset):
        return struct.unpack_from(order + fmt, data, offset)

    try:
        if is64:
            shoff, = unpack("Q", 0x28)
            shentsize, shnum = unpack("HH", 0x3A)
        else:
            shoff, = unpack("I", 0x20)
            shentsize, shnum = unpack("HH", 0x2E)
        sections = []
        for i in range(shnum):
            base = shoff + i * shentsize
            if is64:
                _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize = unpack(
                    "IIQQQQIIQQ", base)
            else:
                _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize = unpack(
                    "IIIIIIIIII", base)
            sections.append((sh_type, offset, size, link, entsize))
        names = set()
        for sh_type, offset, size, link, entsize in sections:
            if sh_type != SHT_DYNSYM or entsize == 0:
                continue
            strtab_offset = sections[link][1]
            for index in range(1, size // entsize):
                entry = offset + index * entsize
                if is64:
                    st_name, st_info, _other, st_shndx = unpack("IBBH", entry)
                else:
                    st_name, = unpack("I", entry)
                    st_info, _other, st_shndx = unpack("BBH", entry + 12)
                binding, kind = st_info >> 4, st_info & 0xF
                if st_shndx == SHN_UNDEF or kind != STT_FUNC or binding not in (STB_GLOBAL, STB_WEAK):
                    continue
                end = data.index(b"\0", strtab_offset + st_name)
                names.add(data[strtab_offset + st_name:end].decode("utf-8", "replace"))
        return names
    except (struct.error, IndexError, ValueError) as e:
        raise NotELF(f"malformed ELF file ({e})") from None


def pipeline_names(path) -> list[str]:
    """The NAMEs for which the library exports both NAME_argv and NAME_metadata."""
    functions = exported_functions(path)
    return sorted(
        name[: -len("_metadata")]
        for name in functions
        if name.endswith("_metadata") and name[: -len("_metadata")] + "_argv" in functions
    )
