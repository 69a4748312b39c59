"""Square roots that refuse negative input, with rows computed in parallel.

The check (``require``) and the optional per-row ``print`` run inside the parallel loop, so
their halide_error and halide_print calls come from Halide's worker threads: the pipeline
exercises how the runtime reports errors and output from threads Python never started.
"""

import halide as hl

from ._schedule import scalar_default

x, y = hl.vars("x y")


@hl.generator(name="checked_sqrt")
class CheckedSqrt:
    input = hl.InputBuffer(hl.Float(32), 2)
    verbose = hl.InputScalar(hl.Bool())
    output = hl.OutputBuffer(hl.Float(32), 2)

    def generate(self):
        scalar_default(self.verbose, False)
        value = self.input[x, y]
        # (This binding of require() takes strings only as Exprs.)
        checked = hl.require(value >= 0.0, hl.sqrt(value),
                             hl.Expr("negative input"), value, hl.Expr("at row"), y)
        self.output[x, y] = hl.print_when(self.verbose & (x == 0), checked, "row", y)
        self.output.parallel(y)


if __name__ == "__main__":
    hl.main()
