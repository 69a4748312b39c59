"""The test pipelines of shim.dask's tests, compiled with Halide from the test process:
stencils whose footprints the sample pipelines do not have (asymmetric, clamped at the edges,
reaching far, several inputs of different sizes)."""

import subprocess
from pathlib import Path

def compile_pipeline(hl, name: str, target: str, work: Path) -> str:
    """The path of the library of test pipeline ``name`` (MAKERS) for ``target``
    ("host", or a GPU feature such as "opencl"), built into ``work``."""
    func, args = MAKERS[name](hl, gpu=target != "host")
    stem = work / f"{name}-{target}"
    halide_target = hl.Target("host" if target == "host" else f"host-{target}-no_runtime")
    func.compile_to({hl.OutputFileType.object: f"{stem}.o"}, args, name, halide_target)
    subprocess.run(["cc", "-shared", "-o", f"{stem}.so", f"{stem}.o", "-lpthread", "-ldl"],
                   check=True)
    return f"{stem}.so"


def _edge_blur(hl, gpu):
    """A 5x5 box blur of uint16 with a repeat_edge boundary."""
    x, y = hl.Var("x"), hl.Var("y")
    src = hl.ImageParam(hl.UInt(16), 2, "src")
    edge = hl.BoundaryConditions.repeat_edge(src)
    r = hl.RDom([(-2, 5), (-2, 5)])
    out = hl.Func("edge_blur")
    out[x, y] = hl.cast(hl.UInt(16), hl.sum(hl.cast(hl.Int(32), edge[x + r.x, y + r.y])) / 25)
    if gpu:
        xo, yo, xi, yi = hl.vars("xo yo xi yi")
        out.gpu_tile(x, y, xo, yo, xi, yi, 8, 8, hl.TailStrategy.GuardWithIf)
    return out, [src]


def _footprint(hl, gpu):
    """Reads its input 17 to the right and 5 up, and a two-level pyramid of it: a large,
    asymmetric footprint, repeat_edge too."""
    x, y, i32 = hl.Var("x"), hl.Var("y"), hl.Int(32)
    src = hl.ImageParam(hl.UInt(16), 2, "src")
    edge = hl.BoundaryConditions.repeat_edge(src)
    down1, down2, out = hl.Func("down1"), hl.Func("down2"), hl.Func("footprint")
    down1[x, y] = (hl.cast(i32, edge[2 * x, 2 * y]) + edge[2 * x + 1, 2 * y + 1]) // 2
    down2[x, y] = (down1[2 * x, 2 * y] + down1[2 * x + 1, 2 * y]) // 2
    out[x, y] = edge[x + 17, y - 5] * 3 + down2[x // 4 + 3, y // 4 - 2]
    down1.compute_root()
    down2.compute_root()
    return out, [src]


def _shifted(hl, gpu):
    """Reads 3 left of x, no boundary."""
    x, y = hl.Var("x"), hl.Var("y")
    src = hl.ImageParam(hl.UInt(16), 2, "src")
    out = hl.Func("shifted")
    out[x, y] = src[x - 3, y]
    return out, [src]


def _two(hl, gpu):
    """Two inputs, each read with its own offsets."""
    x, y = hl.Var("x"), hl.Var("y")
    a, b = hl.ImageParam(hl.UInt(16), 2, "a"), hl.ImageParam(hl.Int(32), 2, "b")
    ea, eb = hl.BoundaryConditions.repeat_edge(a), hl.BoundaryConditions.repeat_edge(b)
    out = hl.Func("two")
    out[x, y] = ea[x - 7, y + 2] + eb[x + 1, y - 11] * 2
    return out, [a, b]


def _weighted(hl, gpu):
    """A 2-D uint16 image times a 1-D uint16 weight per column (x)."""
    x, y = hl.Var("x"), hl.Var("y")
    src, weights = hl.ImageParam(hl.UInt(16), 2, "src"), hl.ImageParam(hl.UInt(16), 1, "weights")
    out = hl.Func("weighted")
    out[x, y] = src[x, y] * weights[x]
    return out, [src, weights]


MAKERS = {"edge_blur": _edge_blur, "footprint": _footprint, "shifted": _shifted, "two": _two,
          "weighted": _weighted}
