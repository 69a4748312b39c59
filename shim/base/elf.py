"""The names a shared library exports and needs, read from its ELF dynamic symbol table.

A Halide AOT pipeline exports NAME_argv and NAME_metadata but nothing says what NAME is, so
shim.load reads the table: enough of ELF64/ELF32 to list defined global function symbols, and
the symbols the library needs from others (which tell how its runtime functions are named).
"""

from __future__ import annotations

import struct

SHT_DYNSYM = 11
STB_GLOBAL, STB_WEAK = 1, 2
STT_FUNC = 2
SHN_UNDEF = 0
# e_machine values of the architectures Halide compiles for, to name them in messages.
MACHINES = {3: "x86", 8: "MIPS", 20: "PowerPC", 21: "PowerPC64", 40: "ARM", 62: "x86-64",
            164: "Hexagon", 183: "AArch64", 243: "RISC-V", 258: "LoongArch"}


class NotELF(ValueError):
    """The file is not an ELF shared object this reader understands."""


def _identity(data: bytes) -> tuple[bool, str]:
    """(64-bit, struct byte order) from the start of an ELF file."""
    if data[:4] != b"\x7fELF":
        raise NotELF("not an ELF file")
    if len(data) < 20 or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise NotELF("unsupported ELF class or byte order")
    return data[4] == 2, "<" if data[5] == 1 else ">"


def architecture(path) -> str:
    """What machine code the ELF file holds, as "64-bit little-endian x86-64": a process loads
    only libraries whose architecture is its own."""
    with open(path, "rb") as f:
        header = f.read(20)
    is64, order = _identity(header)
    machine, = struct.unpack_from(order + "H", header, 18)
    return (f"{64 if is64 else 32}-bit {'little' if order == '<' else 'big'}-endian "
            f"{MACHINES.get(machine, f'machine {machine}')}")


# e_type: what kind of ELF file it is (a shared library is ET_DYN).
ET_REL, ET_EXEC, ET_DYN = 1, 2, 3


def file_type(path) -> int:
    """The ELF file's e_type (ET_REL for an object file such as Halide's ``-e object``)."""
    with open(path, "rb") as f:
        header = f.read(20)
    _is64, order = _identity(header)  # (which checks there are 20 bytes)
    return struct.unpack_from(order + "H", header, 16)[0]


def exported_functions(path) -> set[str]:
    return set(function_symbols(path))


def function_symbols(path) -> dict[str, bool]:
    """{name: whether its definition is strong (STB_GLOBAL, not weak)} of the functions the
    ELF file defines and exports. Halide's runtime defines every function weak: a strong
    halide_* one is an application's own."""
    return dynamic_symbols(path)[0]


def dynamic_symbols(path) -> tuple[dict[str, bool], frozenset[str]]:
    """The ELF file's dynamic symbols: the functions it defines and exports, as
    function_symbols gives them, and the names of the symbols it needs from other objects
    (undefined; a no_runtime pipeline's runtime functions among them)."""
    with open(path, "rb") as f:
        data = f.read()
    is64, order = _identity(data)

    def unpack(fmt, offset):
        return struct.unpack_from(order + fmt, data, offset)

    try:
        if is64:
            shoff, = unpack("Q", 0x28)
            shentsize, shnum = unpack("HH", 0x3A)
        else:
            shoff, = unpack("I", 0x20)
            shentsize, shnum = unpack("HH", 0x2E)
        # (Each header its own 64 or 40 bytes within the file, as ELF has them: a count and
        # size read from a damaged header could otherwise have the loop read one place
        # 65535 times.)
        if shentsize < (64 if is64 else 40) or shoff + shnum * shentsize > len(data):
            raise NotELF(f"{shnum} section headers of {shentsize} bytes at {shoff} do not fit "
                         f"the file's {len(data)} bytes")
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
        names, needed = {}, set()
        # The dynamic symbol table: ELF has one. (Only the first counts: a table listed again
        # and again would be read whole each time.)
        dynsym = next((section for section in sections if section[0] == SHT_DYNSYM), None)
        if dynsym is None:
            return names, frozenset(needed)
        _type, offset, size, link, entsize = dynsym
        if entsize < (24 if is64 else 16):
            raise NotELF(f"dynamic symbols of {entsize} bytes")
        strtab_offset, strtab_size = sections[link][1:3]
        strtab_end = min(strtab_offset + strtab_size, len(data))
        for index in range(1, min(size, len(data)) // entsize):
            entry = offset + index * entsize
            if is64:
                st_name, st_info, _other, st_shndx = unpack("IBBH", entry)
            else:
                st_name, = unpack("I", entry)
                st_info, _other, st_shndx = unpack("BBH", entry + 12)
            binding, kind = st_info >> 4, st_info & 0xF
            if binding not in (STB_GLOBAL, STB_WEAK):
                continue
            if st_shndx != SHN_UNDEF and kind != STT_FUNC:
                continue
            # (A name ends within the string table: one running on to the file's end, read
            # for each of a file's thousands of symbols, would take minutes.)
            end = data.index(b"\0", strtab_offset + st_name, strtab_end)
            name = data[strtab_offset + st_name:end].decode("utf-8", "replace")
            if st_shndx == SHN_UNDEF:
                needed.add(name)
            else:
                names[name] = names.get(name, False) or binding == STB_GLOBAL
        return names, frozenset(needed)
    except (struct.error, IndexError, ValueError, OverflowError) as e:
        # (OverflowError: an offset beyond any file, read from a header of random bytes.)
        raise NotELF(f"malformed ELF file ({e})") from None


def pipeline_names(path, functions=None) -> list[str]:
    """The NAMEs for which the library exports both NAME_argv and NAME_metadata (among
    ``functions``, if they were read already)."""
    functions = exported_functions(path) if functions is None else functions
    return sorted(
        name[: -len("_metadata")]
        for name in functions
        if name.endswith("_metadata") and name[: -len("_metadata")] + "_argv" in functions
    )
