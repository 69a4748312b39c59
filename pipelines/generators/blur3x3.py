"""A 3x3 box blur in two passes; the horizontal pass is a compute_root stage.

The output is 2 pixels smaller than the input in each dimension: output(x, y) averages
input[x .. x+2, y .. y+2], in integer arithmetic (floor division by 3 twice).
"""

import halide as hl

from ._schedule import cpu_rows, gpu_tile_2d

x, y = hl.vars("x y")


@hl.generator(name="blur3x3")
class Blur3x3:
    input = hl.InputBuffer(hl.UInt(16), 2)
    output = hl.OutputBuffer(hl.UInt(16), 2)

    def generate(self):
        inp = self.input
        blur_x = hl.Func("blur_x")
        wide = hl.UInt(32)
        blur_x[x, y] = hl.cast(hl.UInt(16), (hl.cast(wide, inp[x, y]) + inp[x + 1, y] + inp[x + 2, y]) / 3)
        self.output[x, y] = hl.cast(
            hl.UInt(16), (hl.cast(wide, blur_x[x, y]) + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3)
        self.input.set_estimates([(0, 642), (0, 482)])
        self.output.set_estimates([(0, 640), (0, 480)])
        blur_x.compute_root()
        if self.target().has_gpu_feature():
            gpu_tile_2d(blur_x, x, y)
            gpu_tile_2d(self.output, x, y)
        else:
            cpu_rows(blur_x, x, y)
            cpu_rows(self.output, x, y)


if __name__ == "__main__":
    hl.main()
