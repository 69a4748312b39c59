"""The stock side of tests/test_build_flavors*.py: the flavor pipelines run under Halide's own
runtime (the one their library carries), in a child process where the shim is never
imported.

    python stock_child.py REQUESTS.pkl ANSWERS.pkl

REQUESTS is a pickled list of (case, keyword arguments); ANSWERS gets the list of what each
case returned (or the exception's traceback, as {"stock_failure": text}). Each case is a
function below; they use pipelines/stock.py (StockRuntime: Halide's declarations through
cffi, an error handler that records messages instead of aborting). Several cases may call
pipelines of one library, whose runtime the process then shares: a case that installs hooks
puts the previous ones back.
"""

from __future__ import annotations

import pickle
import sys
import threading
from pathlib import Path

import numpy as np

from pipelines.stock import StockRuntime

assert "shim" not in sys.modules

_TYPES = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64,
          (1, 1): np.bool_, (1, 8): np.uint8, (1, 16): np.uint16, (1, 32): np.uint32,
          (1, 64): np.uint64, (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64}
_FIELDS = {(0, 8): "i8", (0, 16): "i16", (0, 32): "i32", (0, 64): "i64", (1, 1): "b",
           (1, 8): "u8", (1, 16): "u16", (1, 32): "u32", (1, 64): "u64", (2, 32): "f32",
           (2, 64): "f64"}

HOOKS = """
typedef void (*halide_print_t)(void *, const char *);
halide_print_t halide_set_custom_print(halide_print_t);
typedef void *(*halide_malloc_t)(void *, size_t);
typedef void (*halide_free_t)(void *, void *);
halide_malloc_t halide_set_custom_malloc(halide_malloc_t);
halide_free_t halide_set_custom_free(halide_free_t);
void *halide_default_malloc(void *, size_t);
void halide_default_free(void *, void *);
"""


class Library(StockRuntime):
    """A library's pipelines under its bundled runtime; ``pipelines`` names the ones to call."""

    def __init__(self, library: str, pipelines=(), declarations: str = ""):
        entry = "".join(f"int {n}_argv(void **);"
                        f"const struct halide_filter_metadata_t *{n}_metadata(void);"
                        for n in pipelines)
        super().__init__(str(library), HOOKS + entry + declarations)
        self.keep = []

    def metadata(self, name: str):
        return getattr(self.lib, f"{name}_metadata")()

    def buffer(self, array: np.ndarray, htype=None, host_dirty=True):
        """A halide_buffer_t over ``array`` (numpy's last axis is x), any strides."""
        ffi = self.ffi
        dims = array.ndim
        dim = ffi.new("halide_dimension_t[]", max(dims, 1))
        for d in range(dims):
            axis = dims - 1 - d
            dim[d].extent = array.shape[axis]
            dim[d].stride = array.strides[axis] // array.itemsize
        raw = ffi.new("halide_buffer_t *")
        raw.host = ffi.cast("uint8_t *", array.ctypes.data)
        code, bits = htype or next(k for k, v in _TYPES.items() if np.dtype(v) == array.dtype)
        raw.type.code, raw.type.bits, raw.type.lanes = code, bits, 1
        raw.dimensions, raw.dim = dims, dim
        raw.flags = 1 if host_dirty else 0
        self.keep += [array, dim, raw]
        return raw

    def argv(self, name: str, values: dict, user_context=None):
        """argv for pipeline ``name``: arrays for buffers (outputs too, written in place),
        numbers for scalars (a handle: an int address), ``user_context`` for __user_context."""
        ffi = self.ffi
        md = self.metadata(name)
        argv = ffi.new("void *[]", md.num_arguments)
        for i in range(md.num_arguments):
            arg = md.arguments[i]
            key = ffi.string(arg.name).decode()
            if key == "__user_context":
                slot = ffi.new("void **", ffi.NULL if user_context is None else user_context)
            elif arg.kind == 0:
                slot = ffi.new("struct halide_scalar_value_t *")
                code_bits = (arg.type.code, arg.type.bits)
                value = values[key]
                if code_bits[0] == 3:
                    slot.u.handle = ffi.cast("void *", value)
                elif code_bits == (2, 16):
                    slot.u.u16 = int(np.array(value, np.float16).view(np.uint16))
                else:
                    setattr(slot.u, _FIELDS[code_bits], value)
            else:
                slot = self.buffer(values[key], (arg.type.code, arg.type.bits),
                                   host_dirty=arg.kind == 1)
            argv[i] = slot
            self.keep.append(slot)
        return argv

    def call(self, name: str, values: dict, user_context=None) -> int:
        """Runs pipeline ``name`` once; its result code. Outputs are copied to the host."""
        argv = self.argv(name, values, user_context)
        result = getattr(self.lib, f"{name}_argv")(argv)
        if result == 0:
            md = self.metadata(name)
            for i in range(md.num_arguments):
                if md.arguments[i].kind == 2:
                    raw = self.ffi.cast("halide_buffer_t *", argv[i])
                    assert self.lib.halide_copy_to_host(self.ffi.NULL, raw) == 0
        return result


# --- the cases ----------------------------------------------------------------------------------

def interleaved(shape, dtype):
    """A numpy array of ``shape`` (c, y, x) with c innermost in memory. (Made here: a pickled
    array arrives C-contiguous.)"""
    c, h, w = shape
    return np.zeros((h, w, c), dtype).transpose(2, 0, 1)


def run(library, name, values, user_context=None):
    """One call: {"result": code, "errors": [...], "outputs": {name: array}}. A value
    ("interleaved", shape, dtype) is such an array, made here."""
    values = {k: interleaved(*v[1:]) if isinstance(v, tuple) and v[0] == "interleaved" else v
              for k, v in values.items()}
    lib = Library(library, [name])
    outputs = {k: v for k, v in values.items() if isinstance(v, np.ndarray)}
    result = lib.call(name, values, user_context)
    return {"result": result, "errors": lib.errors, "outputs": outputs}


def metadata(library, name):
    """Every argument's metadata, raw: name, kind, dimensions, (code, bits, lanes), the bytes
    of each scalar value given (or None) and the buffer estimates (None where absent)."""
    lib = Library(library, [name])
    ffi = lib.ffi
    md = lib.metadata(name)
    arguments = []
    for i in range(md.num_arguments):
        a = md.arguments[i]
        scalars = {}
        for field in ("scalar_def", "scalar_min", "scalar_max", "scalar_estimate"):
            pointer = getattr(a, field)
            scalars[field] = None if pointer == ffi.NULL else bytes(ffi.buffer(pointer))
        estimates = None
        if a.buffer_estimates != ffi.NULL:
            estimates = [None if a.buffer_estimates[j] == ffi.NULL else int(a.buffer_estimates[j][0])
                         for j in range(2 * a.dimensions)]
        arguments.append({"name": ffi.string(a.name).decode(), "kind": a.kind,
                          "dimensions": a.dimensions,
                          "type": (a.type.code, a.type.bits, a.type.lanes),
                          **scalars, "buffer_estimates": estimates})
    return {"name": ffi.string(md.name).decode(), "target": ffi.string(md.target).decode(),
            "arguments": arguments}


def failing_malloc(library, name, size, device_counts=False):
    """A call whose second halide_malloc fails (the application's malloc hook returns NULL):
    its result, the error handler's calls, the hooks' counts, and with ``device_counts`` the
    application's own halide_device_malloc / halide_device_free counts (stock_counters.c)."""
    lib = Library(library, [name], "void flv_device_counts(int *, int *);" if device_counts else "")
    ffi = lib.ffi
    counts = {"mallocs": 0, "failed": 0, "frees": 0}
    live = set()

    @ffi.callback("void *(void *, size_t)")
    def my_malloc(uc, n):
        if counts["mallocs"]:
            counts["failed"] += 1
            return ffi.NULL
        counts["mallocs"] += 1
        pointer = lib.lib.halide_default_malloc(uc, n)
        live.add(int(ffi.cast("uintptr_t", pointer)))
        return pointer

    @ffi.callback("void (void *, void *)")
    def my_free(uc, pointer):
        if pointer != ffi.NULL:
            counts["frees"] += 1
            live.discard(int(ffi.cast("uintptr_t", pointer)))
            lib.lib.halide_default_free(uc, pointer)

    previous = (lib.lib.halide_set_custom_malloc(my_malloc), lib.lib.halide_set_custom_free(my_free))
    output = np.zeros(size, np.int32)
    try:
        result = getattr(lib.lib, f"{name}_argv")(lib.argv(name, {"output": output}))
    finally:  # (the library may serve more cases in this process)
        lib.lib.halide_set_custom_malloc(previous[0])
        lib.lib.halide_set_custom_free(previous[1])
    answer = {"result": result, "errors": list(lib.errors), **counts, "live": len(live)}
    if device_counts:
        m, f = ffi.new("int *"), ffi.new("int *")
        lib.lib.flv_device_counts(m, f)
        answer.update(device_mallocs=m[0], device_frees=f[0])
    return answer


def tagged_threads(library, name, calls, threads, bad_rows):
    """``calls`` calls of the user_context pipeline ``name`` on ``threads`` threads, call i
    with its own user_context (the address of slot i) and tag i, failing where
    bad_rows[i] is a row; every hook records the user_context it is given. Per call: result,
    output right, and what each hook saw for that call's context."""
    lib = Library(library, [name])
    ffi = lib.ffi
    slots = ffi.new("int[]", calls)
    base = int(ffi.cast("uintptr_t", slots))
    seen = {"print": [], "error": [], "trace": [], "malloc": [], "free": []}
    lock = threading.Lock()

    def index_of(uc):
        offset = int(ffi.cast("uintptr_t", uc)) - base
        return offset // ffi.sizeof("int") if 0 <= offset < calls * ffi.sizeof("int") else -1

    def note(kind, uc, text=""):
        with lock:
            seen[kind].append((index_of(uc), text))

    @ffi.callback("void (void *, const char *)")
    def on_print(uc, msg):
        note("print", uc, ffi.string(msg).decode())

    @ffi.callback("void (void *, const char *)")
    def on_error(uc, msg):
        note("error", uc, ffi.string(msg).decode())

    @ffi.callback("halide_trace_t")
    def on_trace(uc, event):
        note("trace", uc)
        return 0

    @ffi.callback("void *(void *, size_t)")
    def on_malloc(uc, n):
        note("malloc", uc)
        return lib.lib.halide_default_malloc(uc, n)

    @ffi.callback("void (void *, void *)")
    def on_free(uc, pointer):
        note("free", uc)
        lib.lib.halide_default_free(uc, pointer)

    previous = (lib.lib.halide_set_custom_print(on_print), lib.lib.halide_set_custom_trace(on_trace),
                lib.lib.halide_set_custom_malloc(on_malloc), lib.lib.halide_set_custom_free(on_free))
    lib.lib.halide_set_error_handler(on_error)
    results = [None] * calls
    argvs = []
    for i in range(calls):
        image = np.full((6, 5), float(i), np.float32)
        if bad_rows[i] is not None:
            image[bad_rows[i], 1] = -1
        out = np.zeros_like(image)
        argvs.append((lib.argv(name, {"input": image, "tag": i, "output": out},
                               user_context=slots + i), image, out))
    function = getattr(lib.lib, f"{name}_argv")

    def worker(k):
        for i in range(k, calls, threads):
            argv, image, out = argvs[i]
            code = function(argv)
            results[i] = (code, bool(code != 0 or np.array_equal(out, image * 2)))

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    lib.lib.halide_set_custom_print(previous[0])
    lib.lib.halide_set_custom_trace(previous[1])
    lib.lib.halide_set_custom_malloc(previous[2])
    lib.lib.halide_set_custom_free(previous[3])
    return {"results": results, "seen": seen}


PROFILER = """
struct halide_profiler_func_stats {
    uint64_t time, memory_current, memory_peak, memory_total, stack_peak;
    uint64_t active_threads_numerator, active_threads_denominator;
    const char *name;
    int num_allocs;
};
struct halide_profiler_pipeline_stats {
    uint64_t time, memory_current, memory_peak, memory_total;
    uint64_t active_threads_numerator, active_threads_denominator;
    const char *name;
    struct halide_profiler_func_stats *funcs;
    void *next;
    int num_funcs, runs, samples, num_allocs;
};
struct halide_profiler_state {
    uintptr_t lock;
    struct halide_profiler_pipeline_stats *pipelines;
};
struct halide_profiler_state *halide_profiler_get_state(void);
void halide_profiler_reset(void);
"""


def profiled_calls(library, name, calls, threads, scalars, shape):
    """``calls`` calls of the profiled pipeline ``name`` over ``threads`` threads, then
    Halide's profiler state for it: the pipeline's and each Func's figures."""
    lib = Library(library, [name], PROFILER)
    ffi = lib.ffi
    function = getattr(lib.lib, f"{name}_argv")
    argvs = []
    for i in range(calls):
        out = np.zeros(shape, np.int32)
        argvs.append((lib.argv(name, {**scalars, "escape": out}), out))
    results = [None] * calls

    def worker(k):
        for i in range(k, calls, threads):
            results[i] = function(argvs[i][0])

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stats = lib.lib.halide_profiler_get_state().pipelines
    while ffi.string(stats.name).decode() != name:  # (Halide's lookup by name compares pointers)
        stats = ffi.cast("struct halide_profiler_pipeline_stats *", stats.next)
    funcs = {}
    for f in range(stats.num_funcs):
        s = stats.funcs[f]
        funcs[ffi.string(s.name).decode()] = {
            "memory_peak": s.memory_peak, "memory_total": s.memory_total,
            "stack_peak": s.stack_peak, "num_allocs": s.num_allocs}
    answer = {"results": results, "runs": stats.runs, "num_allocs": stats.num_allocs,
              "memory_total": stats.memory_total, "memory_peak": stats.memory_peak,
              "funcs": funcs, "escape": argvs[0][1]}
    lib.lib.halide_profiler_reset()  # (nothing left to report at exit)
    return answer


def cl_extern(library, name, loader, values):
    """A pipeline with an OpenCL extern stage (externs_opencl.c), its OpenCL bound first."""
    lib = Library(library, [name], "int flv_cl_use(const char *); int flv_cl_launches(void);")
    assert lib.lib.flv_cl_use(loader.encode()) == 0
    result = lib.call(name, values)
    return {"result": result, "errors": lib.errors, "launches": lib.lib.flv_cl_launches(),
            "outputs": {k: v for k, v in values.items() if isinstance(v, np.ndarray)}}


def buffer_copies(library, steps):
    """halide_buffer_copy between host and OpenCL buffers, as test_build_flavors_opencl.py's
    COPIES describes: each step copies a crop of ``src`` (on the device first, its host
    memory damaged, where the step says) into ``dst`` (mins moved where it says; allocated on
    the device first where it says) to the host or the device. Per step: the copy's result,
    dst's flags right after it, and dst's contents (brought to the host)."""
    lib = Library(library)
    ffi = lib.ffi
    opencl = lib.lib.halide_opencl_device_interface()
    answers = []
    for step in steps:
        src_array = np.array(step["src"])
        src = lib.buffer(src_array)
        src = _cropped(lib, src, step["crop"])
        if step["src_on_device"]:
            assert lib.lib.halide_copy_to_device(ffi.NULL, src, opencl) == 0
            view = _view(src_array, step["crop"])
            view[...] = 0  # damaged: only the device has the data now
            src.flags = 2  # device-dirty
        dst_array = np.full(step["dst_shape"], -1, src_array.dtype)
        dst = lib.buffer(dst_array, host_dirty=False)
        for d, lo in enumerate(step["dst_mins"]):
            dst.dim[d].min = lo
        if step["dst_on_device"] == "allocated":
            assert lib.lib.halide_device_malloc(ffi.NULL, dst, opencl) == 0
        result = lib.lib.halide_buffer_copy(ffi.NULL, src, opencl if step["to_device"] else ffi.NULL,
                                            dst)
        flags = int(dst.flags)
        if result == 0 and dst.device:
            dst.flags |= 2
            assert lib.lib.halide_copy_to_host(ffi.NULL, dst) == 0
        answers.append({"result": result, "dst": dst_array.copy(), "errors": list(lib.errors),
                        "dst_flags": flags})
        for raw in (src, dst):
            if raw.device:
                lib.lib.halide_device_free(ffi.NULL, raw)
    return answers


def _cropped(lib, raw, crop):
    """A crop of ``raw`` ((min, extent) per dimension, Halide's coordinates): a new struct over
    the same host memory."""
    ffi = lib.ffi
    dim = ffi.new("halide_dimension_t[]", raw.dimensions)
    offset = 0
    for d, (lo, extent) in enumerate(crop):
        dim[d] = raw.dim[d]
        offset += (lo - raw.dim[d].min) * raw.dim[d].stride
        dim[d].min, dim[d].extent = lo, extent
    out = ffi.new("halide_buffer_t *")
    out.host = raw.host + offset * (raw.type.bits // 8)
    out.type, out.dimensions, out.dim, out.flags = raw.type, raw.dimensions, dim, raw.flags
    lib.keep += [dim, out]
    return out


def _view(array, crop):
    """The numpy view of a crop (Halide order, mins from 0)."""
    return array[tuple(slice(lo, lo + extent) for lo, extent in reversed(crop))]


def gpu_chains(library, rounds, threads, shape):
    """Each of ``threads`` threads runs add -> mul -> add ``rounds`` times on buffers of its
    own that stay on the device between the pipelines, each with its own user_context; what
    each thread's last result is. (Halide's halide_device_release would release the context
    under the other threads' buffers: not called here.)"""
    lib = Library(library, ["flv_gpu_add", "flv_gpu_mul"])
    ffi = lib.ffi
    contexts = ffi.new("int[]", threads)
    out = {}

    def worker(k):
        a = np.zeros(shape, np.int32)
        b = np.zeros(shape, np.int32)
        ba, bb = lib.buffer(a), lib.buffer(b, host_dirty=False)
        uc = contexts + k
        add = lib.lib.flv_gpu_add_argv
        mul = lib.lib.flv_gpu_mul_argv
        keep = []
        for r in range(rounds):
            for function, src, dst in ((add, ba, bb), (mul, bb, ba), (add, ba, bb)):
                slot = ffi.new("void **", uc)
                keep.append(slot)
                assert function(ffi.new("void *[]", [slot, src, dst])) == 0
        assert lib.lib.halide_copy_to_host(ffi.NULL, bb) == 0
        out[k] = b.copy()
        for raw in (ba, bb):
            lib.lib.halide_device_free(ffi.NULL, raw)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return out


def main(requests_path: str, answers_path: str) -> int:
    requests = pickle.loads(Path(requests_path).read_bytes())
    answers = []
    for case, kwargs in requests:
        try:
            answers.append(globals()[case](**kwargs))
        except Exception as e:  # noqa: BLE001 - the test reports it
            import traceback

            answers.append({"stock_failure": traceback.format_exc()})
    Path(answers_path).write_bytes(pickle.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
