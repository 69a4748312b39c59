"""cffi builder for the native runtime library, the extension module ``shim._native``.

setup.py names this file in ``cffi_modules``. The module is one shared object holding
- the C files in this folder's subfolders, one a layer (tests/test_native_layers.py holds
  their order): the halide_* entry points the shim overrides, the call contexts, and the
  helpers Python calls;
- Halide's own standalone host runtime (thread pool, semaphores, halide_malloc, the
  halide_error_* family), compiled here with ``halide.compile_standalone_runtime``. Every
  symbol in it is weak, so where this folder defines a function too, ours wins at link time;
  the entry points the shim serves per release keep Halide's implementation callable under
  another name (HALIDE21_RENAMED);
- the cffi glue for the declarations in ``abi/``;
- its stamp (shim/native/stamp.py): the package version and the digests of the sources it is
  built from, which ``import shim`` checks.

On x86-64 glibc it binds every libc function to the version glibc 2.28 had (GLIBC_PINS), however
new the glibc it is built on: one build, the development one and the wheel's alike, that runs on
glibc 2.28 and later (the wheel's tag, manylinux_2_28; docs/development.md, "Wheels").

Python loads it with RTLD_GLOBAL|RTLD_NOW before any pipeline (see shim/native/__init__.py), so its
definitions also win over the runtime a pipeline carries inside its own .so.
"""

import glob
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sysconfig
from importlib import metadata

import cffi
import halide

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "native_stubs")
ABI = os.path.join(ROOT, "abi")
HALIDE_INCLUDE = os.path.join(halide.install_dir(), "include")

# What cffi sees, in dependency order: Halide's ABI (21's, and 22's where it differs), then the
# native library's own API.
CDEF_FILES = ["halide_runtime.h", "halide_profiler.h", "halide22_runtime.h", "halide_runtime_gpu.h",
              "halide_device_impl.h", "dlpack.h", "shim_calls.h", "shim_buffers.h",
              "shim_allocations.h", "shim_backends.h", "shim_fast_paths.h", "shim_dlpack.h", "shim_signals.h",
              "shim_profile.h", "shim_trace.h", "shim_fork.h", "shim_releases.h"]
# Then the Python core's callbacks, plain prototypes that the C files include too; cffi gets
# them inside extern "Python+C" { }, which has it define them as calls into Python.
CALLBACKS_FILE = "shim_callbacks.h"


def _package_module(path):
    """shim/<path>, loaded by path: importing shim needs the module built here."""
    name = path.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(f"shim_build_{name}",
                                                  os.path.join(ROOT, "shim", path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_abi(name):
    with open(os.path.join(ABI, name)) as f:
        return f.read()


def _relative(path):
    # setuptools wants sources relative to setup.py, which lives in ROOT.
    return os.path.relpath(path, ROOT)


# Entry points whose meaning changed between Halide releases, which the shim defines itself to
# serve each library by the release that built it (native_stubs/calls/releases.h), and which
# keep Halide 21's implementation for Halide 19 and 21 libraries: the runtime object's symbol is
# renamed (objcopy --redefine-sym), so that the shim's definition takes the name and Halide's
# stays callable under the new one (declared in native_stubs/shim_native.h). Renaming in the
# object, rather than reimplementing Halide 21's side, keeps 19 and 21 libraries on exactly the
# code they ran before; and it is the only way to reach it: with both defined under one name,
# the linker keeps the shim's (every symbol of the runtime is weak) and drops Halide's.
HALIDE21_RENAMED = {
    name: name.replace("halide_", "halide21_", 1) for name in (
        "halide_profiler_instance_start", "halide_profiler_instance_end",
        "halide_profiler_memory_allocate", "halide_profiler_memory_free",
        "halide_profiler_stack_peak_update", "halide_default_trace")
}


# The oldest glibc the library runs on is 2.28 (RHEL 8, Debian 10, Ubuntu 20.04: manylinux_2_28,
# the tag of halide 21's own wheels). A library links each libc function at the version that is
# the default in the glibc it is built on, and glibc gives a function a new version when it moves
# it: 2.32 and 2.34 moved libpthread's and libdl's functions into libc.so.6, so a library built
# on 2.34 or later needs 2.34 to load. These are the functions the library calls (ours and the
# standalone runtime's) whose default version is newer than 2.28, each bound to the version it
# had in 2.28, which newer glibc still exports as an alias of the same function (the same
# address: tests/test_glibc_floor.py). These are x86-64's versions: another architecture's glibc
# has other ones, and there the library links the defaults (we ship no wheel for it).
# tests/test_glibc_floor.py fails naming a function that needs a newer version, added here.
GLIBC_PINS = {
    "dlopen": "GLIBC_2.2.5", "dlsym": "GLIBC_2.2.5", "dlerror": "GLIBC_2.2.5",
    "dlclose": "GLIBC_2.2.5", "dladdr": "GLIBC_2.2.5", "dladdr1": "GLIBC_2.3.3",
    "pthread_create": "GLIBC_2.2.5", "pthread_join": "GLIBC_2.2.5",
    "pthread_detach": "GLIBC_2.2.5", "pthread_once": "GLIBC_2.2.5",
    "pthread_key_create": "GLIBC_2.2.5", "pthread_setspecific": "GLIBC_2.2.5",
    "pthread_attr_getstack": "GLIBC_2.2.5", "pthread_getattr_np": "GLIBC_2.2.5",
    "pthread_sigmask": "GLIBC_2.2.5",
}
# Before 2.34 those functions live in libdl.so.2 and libpthread.so.0, so the library names both
# among the libraries it needs, which puts them in its lookup scope on an older glibc. Built on
# 2.34 or later, where -ldl and -lpthread find empty archives, that takes naming the files, and
# --no-as-needed: nothing binds to them there (a linker that drops unused libraries by default,
# as Ubuntu's does, would drop them).
GLIBC_PINNED_LIBRARIES = ["-Wl,--push-state,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0",
                          "-Wl,--pop-state"]


# Whether this build is for x86-64 glibc, where GLIBC_PINS apply.
GLIBC_X86_64 = sysconfig.get_platform() == "linux-x86_64" and platform.libc_ver()[0] == "glibc"


def glibc_pins() -> dict[str, str]:
    """GLIBC_PINS where the library is built for x86-64 glibc; none elsewhere."""
    return GLIBC_PINS if GLIBC_X86_64 else {}


def _cached(name: str, recipe: dict) -> tuple[str, bool]:
    """build/native/<name> with the digest of ``recipe`` (what the file is made from) in its
    name, and whether it exists already."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    stem, suffix = os.path.splitext(name)
    path = os.path.join(ROOT, "build", "native", f"{stem}-{digest}{suffix}")
    return path, os.path.exists(path)


def glibc_pins_header() -> str | None:
    """A header that binds our C files' calls to GLIBC_PINS' versions (``.symver``, given to
    every C file with -include); None where there are no pins."""
    pins = glibc_pins()
    if not pins:
        return None
    path, exists = _cached("glibc_pins.h", pins)
    if not exists:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write("/* Generated by native_stubs/build.py from GLIBC_PINS. */\n")
            f.writelines(f'__asm__(".symver {name}, {name}@{version}");\n'
                         for name, version in sorted(pins.items()))
        os.replace(tmp, path)
    return path


def _objcopy() -> str:
    tool = shutil.which(os.environ.get("OBJCOPY", "objcopy"))
    if tool is None:
        raise RuntimeError("building the native library needs objcopy (GNU binutils, which "
                           "comes with gcc; or name another in OBJCOPY)")
    return tool


def standalone_runtime_object():
    """Halide's host runtime for this machine's OS and architecture, without CPU features, so
    the library runs on any CPU of the family, with HALIDE21_RENAMED's symbols renamed and its
    calls of glibc_pins()' functions bound to their versions (a name ``f@VERSION`` in an object
    is the linker's versioned reference, what ``.symver`` makes in ours). Cached per halide
    version, target and renaming in build/native/."""
    host = halide.get_host_target()
    target = halide.Target(host.os, host.arch, host.bits)
    renaming = {**HALIDE21_RENAMED,
                **{name: f"{name}@{version}" for name, version in glibc_pins().items()}}
    path, exists = _cached("halide_runtime.o", {"halide": metadata.version("halide"),
                                                "target": str(target), "renaming": renaming})
    if not exists:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.o"
        halide.compile_standalone_runtime(tmp, target)
        subprocess.run([_objcopy(), *(f"--redefine-sym={old}={new}"
                                      for old, new in sorted(renaming.items())), tmp],
                       check=True)
        os.replace(tmp, path)
    return path


# $HALIDE_SHIM_SANITIZE builds the library instrumented by gcc's (or clang's) sanitizers: the
# value is the -fsanitize= list, one of SANITIZE_CHOICES. Such a module only loads into an
# interpreter that has the sanitizer's runtime preloaded (LD_PRELOAD), so it is built into a
# folder of its own (setup.py build_ext --build-lib DIR) and loaded with $HALIDE_SHIM_NATIVE:
# .ci/sanitizers does both (docs/development.md, "Sanitizers").
SANITIZE = "HALIDE_SHIM_SANITIZE"
SANITIZE_CHOICES = ("address,undefined", "thread")


def sanitize_flags() -> tuple[list[str], list[str]]:
    """The extra (compile, link) flags $HALIDE_SHIM_SANITIZE asks for; none when it is unset."""
    chosen = os.environ.get(SANITIZE, "")
    if not chosen:
        return [], []
    if chosen not in SANITIZE_CHOICES:
        raise RuntimeError(f"${SANITIZE}={chosen!r}: expected one of "
                           f"{', '.join(map(repr, SANITIZE_CHOICES))} (or unset)")
    flag = f"-fsanitize={chosen}"
    # -O1 and frame pointers: reports with whole stacks and lines (-g), at a speed that lets the
    # tests run; -O2 afterwards in extra_compile_args would win, so these come last.
    return [flag, "-fno-omit-frame-pointer", "-g", "-O1"], [flag]


def build_ffi():
    native_stamp = _package_module("native/stamp.py")
    stamp = native_stamp.make(_package_module("_version.py").__version__, ROOT)
    sanitize_compile, sanitize_link = sanitize_flags()
    pins_header = glibc_pins_header()
    pins_compile, pins_link = ((["-include", pins_header], GLIBC_PINNED_LIBRARIES)
                               if pins_header else ([], []))
    ffibuilder = cffi.FFI()
    for name in CDEF_FILES:
        ffibuilder.cdef(_read_abi(name))
    ffibuilder.cdef('extern "Python+C" {\n' + _read_abi(CALLBACKS_FILE) + '}\n')
    # The stamp is defined in the module's own source, not in a header: the C files never see it.
    ffibuilder.cdef(f"static const char *const {native_stamp.SYMBOL};")
    ffibuilder.set_source(
        "shim._native",
        '#include "shim_native.h"\n'
        # A JSON string is also a C string literal (the stamp is ASCII).
        f"static const char *const {native_stamp.SYMBOL} = {json.dumps(stamp)};\n",
        # Every layer's C files; they include each other's headers by their path from HERE.
        sources=[_relative(p) for p in sorted(glob.glob(os.path.join(HERE, "*", "*.c")))],
        include_dirs=[_relative(HERE), _relative(ABI), HALIDE_INCLUDE],
        extra_objects=[standalone_runtime_object()],
        extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wno-unused-function",
                            *pins_compile, *sanitize_compile],
        extra_link_args=[*pins_link, *sanitize_link],
        libraries=["dl", "pthread", "m"],
    )
    return ffibuilder


ffibuilder = build_ffi()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
