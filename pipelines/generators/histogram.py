"""A reduction: the 256-bin histogram of an 8-bit image. The output must be exactly 256 bins."""

import halide as hl

x = hl.Var("x")


@hl.generator(name="histogram")
class Histogram:
    input = hl.InputBuffer(hl.UInt(8), 2)
    output = hl.OutputBuffer(hl.UInt(32), 1)

    def generate(self):
        r = hl.RDom([(0, self.input.width()), (0, self.input.height())], "r")
        hist = self.output
        hist[x] = hl.u32(0)
        hist[hl.cast(hl.Int(32), self.input[r.x, r.y])] += hl.u32(1)
        hist.output_buffer().dim(0).set_bounds(0, 256)
        self.input.set_estimates([(0, 640), (0, 480)])
        if self.target().has_feature(hl.TargetFeature.Vulkan):
            # Halide 21's Vulkan code generation has no atomics: the bins are cleared in
            # parallel, and the update runs in one GPU thread.
            xo, xi = hl.Var("xo"), hl.Var("xi")
            hist.gpu_tile(x, xo, xi, 64)
            hist.update().gpu_single_thread()
        elif self.target().has_gpu_feature():
            xo, xi = hl.Var("xo"), hl.Var("xi")
            hist.gpu_tile(x, xo, xi, 64)
            rxo, rxi = hl.RVar("rxo"), hl.RVar("rxi")
            hist.update().atomic().split(r.x, rxo, rxi, 32, hl.TailStrategy.GuardWithIf) \
                .gpu_blocks(r.y).gpu_threads(rxi)


if __name__ == "__main__":
    hl.main()
