"""Two outputs from one pipeline: sum = a + b and diff = a - b, in int32."""

import halide as hl

from ._schedule import cpu_rows, gpu_tile_2d

x, y = hl.vars("x y")


@hl.generator(name="sum_diff")
class SumDiff:
    a = hl.InputBuffer(hl.Int(32), 2)
    b = hl.InputBuffer(hl.Int(32), 2)
    sum = hl.OutputBuffer(hl.Int(32), 2)
    diff = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        self.sum[x, y] = self.a[x, y] + self.b[x, y]
        self.diff[x, y] = self.a[x, y] - self.b[x, y]
        for out in (self.sum, self.diff):
            if self.target().has_gpu_feature():
                gpu_tile_2d(out, x, y)
            else:
                cpu_rows(out, x, y)


if __name__ == "__main__":
    hl.main()
