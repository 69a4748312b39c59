"""Crops at offsets on OpenCL and Vulkan: a call writing a crop of a parent already on the
device against the same call writing a whole buffer of the crop's size, side by side in one run
(issue 41).

    python benchmarks/crop_offsets.py [--backend opencl|vulkan] [--repeats R] [--quick]
                                      [--sizes small,large]

The parent goes to the device before it is cropped, so its allocation is placed for the parent,
not for the crop: a crop at x (y = 0) starts 4x bytes into it, which OpenCL gives a sub-buffer
only at multiples of the device's CL_DEVICE_MEM_BASE_ADDR_ALIGN / 8, and Vulkan binds at a
descriptor offset only at multiples of minStorageBufferOffsetAlignment (the last offset of each
kernel, "aligned"). The crops' mins are set to 0, so that every call reads the same input. Sizes: small
64x64, large 1024 wide by 1000 high (Halide order: x, y). The parents are wider than the crop by
the largest offset (rounded up to 4 elements), so their rows lie further apart than the whole
buffer's (on OpenCL at the large size 4224 bytes against 4096, a stride the whole buffer's
traffic may pay for). Two kernels:

  - times_k (pipelines/generators/times_k.py: output = input * k, float32, gpu_tile'd 16 x 16),
    a kernel that makes no assumption about its buffers' base (every access indexed by element):
    on OpenCL the shim builds it with an element offset per buffer (native_stubs/backends/
    opencl_prototypes.c), so a crop at any offset is launched in place. Rows: crop / whole,
    prepared and plain call; the issue's target is 1.1x. On Vulkan, Halide 21's kernels take
    no offset (docs/devices.md): a crop at any other offset than "aligned" is staged.
  - doubling, vector casts (tests/support/staging.py: out = zin * 2 + 1, int32, x vectorized by
    4 with the vectors proved aligned, so Halide reads and writes them through int4 pointers;
    none of the sample pipelines has such a kernel): a crop a sub-buffer cannot take is staged
    around each launch, its span copied into a staging buffer and its elements copied back
    (native_stubs/backends/opencl.c, vulkan_kernels.c). On Vulkan this kernel's buffers are
    runtime arrays of int4 in its SPIR-V.

Every staged crop's row is also compared with the whole call followed by the two copies its
staging needs, between buffers of the same sizes, timed in the same loop: on OpenCL enqueued on
the shim's queue through pyopencl (one clEnqueueCopyBuffer of the span, one
clEnqueueCopyBufferRect of the rows); on Vulkan through the backend's device-to-device copy
(each its own submission; on a device whose memory the host maps, lavapipe's, a memcpy after
the queue drains).

Each sample is a loop of calls back to back with one device sync at the end; each figure is the
min (and median) over samples of us per call; the cases take turns sample by sample. Every
output is checked against numpy, and on OpenCL every crop's launches (profiled once: staged or
not, as the row says; a Vulkan launch's profile record does not say).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sidebyside import interleave

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from pipelines.build import Build, build  # noqa: E402

K = 3.0
# (height, width), numpy order; widths multiples of 16 and heights of 4, as the vector kernel's
# outputs must be.
SIZES = {"small": (64, 64), "large": (1000, 1024)}
BACKENDS = ("opencl", "vulkan")
ITERATIONS = {"opencl": {"small": 200, "large": 10},  # calls per sample
              "vulkan": {"small": 50, "large": 3}}
# The crops' x in their parents, in elements; "aligned": the device's base address alignment.
TIMES_K_OFFSETS = (1, 3, 17, "aligned")
VECTOR_OFFSETS = (1, 17, "aligned")
TARGET = 1.1


@dataclass(frozen=True)
class Case:
    kernel: str    # "times_k" or "vector"
    size: str
    x: int | str | None  # the crop's x in its parent (see TIMES_K_OFFSETS); None: whole
    mode: str      # "prepared", "plain", or "copies" (the whole call and the staging copies)

    @property
    def key(self) -> str:
        where = "whole" if self.x is None else f"x{self.x}"
        return f"{self.kernel}.{self.size}.{where}.{self.mode}"


def stages(backend: str, case: Case) -> bool:
    """Whether the case's crop is staged around each launch."""
    return case.x not in (None, "aligned") and (backend == "vulkan" or case.kernel == "vector")


def cases_of(backend: str) -> list[Case]:
    return [case for size in SIZES for case in [
        *(Case("times_k", size, x, mode) for x in (None, *TIMES_K_OFFSETS)
          for mode in ("prepared", "plain")),
        Case("vector", size, None, "prepared"),
        *(Case("vector", size, x, "prepared") for x in VECTOR_OFFSETS),
        *(Case(kernel, size, x, "copies") for kernel, offsets in
          (("times_k", TIMES_K_OFFSETS), ("vector", VECTOR_OFFSETS)) for x in offsets
          if stages(backend, Case(kernel, size, x, "prepared"))),
    ]]


def timed_loop(call, sync):
    """``loop(n) -> seconds``: ``call()`` n times, then ``sync()``; after one untimed call and
    sync (the first after another case's finds the caches and the device's threads busy with
    that case's data: whichever case came first after a size change paid up to 1.3x)."""
    def loop(n):
        call()
        sync()
        start = time.perf_counter()
        for _ in range(n):
            call()
        sync()
        return time.perf_counter() - start

    return loop


class Bench:
    """Every case of ``cases_of(backend)`` of the sizes asked for, by key: ``seconds(key,
    iterations)``. Raises shim.DeviceUnavailable where there is no such device."""

    def __init__(self, backend: str = "opencl", sizes=tuple(SIZES)):
        import shim
        from support.staging import build_doubling

        self.shim, self.backend = shim, backend
        self.device = device = shim.device(backend)
        self.alignment = device.alignment  # bytes
        self.aligned_x = max(self.alignment // 4, 1)  # (both kernels' elements are 4 bytes)
        # The parents' width past the crop's: room for the largest offset, in whole multiples
        # of 4 elements (the vector kernel's rows must be).
        largest = max(x for x in (*TIMES_K_OFFSETS, *VECTOR_OFFSETS, self.aligned_x) if x != "aligned")
        self.margin = -(-largest // 4) * 4
        self.loops, self.cases = {}, []
        self.checks = []        # (key, produce the result, expected)
        self.staged = {}        # key: staged buffers per launch, from one profiled call
        self.buffers = []       # device Buffers to free at close, crops first
        self.cl_buffers = []    # the staging copies' pyopencl buffers
        self.pipelines = {"times_k": shim.load(build(Build("times_k", backend, "no_runtime")))}
        folder = ROOT / "build" / "benchmarks" / "crop_offsets"
        folder.mkdir(parents=True, exist_ok=True)
        self.pipelines["vector"] = shim.load(build_doubling(folder, 2, backend, vector_casts=True))
        self.inputs, self.wholes = {}, {}
        for case in cases_of(backend):
            if case.size in sizes:
                self._add(case)

    def x_of(self, case: Case) -> int:
        """The crop's x in elements."""
        return self.aligned_x if case.x == "aligned" else case.x

    def _resident(self, array):
        buf = self.shim.Buffer(array)
        buf.copy_to_device(self.device)
        self.buffers.append(buf)
        return buf

    def _input(self, kernel: str, size: str):
        """The input of every case of a kernel and size, on the device, and the output numpy
        computes from it."""
        if (kernel, size) not in self.inputs:
            h, w = SIZES[size]
            if kernel == "times_k":
                data = np.random.default_rng(0).random((h, w), dtype=np.float32)
                expected = data * np.float32(K)
            else:
                data = np.arange(h * w, dtype=np.int32).reshape(h, w) % 1000
                expected = data * 2 + 1
            self.inputs[kernel, size] = (self._resident(data), expected)
        return self.inputs[kernel, size]

    def _call(self, case: Case, source, out):
        p = self.pipelines[case.kernel]
        if case.kernel == "vector":
            return p.prepare(source, out)
        if case.mode == "prepared":
            return p.prepare(source, k=K, output=out)
        return lambda: p(source, k=K, output=out)

    def _add(self, case: Case) -> None:
        h, w = SIZES[case.size]
        source, expected = self._input(case.kernel, case.size)
        dtype = np.float32 if case.kernel == "times_k" else np.int32
        if case.mode == "copies":
            call = self._whole_and_copies(case)
            whole = self.wholes[case.kernel, case.size, "prepared"]
            check = lambda: np.asarray(whole)  # noqa: E731
        elif case.x is None:
            out = self.wholes[case.kernel, case.size, case.mode] = self._resident(np.zeros((h, w), dtype))
            call = self._call(case, source, out)
            check = lambda: np.asarray(out)  # noqa: E731
        else:
            x = self.x_of(case)
            parent = self._resident(np.zeros((h, w + self.margin), dtype))
            out = parent.cropped([(x, w), (0, h)])  # of a parent on the device: placed for it
            out.set_min([0, 0])  # (every case reads the same input)
            self.buffers.insert(0, out)
            call = self._call(case, source, out)
            check = lambda: np.asarray(parent)[:, x:x + w]  # noqa: E731
            if self.backend == "opencl":
                with self.shim.profile() as profile:
                    call()
                    self.device.sync()
                self.staged[case.key] = [r.launch["staged"] for r in profile.records
                                         if r.kind == "launch"]
        self.loops[case.key] = timed_loop(call, self.device.sync)
        self.cases.append(case)
        self.checks.append((case.key, check, expected))

    def _whole_and_copies(self, case: Case):
        """The whole call, then the copies a staged crop at ``case.x`` needs, on buffers of its
        sizes: its span (rows of the parent's stride, the last one the crop's width) in, its
        rows back."""
        h, w = SIZES[case.size]
        x = self.x_of(case)
        stride = (w + self.margin) * 4
        span = (h - 1) * stride + w * 4
        run_whole = self._call(Case(case.kernel, case.size, None, "prepared"), *(
            self.inputs[case.kernel, case.size][0], self.wholes[case.kernel, case.size, "prepared"]))
        if self.backend == "opencl":
            import pyopencl as cl

            queue, context = self.device.queue, self.device.context
            parent, staging = (cl.Buffer(context, cl.mem_flags.READ_WRITE, n) for n in (h * stride, span))
            self.cl_buffers += [parent, staging]

            def copies():
                cl.enqueue_copy(queue, staging, parent, byte_count=span, src_offset=4 * x)
                cl.enqueue_copy(queue, parent, staging, src_origin=(0, 0, 0),
                                dst_origin=(4 * x, 0, 0), region=(w * 4, h, 1),
                                src_pitches=(stride, 0), dst_pitches=(stride, 0))
        else:
            from shim.memory.families import family_of
            from shim.native.regions import CopyPlan

            parent, staging = (family_of(self._resident(np.zeros(n, np.uint8)).raw).memory
                               for n in (h * stride, span))
            span_in = CopyPlan((span,), (), (), src_offset=4 * x)
            rows_back = CopyPlan((h, w * 4), (stride,), (stride,), dst_offset=4 * x)

            def copies():
                self.device.copy(parent, staging, span_in)
                self.device.copy(staging, parent, rows_back)

        def call():
            run_whole()
            copies()
        return call

    def seconds(self, key: str, iterations: int) -> float:
        return self.loops[key](iterations)

    def check(self) -> list[str]:
        """Every case run once, its output compared with numpy's, and its launches with what
        the kernel allows (times_k: nothing staged; vector: staged unless aligned): the
        failures."""
        failures = []
        for loop in self.loops.values():
            loop(1)
        for key, result, expected in self.checks:
            got = np.asarray(result())
            if not np.array_equal(got, expected):
                failures.append(f"{key}: got {got.ravel()[:4]}..., expected {expected.ravel()[:4]}...")
        for case in self.cases:
            if case.key in self.staged:
                counts = self.staged[case.key]
                want_staged = stages(self.backend, case)
                if not counts or any((n > 0) != want_staged for n in counts):
                    failures.append(f"{case.key}: staged buffers per launch {counts}, expected "
                                    f"{'some' if want_staged else 'none'}")
        return failures

    def close(self) -> None:
        for buf in self.buffers:
            buf.device_free()
        self.buffers.clear()
        for mem in self.cl_buffers:
            mem.release()
        self.cl_buffers.clear()


def measure(bench: Bench, repeats: int, scale: float = 1.0) -> dict:
    """{key: {"min": us, "median": us}} over ``repeats`` samples taken in turns."""
    iterations = ITERATIONS[bench.backend]
    requests = {case.key: {"key": case.key, "iterations": max(1, int(iterations[case.size] * scale))}
                for case in bench.cases}
    results = interleave({"all": bench}, requests, repeats, per_sample=lambda r: r["iterations"])["all"]
    return {key: {stat: 1e6 * v for stat, v in r.items()} for key, r in results.items()}


def rows(bench: Bench, results: dict) -> list[dict]:
    """One row per crop case: its figures, its reference's, the ratios, the target."""
    out = []
    for case in bench.cases:
        if case.x is None or case.mode == "copies":
            continue
        ours = results[case.key]
        references = [("whole", Case(case.kernel, case.size, None, case.mode))]
        if stages(bench.backend, case) and case.mode == "prepared":  # (as the copies' whole call)
            references.append(("whole + copies", Case(case.kernel, case.size, case.x, "copies")))
        for name, ref in references:
            theirs = results[ref.key]
            out.append({
                "kernel": case.kernel, "size": case.size, "x": bench.x_of(case), "mode": case.mode,
                "bytes": 4 * bench.x_of(case), "how": "staged" if stages(bench.backend, case) else
                ("bound at it" if case.x == "aligned" else "in place"),
                "reference": name, "crop": ours, "ref": theirs,
                "ratio": ours["min"] / theirs["min"], "median": ours["median"] / theirs["median"],
                "target": None if stages(bench.backend, case) else TARGET,
            })
    return out


def report(table: list[dict]) -> str:
    lines = [f"{'kernel':<9}{'size':<7}{'x':>4}{'bytes':>7}  {'launched':<13}{'call':<10}"
             f"{'reference':<16}{'crop us':>10}{'ref us':>10}{'ratio':>8}{'median':>8}  target",
             "  (min over samples of us per call; ratio = crop min / reference min; 'median': "
             "ratio of the medians)"]
    for r in table:
        target = "" if r["target"] is None else \
            f"{r['target']:.1f}x {'yes' if r['ratio'] <= r['target'] else 'NO'}"
        lines.append(f"{r['kernel']:<9}{r['size']:<7}{r['x']:>4}{r['bytes']:>7}  {r['how']:<13}"
                     f"{r['mode']:<10}{r['reference']:<16}{r['crop']['min']:>10.2f}"
                     f"{r['ref']['min']:>10.2f}{r['ratio']:>7.2f}x{r['median']:>7.2f}x  {target}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="opencl", help="(default opencl)")
    parser.add_argument("--repeats", type=int, help="samples per case (default 30, --quick 3)")
    parser.add_argument("--quick", action="store_true", help="few samples of few calls")
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help=f"comma-separated, of {', '.join(SIZES)} (default all)")
    args = parser.parse_args(argv)
    sizes = tuple(s for s in args.sizes.split(",") if s)
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)}; expected some of {', '.join(SIZES)}")
    repeats = args.repeats or (3 if args.quick else 30)
    bench = Bench(args.backend, sizes)
    try:
        failures = bench.check()
        results = measure(bench, repeats, scale=0.2 if args.quick else 1.0)
        failures += bench.check()
        table = rows(bench, results)
    finally:
        bench.close()
    print(f"{repeats} samples per case; calls per sample: "
          + ", ".join(f"{s} {ITERATIONS[args.backend][s]}" for s in sizes)
          + (" (x0.2, --quick)" if args.quick else "")
          + f"; {args.backend}, {bench.device.name}; offsets bound in place at multiples of "
          f"{bench.alignment} bytes")
    print(report(table))
    print("outputs checked against numpy" + (", launches against the kernels"
                                            if args.backend == "opencl" else "") + ": "
          + ("ok" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
