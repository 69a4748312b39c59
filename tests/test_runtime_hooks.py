"""Halide's runtime hooks are honoured under the shim (issue 27): what an application installs
with halide_set_error_handler, halide_set_custom_print, halide_set_custom_malloc /
halide_set_custom_free, halide_set_custom_do_par_for and halide_set_custom_do_task is called
with Halide's semantics, from the pipeline's own threads too, and the shim's exceptions still
carry Halide's messages.
The hooks are installed through ctypes, as a program embedding the shim would, and put back
as they were after each test.

A runtime function an application defines itself (its own halide_acquire_cl_context, say)
does not replace the shim's: the shim's runtime library is loaded with RTLD_GLOBAL before any
pipeline (see docs/internals.md), and a library that defines one strongly (Halide's runtime
defines them weak) is warned of when it loads; the hooks are the way to change what the
runtime does. MemorySanitizer's memory-level hooks are the exception: a library's own are
called for its code, as Halide's msan test expects."""

import ctypes
import subprocess
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import shim
import shim._native

RUNTIME = ctypes.CDLL(shim._native.__file__)
ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
TASK = ctypes.c_void_p  # (passed on untouched)
DO_PAR_FOR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, TASK, ctypes.c_int, ctypes.c_int,
                              ctypes.c_void_p)


def _setter(name, kind):
    setter = getattr(RUNTIME, name)
    setter.argtypes, setter.restype = [kind], kind
    return setter


@contextmanager
def installed(name, kind, function):
    """The hook ``function`` installed with Halide's ``name`` setter, the previous one back
    afterwards."""
    setter = _setter(name, kind)
    previous = setter(kind(function) if not isinstance(function, kind) else function)
    try:
        yield
    finally:
        setter(previous)


@pytest.fixture
def checked_sqrt(host_pipelines, runtime):
    return shim.load(host_pipelines["checked_sqrt", runtime])


def test_an_error_handler_is_called_and_the_exception_keeps_the_message(checked_sqrt):
    seen = []
    handler = ERROR(lambda uc, msg: seen.append((msg.decode(), threading.get_ident())))
    image = np.ones((8, 4), np.float32)
    image[5, 2] = -1
    with installed("halide_set_error_handler", ERROR, handler):
        with pytest.raises(shim.PipelineError, match="negative input") as e:
            checked_sqrt(image, False, output=np.zeros_like(image))
    assert len(seen) == 1 and "negative input -1.000000 at row 5" in seen[0][0]
    assert seen[0][0].strip() in str(e.value)
    # Put back: the next failure reaches no handler, and still raises.
    with pytest.raises(shim.PipelineError, match="negative input"):
        checked_sqrt(image, False, output=np.zeros_like(image))
    assert len(seen) == 1


def test_a_custom_print_gets_halides_text_instead_of_stderr(checked_sqrt, capfd):
    text = []
    printer = ERROR(lambda uc, msg: text.append(msg.decode()))
    image = np.ones((6, 3), np.float32)
    with installed("halide_set_custom_print", ERROR, printer):
        checked_sqrt(image, True, output=np.zeros_like(image))
    assert sorted(line for chunk in text for line in chunk.splitlines()) == \
        sorted(f"1.000000 row {y}" for y in range(6))
    assert "row" not in capfd.readouterr().err  # (the shim did not print it too)
    checked_sqrt(image, True, output=np.zeros_like(image))
    assert "row 5" in capfd.readouterr().err  # put back: the shim's printing again


def test_custom_malloc_and_free_serve_the_pipelines_own_allocations(host_pipelines, runtime):
    # blur3x3's horizontal pass is compute_root: one heap allocation per call.
    blur = shim.load(host_pipelines["blur3x3", runtime])
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    calls = {"malloc": 0, "free": 0}
    live = set()

    def my_malloc(uc, size):
        calls["malloc"] += 1
        pointer = libc.malloc(size + 128)
        aligned = (pointer + 128) & ~127  # (Halide wants aligned memory, as its own gives)
        live.add(aligned)
        ctypes.c_void_p.from_address(aligned - 8).value = pointer
        return aligned

    def my_free(uc, pointer):
        calls["free"] += 1
        live.discard(pointer)
        libc.free(ctypes.c_void_p.from_address(pointer - 8).value)

    image = np.random.default_rng(0).integers(0, 65536, (40, 30), dtype=np.uint16)
    expected = blur(image).numpy()
    with installed("halide_set_custom_malloc", MALLOC, MALLOC(my_malloc)), \
            installed("halide_set_custom_free", FREE, FREE(my_free)):
        out = blur(image).numpy()
    np.testing.assert_array_equal(out, expected)
    assert calls["malloc"] >= 1 and calls["free"] == calls["malloc"] and not live


def test_a_custom_do_par_for_runs_the_parallel_loops(checked_sqrt):
    default = RUNTIME.halide_default_do_par_for
    default.restype = ctypes.c_int
    default.argtypes = [ctypes.c_void_p, TASK, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    loops = []

    def my_do_par_for(uc, task, lo, size, closure):
        loops.append((lo, size))
        return default(uc, task, lo, size, closure)

    image = np.arange(24, dtype=np.float32).reshape(6, 4)
    with installed("halide_set_custom_do_par_for", DO_PAR_FOR, DO_PAR_FOR(my_do_par_for)):
        out = checked_sqrt(image, False, output=np.zeros_like(image))
    np.testing.assert_allclose(out, np.sqrt(image), rtol=1e-6)
    assert loops == [(0, 6)]  # (the rows, in one parallel loop)
    # The tasks still ran under the call's context: an error from a row still raises.
    image[3, 1] = -5
    with installed("halide_set_custom_do_par_for", DO_PAR_FOR, DO_PAR_FOR(my_do_par_for)):
        with pytest.raises(shim.PipelineError, match="at row 3"):
            checked_sqrt(image, False, output=np.zeros_like(image))


DO_TASK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, TASK, ctypes.c_int, ctypes.c_void_p)


def test_a_custom_do_task_runs_each_iteration_of_the_pools_loops(checked_sqrt):
    """halide_set_custom_do_task: the shim's pool calls it for each iteration, on its workers
    too, each under its call's context, as Halide's calls it."""
    default = RUNTIME.halide_default_do_task
    default.restype = ctypes.c_int
    default.argtypes = [ctypes.c_void_p, TASK, ctypes.c_int, ctypes.c_void_p]
    rows = []

    def my_do_task(uc, task, index, closure):
        rows.append(index)
        return default(uc, task, index, closure)

    image = np.arange(40, dtype=np.float32).reshape(10, 4)
    with installed("halide_set_custom_do_task", DO_TASK, DO_TASK(my_do_task)):
        out = checked_sqrt(image, False, output=np.zeros_like(image))
        np.testing.assert_allclose(out, np.sqrt(image), rtol=1e-6)
        assert sorted(rows) == list(range(10))
        image[7, 2] = -1
        with pytest.raises(shim.PipelineError, match="at row 7"):
            checked_sqrt(image, False, output=np.zeros_like(image))
    rows.clear()
    checked_sqrt(np.ones((3, 3), np.float32), False, output=np.zeros((3, 3), np.float32))
    assert rows == []  # put back: the default again


def test_outside_a_call_a_handled_error_is_the_handlers_alone(capfd):
    # A program calling a pipeline from C (or a destructor at exit) has no shim call to keep
    # the message for: the shim prints it, as Halide's default does, unless a handler had it.
    halide_error = RUNTIME.halide_error
    halide_error.argtypes, halide_error.restype = [ctypes.c_void_p, ctypes.c_char_p], None
    halide_error(None, b"unhandled outside a call\n")
    assert "unhandled outside a call" in capfd.readouterr().err
    seen = []
    with installed("halide_set_error_handler", ERROR,
                   ERROR(lambda uc, msg: seen.append(msg.decode()))):
        halide_error(None, b"handled outside a call\n")
    assert seen == ["handled outside a call\n"]
    assert "handled outside a call" not in capfd.readouterr().err


OVERRIDE = """
#include <stdbool.h>
/* What Halide's docs tell an application to do to give its OpenCL runtime its own context. */
int halide_acquire_cl_context(void *user_context, void **ctx, void **q, bool create) {
    return 0;
}
int halide_release_cl_context(void *user_context) { return 0; }
"""


def test_a_library_defining_runtime_functions_itself_is_warned_of(host_pipelines, tmp_path):
    hl = pytest.importorskip("halide", reason="compiling a test pipeline needs halide")
    x = hl.Var("x")
    plus = hl.Func("plus_one")
    plus[x] = x + 1
    plus.compile_to({hl.OutputFileType.object: str(tmp_path / "plus.o")}, [], "plus_one",
                    hl.Target("host-no_runtime"))
    (tmp_path / "own.c").write_text(OVERRIDE)
    library = tmp_path / "plus_own.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, tmp_path / "plus.o",
                    tmp_path / "own.c"], check=True)
    with pytest.warns(shim.RuntimeOverrideWarning, match="defines its own "
                      "halide_acquire_cl_context, halide_release_cl_context: the shim's runtime "
                      "replaces them"):
        pipeline = shim.load(library)
    np.testing.assert_array_equal(np.asarray(pipeline(plus_one=(4,))), [1, 2, 3, 4])
    # Halide's own runtime, bundled, defines them all weak: no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", shim.RuntimeOverrideWarning)
        shim.load(host_pipelines["brighten", "bundled"])


# A program that checks memory with its own msan hooks, as Halide's msan AOT test does: the
# pipeline (built with the msan feature) annotates what it writes and checks what it reads,
# and the hooks log each call's kind and length. MemorySanitizer's own entry points must never
# be reached: the program's hooks stand in for them.
MSAN_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "HalideRuntime.h"

int doubled(struct halide_buffer_t *in, struct halide_buffer_t *out);

static char log_text[8192];
static size_t log_used;
/* Whether run_logged is running: the shim's runtime annotates the text of every message any
 * pipeline prints with the first loaded library's own hook, this one once it is loaded. */
static volatile int logging;

static void note(const char *kind, uint64_t len) {
    if (!logging || log_used > sizeof log_text - 64) return;
    log_used += snprintf(log_text + log_used, sizeof log_text - log_used, "%s %llu\n", kind,
                         (unsigned long long)len);
}
int halide_msan_annotate_memory_is_initialized(void *uc, const void *p, uint64_t len) {
    note("annotate", len);
    return 0;
}
int halide_msan_check_memory_is_initialized(void *uc, const void *p, uint64_t len, const char *n) {
    note(n, len);
    return 0;
}
void __msan_unpoison(const volatile void *p, size_t n) { abort(); }
void __msan_check_mem_is_initialized(const volatile void *p, size_t n) { abort(); }
long __msan_test_shadow(const volatile void *p, size_t n) { abort(); }
static void on_error(void *uc, const char *msg) { note("error", strlen(msg)); }

/* Runs the pipeline on an interleaved 4x4x3 input of width `in_width` (4 fits; less fails
 * the bounds check) into a planar 4x4x3 output; the log of the hooks' calls. */
const char *run_logged(int in_width) {
    static uint8_t in_data[4 * 4 * 3], out_data[4 * 4 * 3];
    for (int i = 0; i < 4 * 4 * 3; i++) in_data[i] = (uint8_t)(i * 7 + 1);
    halide_dimension_t in_dim[3] = {{0, in_width, 3, 0}, {0, 4, 12, 0}, {0, 3, 1, 0}};
    halide_dimension_t out_dim[3] = {{0, 4, 1, 0}, {0, 4, 4, 0}, {0, 3, 16, 0}};
    halide_buffer_t in = {0}, out = {0};
    in.host = in_data; in.type.code = halide_type_uint; in.type.bits = 8; in.type.lanes = 1;
    in.dimensions = 3; in.dim = in_dim;
    out.host = out_data; out.type = in.type; out.dimensions = 3; out.dim = out_dim;
    log_used = 0;
    log_text[0] = 0;
    halide_error_handler_t previous = halide_set_error_handler(on_error);
    logging = 1;
    int result = doubled(&in, &out);
    note("result", (uint64_t)(result < 0 ? -result : result));
    for (int i = 0; i < 4 * 4 * 3; i++) {
        int x = i % 4, y = i / 4 % 4, c = i / 16;
        if (result == 0 && out_data[i] != (uint8_t)(in_data[x * 3 + y * 12 + c] * 2)) note("wrong", i);
    }
    logging = 0;
    halide_set_error_handler(previous);
    return log_text;
}

#ifdef MAIN
int main(void) {
    fputs(run_logged(4), stdout);
    fputs("--\n", stdout);
    fputs(run_logged(3), stdout);
    return 0;
}
#endif
"""


def test_a_programs_own_msan_hooks_see_what_they_see_under_halides_runtime(tmp_path):
    """Halide's msan test, in small: a library that defines halide_msan_*_memory_is_initialized
    itself gets the same calls, in the same order and of the same lengths, through the shim as
    the same code linked with Halide's own msan runtime (a program of its own), the failing
    call's error message included. No RuntimeOverrideWarning: these are honoured
    (native_stubs/calls/msan.c)."""
    hl = pytest.importorskip("halide", reason="compiling a test pipeline needs halide")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    source = hl.ImageParam(hl.UInt(8), 3, "source")
    doubled = hl.Func("doubled")
    doubled[x, y, c] = source[x, y, c] * 2
    source.dim(0).set_stride(3)
    source.dim(2).set_stride(1)
    objects = {"pipeline": tmp_path / "doubled.o", "runtime": tmp_path / "runtime.o"}
    doubled.compile_to({hl.OutputFileType.object: str(objects["pipeline"])}, [source], "doubled",
                       hl.Target("host-msan-no_runtime"))
    hl.compile_standalone_runtime(str(objects["runtime"]), hl.Target("host-msan"))
    (tmp_path / "program.c").write_text(MSAN_PROGRAM)
    include = ["-I", str(Path(hl.install_dir()) / "include")]
    stock = tmp_path / "stock"
    subprocess.run(["cc", "-DMAIN", *include, "-o", stock, tmp_path / "program.c",
                    objects["pipeline"], objects["runtime"], "-lpthread", "-ldl", "-lm"],
                   check=True)
    library = tmp_path / "doubled_checked.so"
    subprocess.run(["cc", "-shared", "-fPIC", *include, "-o", library, tmp_path / "program.c",
                    objects["pipeline"]], check=True)
    expected = subprocess.run([stock], capture_output=True, text=True, check=True).stdout

    with warnings.catch_warnings():
        warnings.simplefilter("error", shim.RuntimeOverrideWarning)
        shim.load(library)
    program = ctypes.CDLL(str(library))
    program.run_logged.restype, program.run_logged.argtypes = ctypes.c_char_p, [ctypes.c_int]
    seen = program.run_logged(4).decode() + "--\n" + program.run_logged(3).decode()
    assert seen == expected
    # (what was compared: checks of the input, annotations of the output, an error's message)
    fits, fails = expected.split("--\n")
    assert "source.buffer 48" in fits and "annotate 48" in fits and fits.endswith("result 0\n")
    assert "error" in fails and not fails.endswith("result 0\n") and "wrong" not in expected


# A library with its own annotation hook (counting its calls), loaded with ctypes; then a
# pipeline whose runtime prints (trace_all: Halide's runtime in the shim prints every event,
# annotating each message's text with the first loaded library's own hook: this one); then
# whoever loaded the library unloads it, and the pipeline prints again.
OWN_ANNOTATION_C = r"""
#include <stdint.h>
int annotations;
int halide_msan_annotate_memory_is_initialized(void *uc, const void *p, uint64_t len) {
    annotations++;
    return 0;
}
"""

UNLOADED_HOOKS = r"""
import _ctypes, ctypes, os, sys
import numpy as np
import shim

hooks_path, pipeline_path = sys.argv[1:3]
hooks = ctypes.CDLL(hooks_path)
traced = shim.load(pipeline_path)
image = np.ones((2, 2), np.float32)
traced(image, 2.0, 0.0, output=image.shape)
print("annotated", ctypes.c_int.in_dll(hooks, "annotations").value > 0, flush=True)
_ctypes.dlclose(hooks._handle)  # (its one reference: as unloading goes, the library goes)
try:
    hooks = ctypes.CDLL(hooks_path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
except OSError:
    print("unloaded", flush=True)
else:
    print("still loaded", flush=True)
traced(image, 2.0, 0.0, output=image.shape)
print("annotated again", ctypes.c_int.in_dll(hooks, "annotations").value > 0, flush=True)
"""


def test_a_library_whose_msan_hooks_were_found_survives_being_unloaded(tmp_path):
    """The shim keeps what its runtime found (a snapshot, called at every message it prints),
    so a library whose hooks were found stays loaded (RTLD_NODELETE): unloading it and then
    printing from a pipeline was a SIGSEGV."""
    from shim.pipelines.build import Build, build

    (tmp_path / "hooks.c").write_text(OWN_ANNOTATION_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", tmp_path / "hooks.so", tmp_path / "hooks.c"],
                   check=True)
    traced = build(Build("brighten", "host", "no_runtime", ("trace_all",)))
    done = subprocess.run([sys.executable, "-c", UNLOADED_HOOKS, str(tmp_path / "hooks.so"),
                           str(traced)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.stdout.splitlines() == ["annotated True", "still loaded", "annotated again True"]
