"""Schedule helpers shared by the generators."""

import halide as hl


def gpu_tile_2d(func, x, y, size=16):
    """Map a 2-D loop nest onto GPU blocks and threads. GuardWithIf keeps outputs smaller than
    a tile (crops, tiny test images) in bounds."""
    xo, yo, xi, yi = hl.Var(f"{x.name()}o"), hl.Var(f"{y.name()}o"), hl.Var(f"{x.name()}i"), hl.Var(f"{y.name()}i")
    return func.gpu_tile(x, y, xo, yo, xi, yi, size, size, hl.TailStrategy.GuardWithIf)


def cpu_rows(func, x, y, vector=8):
    """Rows in parallel, x vectorized; the tail is guarded so any width works."""
    return func.parallel(y).vectorize(x, vector, hl.TailStrategy.GuardWithIf)


def scalar_default(param, value, lo=None, hi=None):
    """Give a generator's scalar input a default and optional range, as C++'s
    Input<T>{name, def, min, max} does; they appear in the pipeline's metadata."""
    t = param.type()
    param.parameter().set_default_value(hl.cast(t, value))
    if lo is not None and hi is not None:
        param.set_range(hl.cast(t, lo), hl.cast(t, hi))
