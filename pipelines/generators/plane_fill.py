"""A planar multi-channel output, for realizing into channel crops (the YCoCg case of Halide
issue 8395): f(x, y, c) = x * 100 + y + c * 10 + param * 10000, in int32."""

import halide as hl

from ._schedule import gpu_tile_2d

x, y, c = hl.vars("x y c")


@hl.generator(name="plane_fill")
class PlaneFill:
    param = hl.InputScalar(hl.Int(32))
    f = hl.OutputBuffer(hl.Int(32), 3)

    def generate(self):
        self.f[x, y, c] = x * 100 + y + c * 10 + self.param * 10000
        if self.target().has_gpu_feature():
            gpu_tile_2d(self.f, x, y, 8)


if __name__ == "__main__":
    hl.main()
