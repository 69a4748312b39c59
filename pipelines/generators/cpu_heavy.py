"""A CPU-bound pipeline with no parallel loop: each call keeps one core busy, so throughput
across several calling threads shows whether the runtime lets them run at once.
output(x, y): v = input(x, y), then for r in [0, rounds): v = sin(v) * 0.9 + input(x, y) + 0.001 r;
vectorized.

Built for a GPU target it still computes on the CPU, and its generated code calls
halide_copy_to_host on the input: with the input already on the device and clean, that is
the no-op copy every call makes (the case of Halide issue 8586).
"""

import halide as hl

from ._schedule import scalar_default

x, y = hl.vars("x y")


@hl.generator(name="cpu_heavy")
class CpuHeavy:
    input = hl.InputBuffer(hl.Float(32), 2)
    rounds = hl.InputScalar(hl.Int(32))
    output = hl.OutputBuffer(hl.Float(32), 2)

    def generate(self):
        scalar_default(self.rounds, 32, 0, 10000)
        step = hl.Func("step")
        r = hl.RDom([(0, self.rounds)], "r")
        step[x, y] = self.input[x, y]
        step[x, y] = hl.sin(step[x, y]) * hl.f32(0.9) + self.input[x, y] + hl.f32(0.001) * r.x
        step.update().reorder(x, r.x).vectorize(x, 8, hl.TailStrategy.GuardWithIf)
        self.output[x, y] = step[x, y]
        step.compute_at(self.output, y).vectorize(x, 8, hl.TailStrategy.GuardWithIf)
        self.output.vectorize(x, 8, hl.TailStrategy.GuardWithIf)


if __name__ == "__main__":
    hl.main()
