"""A pipeline that does almost nothing: output(x, y) = input(x, y) * k, float32, with no
schedule on the CPU, for measuring the fixed cost of a call (benchmarks/call_cost.py compares
it with the same definition JIT-compiled by Halide's own Python bindings)."""

import halide as hl

from ._schedule import gpu_tile_2d

x, y = hl.vars("x y")


@hl.generator(name="times_k")
class TimesK:
    input = hl.InputBuffer(hl.Float(32), 2)
    k = hl.InputScalar(hl.Float(32))
    output = hl.OutputBuffer(hl.Float(32), 2)

    def generate(self):
        self.output[x, y] = self.input[x, y] * self.k
        if self.target().has_gpu_feature():
            gpu_tile_2d(self.output, x, y)


if __name__ == "__main__":
    hl.main()
