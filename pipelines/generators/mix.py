"""Two inputs of different types and two scalars with defaults and ranges:
output = a * alpha + b * (1 - alpha) + offset."""

import halide as hl

from ._schedule import cpu_rows, gpu_tile_2d, scalar_default

x, y = hl.vars("x y")


@hl.generator(name="mix")
class Mix:
    a = hl.InputBuffer(hl.UInt(8), 2)
    b = hl.InputBuffer(hl.Float(32), 2)
    alpha = hl.InputScalar(hl.Float(32))
    offset = hl.InputScalar(hl.Int(16))
    output = hl.OutputBuffer(hl.Float(32), 2)

    def generate(self):
        scalar_default(self.alpha, 0.5, 0.0, 1.0)
        scalar_default(self.offset, 0, -1000, 1000)
        self.output[x, y] = (hl.cast(hl.Float(32), self.a[x, y]) * self.alpha
                             + self.b[x, y] * (1.0 - self.alpha)
                             + hl.cast(hl.Float(32), self.offset))
        if self.target().has_gpu_feature():
            gpu_tile_2d(self.output, x, y)
        else:
            cpu_rows(self.output, x, y)


if __name__ == "__main__":
    hl.main()
