"""Async pipelines that overlap GPU work with CPU work, written the way Halide's own
test/correctness/async_device_copy.cpp does (an async stage that is a device copy), so that
device calls come from Halide's worker threads while other stages run:

- async_gpu_to_cpu: frames computed on the GPU; each frame copied to the host by an async,
  double-buffered copy stage (frames.in().copy_to_host()) while the CPU sums the previous one;
- async_cpu_to_gpu: frames computed on the CPU by an async, double-buffered stage, copied to
  the device (copy_to_device()) and summed there.

frames(x, y, t) = input(x, y) * (t + 1); output(x, y) = sum over t in [0, FRAMES) of frames.
Built for a target without a GPU, both compute on the CPU with the same async stage.
"""

import halide as hl

from ._schedule import gpu_tile_2d

GENERATOR_NAMES = ["async_gpu_to_cpu", "async_cpu_to_gpu"]
FRAMES = 16

x, y, t = hl.vars("x y t")


def _define(generator):
    frames = hl.Func("frames")
    frames[x, y, t] = generator.input[x, y] * (t + 1)
    r = hl.RDom([(0, FRAMES)], "r")
    total = generator.output
    total[x, y] = 0
    total[x, y] += frames[x, y, r]
    generator.input.set_estimates([(0, 256), (0, 256)])
    generator.output.set_estimates([(0, 256), (0, 256)])
    return frames, r


@hl.generator(name="async_gpu_to_cpu")
class AsyncGpuToCpu:
    input = hl.InputBuffer(hl.Int(32), 2)
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        frames, r = _define(self)
        self.output.update().reorder(x, y, r.x).vectorize(x, 8, hl.TailStrategy.GuardWithIf)
        copy = frames.in_().store_root().compute_at(self.output, r.x).fold_storage(t, 2).async_()
        if self.target().has_gpu_feature():
            frames.store_root().compute_at(frames.in_(), hl.Var.outermost())
            gpu_tile_2d(frames, x, y)
            copy.copy_to_host()
        else:
            frames.store_root().compute_at(frames.in_(), hl.Var.outermost())


@hl.generator(name="async_cpu_to_gpu")
class AsyncCpuToGpu:
    input = hl.InputBuffer(hl.Int(32), 2)
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        frames, r = _define(self)
        frames.store_root().compute_at(self.output, r.x).fold_storage(t, 2).async_().parallel(y)
        copy = frames.in_().store_root().compute_at(self.output, r.x)
        if self.target().has_gpu_feature():
            gpu_tile_2d(self.output, x, y)
            xo, yo, xi, yi = hl.vars("xo yo xi yi")
            self.output.update().reorder(x, y, r.x).gpu_tile(x, y, xo, yo, xi, yi, 16, 16,
                                                             hl.TailStrategy.GuardWithIf)
            copy.copy_to_device()
        else:
            self.output.update().reorder(x, y, r.x).vectorize(x, 8, hl.TailStrategy.GuardWithIf)


if __name__ == "__main__":
    hl.main()
