"""The stamp of the native module shim._native: the package version it was built for and a
digest of each source file it was built from.

native_stubs/build.py writes it into the module; shim/native/__init__.py checks it on import, so that a
module left from before a change of the package or of the contract between Python and C says
so, instead of failing strangely far from the cause; benchmarks/gpu_kit.py reads it to tell
whether the module a kit carries was built from this tree.

Standard library only, and no import of shim: the build and the kit load this file by path,
because importing shim needs the built module. Every ``import shim`` in a checkout reads the
stamp and digests the contract's files, so both are cheap: lines of text rather than JSON, and
a CRC-32 with the size rather than a cryptographic hash (json and hashlib cost 6 ms to import,
a tenth of the shim's import budget; the stamp guards against mistakes, not adversaries).
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path, PurePosixPath

# What the module is built from, relative to the checkout.
SOURCES = ("abi/*.h", "native_stubs/**/*.h", "native_stubs/**/*.c", "native_stubs/build.py")
# Of those, the contract between Python and C: the declarations cffi reads (the C files include
# them too) and the script that feeds them to cffi. A module built from other ones does not do
# what the Python code expects of it. One built from other C files, or from other headers of
# native_stubs/ (declarations C shares only with C), behaves as it did: still a stale build, but
# not one that should keep every process of a shared checkout from importing shim until the
# next rebuild.
CONTRACT = ("abi/*.h", "native_stubs/build.py")

# The stamp's name in the module's lib: a C string holding the stamp's text (see ``text``).
SYMBOL = "shim_native_stamp"


def source_root(package_dir) -> Path | None:
    """The checkout the package in ``package_dir`` lives in; None where the native sources are
    not beside it (an installed wheel)."""
    root = Path(package_dir).resolve().parent
    return root if (root / "native_stubs" / "build.py").is_file() else None


def digest(data: bytes) -> str:
    """A file's digest in a stamp: its size and CRC-32, in hex."""
    return f"{len(data):x}-{zlib.crc32(data):08x}"


def digests(root, patterns=SOURCES) -> dict[str, str]:
    """{path relative to ``root``: its digest} for the files ``patterns`` match."""
    root = Path(root)
    return {path.relative_to(root).as_posix(): digest(path.read_bytes())
            for pattern in patterns for path in sorted(root.glob(pattern))}


def make(version: str, root) -> str:
    """The stamp of a module built now, for package ``version``, from the sources in ``root``."""
    return text({"version": version, "sources": digests(root)})


def text(stamp: dict) -> str:
    """A stamp ({"version": ..., "sources": {path: digest}}) as the module carries it: a line
    ``version V``, then a line ``source PATH DIGEST`` per file (paths hold no blanks)."""
    return "\n".join([f"version {stamp['version']}"] +
                      [f"source {path} {d}" for path, d in sorted(stamp["sources"].items())])


def parse(stamp_text: str) -> dict:
    """The stamp ``text`` wrote, as the dict it was made from."""
    version, sources = None, {}
    for line in stamp_text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "version":
            version = rest
        elif word == "source":
            path, _, d = rest.rpartition(" ")
            sources[path] = d
    if version is None:
        raise ValueError(f"not a native module's stamp: {stamp_text[:80]!r}")
    return {"version": version, "sources": sources}


def contract(sources: dict) -> dict:
    """The entries of ``sources`` (as from digests) that are part of the contract."""
    return {path: digest for path, digest in sources.items()
            if any(PurePosixPath(path).match(pattern) for pattern in CONTRACT)}


def summary(sources: dict) -> str:
    """One short digest of a set of files' digests, to name the set in a message."""
    return f"{zlib.crc32(text({'version': '', 'sources': sources}).encode()):08x}"


def changes(built: dict, current: dict) -> list[str]:
    """How the files a module was built from (``built``) and ``current`` (both as from digests)
    differ: "PATH changed", "PATH added" or "PATH removed" since the build."""
    found = []
    for path in sorted(built.keys() | current.keys()):
        if path not in current:
            found.append(f"{path} removed")
        elif path not in built:
            found.append(f"{path} added")
        elif built[path] != current[path]:
            found.append(f"{path} changed")
    return found


def problems(built: dict | None, version: str, root: Path | None) -> list[str]:
    """What makes a module stamped ``built`` (None: it has no stamp) unfit for this package, of
    ``version``: another version; where the sources are here (``root``; None: an installed
    package), another contract than theirs."""
    if built is None:
        return ["it carries no build stamp (it was built before halide-shim stamped its builds)"]
    found = []
    if built["version"] != version:
        found.append(f"it was built for halide-shim {built['version']}, this is halide-shim {version}")
    if root is not None:
        built_contract = contract(built["sources"])
        current_contract = digests(root, CONTRACT)
        changed = changes(built_contract, current_contract)
        if changed:
            found.append(f"it was built from another ABI (digest {summary(built_contract)}) than "
                         f"this checkout's (digest {summary(current_contract)}): since it was "
                         f"built, {', '.join(changed)}")
    return found


READ_SCRIPT = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("shim._native", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
stamp = getattr(module.lib, "{SYMBOL}", None)
print("" if stamp is None else module.ffi.string(stamp).decode())
"""


def read(library, python: str = sys.executable) -> dict | None:
    """The stamp of the compiled module at ``library`` (None: it has none), read by ``python``
    in a process of its own: loading it here would put a second native library in this one."""
    import subprocess  # (here: every import of shim reads this module, few read a stamp)

    done = subprocess.run([python, "-I", "-c", READ_SCRIPT, str(library)], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"cannot load {library} to read its stamp:\n{done.stderr}")
    printed = done.stdout.strip()
    return parse(printed) if printed else None
