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

Python loads it with RTLD_GLOBAL|RTLD_NOW before any pipeline (see shim/native/__init__.py), so its
definitions also win over the runtime a pipeline carries inside its own .so.
"""

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
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


def _objcopy() -> str:
    tool = shutil.which(os.environ.get("OBJCOPY", "objcopy"))
    if tool is None:
        raise RuntimeError("building the native library needs objcopy (GNU binutils, which "
                           "comes with gcc; or name another in OBJCOPY)")
    return tool


def standalone_runtime_object():
    """Halide's host runtime for this machine's OS and architecture, without CPU features, so
    the library runs on any CPU of the family, with HALIDE21_RENAMED's symbols renamed. Cached
    per halide version and renaming in build/."""
    host = halide.get_host_target()
    target = halide.Target(host.os, host.arch, host.bits)
    version = metadata.version("halide")
    renamed = hashlib.sha256(json.dumps(HALIDE21_RENAMED, sort_keys=True).encode()).hexdigest()
    out_dir = os.path.join(ROOT, "build", "native")
    path = os.path.join(out_dir, f"halide_runtime-{version}-{target}-{renamed[:12]}.o")
    if not os.path.exists(path):
        os.makedirs(out_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.o"
        halide.compile_standalone_runtime(tmp, target)
        subprocess.run([_objcopy(), *(f"--redefine-sym={old}={new}"
                                      for old, new in sorted(HALIDE21_RENAMED.items())), tmp],
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
                            *sanitize_compile],
        extra_link_args=sanitize_link,
        libraries=["dl", "pthread", "m"],
    )
    return ffibuilder


ffibuilder = build_ffi()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
