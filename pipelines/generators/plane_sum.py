"""Sum of a planar image's channels: output(x, y) = sum over c of input(x, y, c), in int32."""

import halide as hl

from ._schedule import cpu_rows, gpu_tile_2d

x, y = hl.vars("x y")


@hl.generator(name="plane_sum")
class PlaneSum:
    input = hl.InputBuffer(hl.Int(32), 3)
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        channels = self.input.dim(2)
        r = hl.RDom([(channels.min(), channels.extent())], "r")
        self.output[x, y] = hl.sum(self.input[x, y, r.x])
        if self.target().has_gpu_feature():
            gpu_tile_2d(self.output, x, y, 8)
        else:
            cpu_rows(self.output, x, y)


if __name__ == "__main__":
    hl.main()
