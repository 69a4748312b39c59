"""Pipelines compiled here, outside the project's build tool, the way a user would: a Python
generator through Halide's generator command line, and a Func compiled directly."""

import subprocess
import sys
import textwrap

import halide as hl
import numpy as np
import pytest

import shim

GENERATOR = textwrap.dedent('''
    import halide as hl

    x, y, c = hl.vars("x y c")

    @hl.generator(name="planar_levels")
    class PlanarLevels:
        image = hl.InputBuffer(hl.UInt(8), 3)
        gain = hl.InputScalar(hl.Int(32))
        levels = hl.OutputBuffer(hl.Int(16), 3)

        def generate(self):
            value = hl.cast(hl.Int(16), self.image[x, y, c]) * hl.cast(hl.Int(16), self.gain)
            self.levels[x, y, c] = value - hl.cast(hl.Int(16), c)
            self.levels.reorder(x, y, c).parallel(c).vectorize(x, 16, hl.TailStrategy.GuardWithIf)

    if __name__ == "__main__":
        hl.main()
''')


def link(obj, library):
    subprocess.run(["cc", "-shared", "-o", str(library), str(obj), "-lpthread", "-ldl"], check=True)


@pytest.fixture(scope="module", params=["bundled", "no_runtime"])
def generator_library(request, tmp_path_factory):
    work = tmp_path_factory.mktemp("external")
    (work / "planar_levels_gen.py").write_text(GENERATOR)
    target = "host-no_runtime" if request.param == "no_runtime" else "host"
    subprocess.run([sys.executable, str(work / "planar_levels_gen.py"), "-g", "planar_levels",
                    "-o", str(work), "-e", "object", f"target={target}"], check=True)
    link(work / "planar_levels.o", work / "planar_levels.so")
    return work / "planar_levels.so"


def test_generator_built_outside_the_project(generator_library):
    pipeline = shim.load(generator_library)
    assert [a.name for a in pipeline.arguments] == ["image", "gain", "levels"]
    image = np.random.default_rng(5).integers(0, 256, size=(3, 21, 37), dtype=np.uint8)
    levels = pipeline(image, gain=3, levels=image.shape)
    planes = np.arange(3, dtype=np.int16)[:, None, None]
    np.testing.assert_array_equal(levels.numpy(), image.astype(np.int16) * 3 - planes)


@pytest.mark.parametrize("runtime", ["bundled", "no_runtime"])
def test_func_compiled_directly_with_compile_to(tmp_path, runtime):
    x, y = hl.Var("x"), hl.Var("y")
    source = hl.ImageParam(hl.Float(64), 2, "source")
    power = hl.Param(hl.UInt(8), "power")
    result = hl.Func("result")
    result[x, y] = hl.pow(source[x, y], hl.cast(hl.Float(64), power)) + hl.cast(hl.Float(64), x)
    target = hl.Target("host-no_runtime" if runtime == "no_runtime" else "host")
    obj = tmp_path / "powers.o"
    result.compile_to({hl.OutputFileType.object: str(obj)}, [source, power], "powers", target)
    link(obj, tmp_path / "powers.so")

    powers = shim.load(tmp_path / "powers.so")
    values = np.linspace(0.5, 2.0, 24).reshape(4, 6)
    out = powers(values, 3, (4, 6))
    np.testing.assert_allclose(out.numpy(), values ** 3 + np.arange(6), rtol=1e-12)
