"""The pipeline from Halide issue 8395 (realizing into a crop on the GPU):
f(x, y) = x * 100 + y + param * 10000, in int32."""

import halide as hl

from ._schedule import gpu_tile_2d

x, y = hl.vars("x y")


@hl.generator(name="crop_fill")
class CropFill:
    param = hl.InputScalar(hl.Int(32))
    f = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        self.f[x, y] = x * 100 + y + self.param * 10000
        if self.target().has_gpu_feature():
            gpu_tile_2d(self.f, x, y, 4)


if __name__ == "__main__":
    hl.main()
