"""An elementwise map: output = input * scale + offset."""

import halide as hl

from ._schedule import cpu_rows, gpu_tile_2d, scalar_default

x, y = hl.vars("x y")


@hl.generator(name="brighten")
class Brighten:
    input = hl.InputBuffer(hl.Float(32), 2)
    scale = hl.InputScalar(hl.Float(32))
    offset = hl.InputScalar(hl.Float(32))
    output = hl.OutputBuffer(hl.Float(32), 2)

    def generate(self):
        scalar_default(self.scale, 2.0, 0.0, 10.0)
        scalar_default(self.offset, 1.0)
        self.output[x, y] = self.input[x, y] * self.scale + self.offset
        self.input.set_estimates([(0, 640), (0, 480)])
        self.output.set_estimates([(0, 640), (0, 480)])
        if self.target().has_gpu_feature():
            gpu_tile_2d(self.output, x, y)
        else:
            cpu_rows(self.output, x, y)


if __name__ == "__main__":
    hl.main()
