"""``python -m shim run`` takes Halide's RunGen command lines: the lines below are copied from
Halide's doc/RunGen.md, apps/support/Makefile.inc and apps/HelloWasm (v21.0.0), run against
pipelines with the signatures those lines were written for (apps/local_laplacian's, as
RunGen.md's --describe shows it, and apps/harris's, whose output starts at (3, 3)), and their
outputs are checked against numpy."""

import shlex
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gpu_cases import blur_reference

hl = pytest.importorskip("halide")
iio = pytest.importorskip("imageio.v3")

GENERATORS = textwrap.dedent('''
    import halide as hl

    x, y, c = hl.vars("x y c")


    @hl.generator(name="local_laplacian")
    class LocalLaplacian:
        """apps/local_laplacian's signature, and a one-pixel stencil along x:
        output = input + alpha * (input - input(x + 1)) / levels + beta."""
        input = hl.InputBuffer(hl.UInt(16), 3)
        levels = hl.InputScalar(hl.Int(32))
        alpha = hl.InputScalar(hl.Float(32))
        beta = hl.InputScalar(hl.Float(32))
        output = hl.OutputBuffer(hl.UInt(16), 3)

        def generate(self):
            value = hl.f32(self.input[x, y, c])
            detail = value - hl.f32(self.input[x + 1, y, c])
            result = value + self.alpha * detail / hl.f32(self.levels) + self.beta
            self.output[x, y, c] = hl.u16(hl.clamp(result, hl.f32(0), hl.f32(65535)))
            self.levels.set_estimate(8)
            self.alpha.set_estimate(1.0)
            self.beta.set_estimate(1.0)
            self.beta.parameter().set_default_value(hl.f32(0.1))
            self.input.set_estimates([(0, 128), (0, 256), (0, 3)])
            self.output.set_estimates([(0, 64), (0, 48), (0, 3)])


    def sum3x3(f):
        return sum((f[x + dx, y + dy] for dx in (-1, 0, 1) for dy in (-1, 0, 1)), hl.f32(0))


    def gradient(gray, along_x):
        """apps/harris's Ix (along_x) or Iy: a Sobel filter divided by 12."""
        total = hl.f32(0)
        for (dx, dy), weight in {(-1, -1): -1, (1, -1): 1, (-1, 0): -2, (1, 0): 2, (-1, 1): -1,
                                 (1, 1): 1}.items():
            if not along_x:
                dx, dy = dy, dx
            total = total + gray[x + dx, y + dy] * hl.f32(weight / 12)
        return total


    @hl.generator(name="harris")
    class Harris:
        """apps/harris's algorithm, with its estimates (the output from (3, 3)) at a test's
        size."""
        input = hl.InputBuffer(hl.Float(32), 3)
        output = hl.OutputBuffer(hl.Float(32), 2)

        def generate(self):
            gray, ix, iy = hl.Func("gray"), hl.Func("Ix"), hl.Func("Iy")
            gray[x, y] = (hl.f32(0.299) * self.input[x, y, 0] + hl.f32(0.587) * self.input[x, y, 1]
                          + hl.f32(0.114) * self.input[x, y, 2])
            ix[x, y] = gradient(gray, True)
            iy[x, y] = gradient(gray, False)
            ixx, iyy, ixy = hl.Func("Ixx"), hl.Func("Iyy"), hl.Func("Ixy")
            ixx[x, y] = ix[x, y] * ix[x, y]
            iyy[x, y] = iy[x, y] * iy[x, y]
            ixy[x, y] = ix[x, y] * iy[x, y]
            sxx, syy, sxy = sum3x3(ixx), sum3x3(iyy), sum3x3(ixy)
            trace = sxx + syy
            self.output[x, y] = sxx * syy - sxy * sxy - hl.f32(0.04) * trace * trace
            self.input.set_estimates([(0, 64), (0, 48), (0, 3)])
            self.output.set_estimates([(3, 58), (3, 42)])
            for f in (gray, ix, iy):
                f.compute_root()


    if __name__ == "__main__":
        hl.main()
''')


@pytest.fixture(scope="module")
def apps(tmp_path_factory):
    """{name: library}: local_laplacian, harris, and both (one library holding the two)."""
    work = tmp_path_factory.mktemp("rungen_apps")
    (work / "apps_gen.py").write_text(GENERATORS)
    for name in ("local_laplacian", "harris"):
        subprocess.run([sys.executable, str(work / "apps_gen.py"), "-g", name, "-f", name,
                        "-o", str(work), "-e", "object", "target=host"], check=True)
    libraries = {"local_laplacian": ["local_laplacian"], "harris": ["harris"],
                 "both": ["local_laplacian", "harris"]}
    for library, objects in libraries.items():
        subprocess.run(["cc", "-shared", "-o", str(work / f"{library}.so"),
                        *[str(work / f"{o}.o") for o in objects], "-lpthread", "-ldl"],
                       check=True)
    return {library: work / f"{library}.so" for library in libraries}


def rungen(library, line: str, **paths):
    """Run ``python -m shim run LIBRARY`` with a RunGen command line, its file names replaced
    as ``paths`` says ({name in the line: path})."""
    for name, path in paths.items():
        line = line.replace(name, str(path))
    done = subprocess.run([sys.executable, "-m", "shim", "run", str(library), *shlex.split(line)],
                          capture_output=True, text=True)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def succeeded(done):
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def local_laplacian(image, levels, alpha, beta, width):
    """The stand-in's output over x in [0, width) from a (c, y, x) uint16 image."""
    value = image.astype(np.float32)
    result = value[:, :, :width] + np.float32(alpha) * (value[:, :, :width] - value[:, :, 1:width + 1]) \
        / np.float32(levels) + np.float32(beta)
    return np.clip(result, 0, 65535).astype(np.uint16)


def assert_close_u16(actual, expected):
    # Halide may fuse the multiply-add: a result at an integer's edge may truncate one lower.
    assert actual.shape == expected.shape
    assert np.abs(actual.astype(np.int32) - expected.astype(np.int32)).max() <= 1


def harris(image, x0, y0, width, height):
    """apps/harris over [x0, x0 + width) x [y0, y0 + height) of a (c, y, x) float image."""
    image = image.astype(np.float32)
    gray = np.float32(0.299) * image[0] + np.float32(0.587) * image[1] + np.float32(0.114) * image[2]

    def at(f, dx, dy, margin):  # f(x + dx, y + dy) over the region grown by margin
        return f[y0 - margin + dy:y0 + height + margin + dy, x0 - margin + dx:x0 + width + margin + dx]

    def sobel(along_x):
        weights = {(-1, -1): -1, (1, -1): 1, (-1, 0): -2, (1, 0): 2, (-1, 1): -1, (1, 1): 1}
        shifted = np.zeros((height + 2, width + 2), np.float32)
        for (dx, dy), w in weights.items():
            if not along_x:
                dx, dy = dy, dx
            shifted += at(gray, dx, dy, 1) * np.float32(w / 12)
        return shifted

    ix, iy = sobel(True), sobel(False)

    def sum3x3(f):
        return sum(f[1 + dy:1 + dy + height, 1 + dx:1 + dx + width]
                   for dx in (-1, 0, 1) for dy in (-1, 0, 1))

    sxx, syy, sxy = sum3x3(ix * ix), sum3x3(iy * iy), sum3x3(ix * iy)
    trace = sxx + syy
    return sxx * syy - sxy * sxy - np.float32(0.04) * trace * trace


def assert_harris_close(actual, expected):
    # det - k trace^2 cancels: errors of float32 sums in another order are relative to the
    # terms' size, not the result's.
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@pytest.fixture
def rgb16(tmp_path):
    """A 16-bit RGB PNG (RunGen.md's rgb_small16.png, at 120 x 210) and its (c, y, x) array."""
    png = pytest.importorskip("png")
    image = np.random.default_rng(16).integers(0, 65536, size=(3, 210, 120), dtype=np.uint16)
    pixels = np.moveaxis(image, 0, 2).reshape(210, 120 * 3)
    with open(tmp_path / "rgb_small16.png", "wb") as f:
        png.Writer(width=120, height=210, greyscale=False, bitdepth=16).write(f, pixels)
    return tmp_path / "rgb_small16.png", image


def read_png16(path):
    png = pytest.importorskip("png")
    width, height, rows, info = png.Reader(filename=str(path)).asDirect()
    pixels = np.vstack([np.asarray(row, np.uint16) for row in rows])
    return np.moveaxis(pixels.reshape(height, width, info["planes"]), 2, 0)


# --- doc/RunGen.md ------------------------------------------------------------------------------

def test_describe_as_in_rungen_md(apps):
    done = succeeded(rungen(apps["local_laplacian"], "--describe"))
    assert done.stdout == textwrap.dedent('''\
        Filter name: "local_laplacian"
          Input "input" is of type Buffer<uint16> with 3 dimensions
          Input "levels" is of type int32
          Input "alpha" is of type float32
          Input "beta" is of type float32
          Output "output" is of type Buffer<uint16> with 3 dimensions
        ''')


def test_a_16_bit_rgb_png_in_and_out(apps, rgb16, tmp_path):
    path, image = rgb16
    line = "input=../images/rgb_small16.png levels=8 alpha=1 beta=1 output=/tmp/out.png"
    succeeded(rungen(apps["local_laplacian"], line, **{"../images/rgb_small16.png": path,
                                                       "/tmp/out.png": tmp_path / "out.png"}))
    written = read_png16(tmp_path / "out.png")
    # As large as the input covers (issue 27): the stand-in reads one column right of what it
    # writes, so 119 of the image's 120 columns; not the estimates' 64 x 48, which fit too.
    assert written.shape == (3, 210, 119)
    assert_close_u16(written, local_laplacian(image, 8, 1, 1, 119))


@pytest.mark.parametrize("suffix", [".tiff", ".tif"])
def test_a_16_bit_rgb_tiff_keeps_its_16_bits(apps, rgb16, tmp_path, suffix):
    # halide_image_io saves uint16 colour to TIFF as it is: no conversion, no warning.
    tifffile = pytest.importorskip("tifffile", reason="TIFF files need tifffile")
    path, image = rgb16
    out = tmp_path / f"out{suffix}"
    done = succeeded(rungen(apps["local_laplacian"], f"input={path} levels=8 alpha=1 beta=1 "
                                                     f"output={out}"))
    assert "data loss" not in done.stderr
    written = tifffile.imread(out)  # (planar, as halide_image_io writes it)
    assert written.dtype == np.uint16 and written.shape == (3, 210, 119)
    assert_close_u16(written, local_laplacian(image, 8, 1, 1, 119))
    # And read back as an input, 16 bits and all.
    again = succeeded(rungen(apps["local_laplacian"], f"input={out} levels=8 alpha=0 beta=0 "
                                                      f"output={tmp_path / 'again.npy'}"))
    assert "data loss" not in again.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "again.npy"), written[:, :, :118])


def test_scalars_from_default_and_estimate(apps, rgb16, tmp_path):
    path, image = rgb16
    line = ("--output_extents=[100,200,3] input=../images/rgb_small16.png levels=8 "
            "alpha=estimate beta=default output=/tmp/out.png")
    succeeded(rungen(apps["local_laplacian"], line, **{"../images/rgb_small16.png": path,
                                                       "/tmp/out.png": tmp_path / "out.png"}))
    assert_close_u16(read_png16(tmp_path / "out.png"),
                     local_laplacian(image, 8, 1.0, 0.1, 100)[:, :200])


def test_info_shows_float32_values_as_float32(apps):
    done = subprocess.run([sys.executable, "-m", "shim", "info", str(apps["local_laplacian"])],
                          capture_output=True, text=True)
    assert "  beta: float32 scalar, default 0.1, estimate 1.0" in done.stdout.splitlines()


def test_an_8_bit_gray_image_is_widened_and_scaled_with_warnings(apps, tmp_path):
    gray = np.random.default_rng(3).integers(0, 256, size=(50, 70), dtype=np.uint8)
    iio.imwrite(tmp_path / "gray.png", gray)
    line = "input=../images/gray.png levels=8 alpha=1 beta=1 output=/tmp/out.png"
    done = succeeded(rungen(apps["local_laplacian"], line, **{
        "../images/gray.png": tmp_path / "gray.png", "/tmp/out.png": tmp_path / "out.npy"}))
    # (RunGen's words)
    assert done.stderr == (
        'Warning: Image for Input "input" has 2 dimensions, but this argument requires at least '
        '3 dimensions: adding dummy dimensions of extent 1.\n'
        'Warning: Image loaded for argument "input" is type uint8 but this argument expects '
        'type uint16; data loss may have occurred.\n')
    result = np.load(tmp_path / "out.npy")
    # Scaled as Halide's loader scales (x 257), so the result is not a black image. One
    # channel, as the input has (the estimates' three are not there), one column less.
    expected = local_laplacian(gray[np.newaxis].astype(np.uint16) * 257, 8, 1, 1, 69)
    assert_close_u16(result, expected)
    assert result.mean() > 10000


@pytest.mark.parametrize("pseudo, fill", [
    ("zero:[123,456,3]", lambda shape: np.zeros(shape, np.uint16)),
    ("constant:42:[123,456,3]", lambda shape: np.full(shape, 42, np.uint16)),
    ("identity:[123,456,3]", lambda shape: np.broadcast_to(
        np.equal.outer(np.arange(shape[1]), np.arange(shape[2])), shape).astype(np.uint16)),
])
def test_pseudo_file_inputs(apps, tmp_path, pseudo, fill):
    line = (f"--output_extents=[100,200,3] input={pseudo} levels=8 alpha=1 beta=1 "
            "output=/tmp/out.png")
    succeeded(rungen(apps["local_laplacian"], line, **{"/tmp/out.png": tmp_path / "out.npy"}))
    expected = local_laplacian(fill((3, 456, 123)), 8, 1, 1, 100)[:, :200]
    assert_close_u16(np.load(tmp_path / "out.npy"), expected)


def test_random_inputs_follow_their_seed(apps, tmp_path):
    results = []
    for seed in (42, 42, 7):
        line = (f"--output_extents=[100,200,3] input=random:{seed}:[123,456,3] levels=8 "
                f"alpha=1 beta=1 output=/tmp/out.png")
        succeeded(rungen(apps["local_laplacian"], line, **{"/tmp/out.png": tmp_path / "out.npy"}))
        results.append(np.load(tmp_path / "out.npy"))
    assert results[0].shape == (3, 200, 100)
    np.testing.assert_array_equal(results[0], results[1])
    assert not np.array_equal(results[0], results[2])
    assert results[0].std() > 1000  # uniform over the whole uint16 range


@pytest.mark.parametrize("line, input_shape, output_shape", [
    ("--output_extents=[100,200,3] input=zero:auto levels=8 alpha=1 beta=1 output=/tmp/out.png",
     (3, 200, 101), (3, 200, 100)),
    ("--output_extents=[100,200,3] input=zero:estimate_then_auto levels=8 alpha=1 beta=1 "
     "output=/tmp/out.png", (3, 256, 128), (3, 200, 100)),
    ("--output_extents=estimate input=zero:auto levels=8 alpha=1 beta=1 output=/tmp/out.png",
     (3, 48, 65), (3, 48, 64)),
    ("--output_extents=[100,200,3] --default_input_buffers=random:0:auto "
     "--default_input_scalars=estimate output=/tmp/out.png", (3, 200, 101), (3, 200, 100)),
])
def test_extents_from_the_bounds_query_and_the_estimates(apps, tmp_path, line, input_shape,
                                                         output_shape):
    done = succeeded(rungen(apps["local_laplacian"], line + " --verbose",
                            **{"/tmp/out.png": tmp_path / "out.png"}))
    if "auto" in line and "estimate_then_auto" not in line:
        width, height, channels = reversed(input_shape)
        shape = f"[[0,{width},1],[0,{height},{width}],[0,{channels},{width * height}]]"
        assert f"Input input has a bounds-query shape of {shape}" in done.stderr
        assert f"Input input: Shape is {shape}" in done.stderr
    assert read_png16(tmp_path / "out.png").shape == output_shape


def test_benchmark_as_in_rungen_md(apps):
    line = ("--benchmarks=all input=zero:[1920,1080,3] levels=8 alpha=1 beta=1 "
            "--output_extents=[100,200,3]")
    done = succeeded(rungen(apps["local_laplacian"], line))
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Benchmark for local_laplacian produces best case of ")
    assert " sec/iter (over " in lines[0] and " samples, " in lines[0]
    assert lines[1].startswith("Best output throughput is ") and lines[1].endswith(" mpix/sec.")


def test_benchmark_with_default_inputs_as_in_rungen_md(apps):
    line = ("--benchmarks=all --default_input_buffers --default_input_scalars "
            "--output_extents=estimate")
    done = succeeded(rungen(apps["local_laplacian"], line))
    assert done.stdout.startswith("Benchmark for local_laplacian produces best case of ")


def test_track_memory_as_in_rungen_md(apps):
    line = ("--track_memory input=zero:[1920,1080,3] levels=8 alpha=1 beta=1 "
            "--output_extents=[100,200,3]")
    # The stand-in allocates nothing; RunGen's megapixels are the first two extents / 2^20.
    done = succeeded(rungen(apps["local_laplacian"], line))
    assert "Maximum Halide memory: 0 bytes for output of 0.0190735 mpix." in done.stdout
    # harris's compute_root stages (gray, Ix, Iy) are float32 images a little larger than
    # its 58 x 42 output.
    done = succeeded(rungen(apps["harris"], "--track_memory input=zero:[70,50,4]"))
    highwater = int(done.stdout.split("Maximum Halide memory: ")[1].split()[0])
    assert 2 * 58 * 42 * 4 < highwater < 3 * 70 * 50 * 4


# --- apps/support/Makefile.inc, apps/HelloWasm --------------------------------------------------

def test_makefile_benchmark_line_with_parsable_output(apps):
    done = succeeded(rungen(apps["local_laplacian"], "--benchmarks=all --estimate_all "
                                                     "--parsable_output"))
    rows = dict(line.split(None, 2)[1:] for line in done.stdout.splitlines())
    assert all(line.startswith("local_laplacian  ") for line in done.stdout.splitlines())
    assert set(rows) == {"BEST_TIME_MSEC_PER_ITER", "SAMPLES", "ITERATIONS", "TIMING_ACCURACY",
                         "THROUGHPUT_MPIX_PER_SEC", "HALIDE_TARGET"}
    assert float(rows["BEST_TIME_MSEC_PER_ITER"]) > 0 and int(rows["SAMPLES"]) >= 3
    assert rows["HALIDE_TARGET"].startswith("x86-64-linux")


def test_hellowasm_line_picks_a_pipeline_by_name(apps):
    # (HelloWasm's --benchmark_min_time=1, shortened for the test's sake.)
    line = ("--benchmarks=all --benchmark_min_time=0.05 --name=local_laplacian "
            "--output_extents=[1024,1024,3] --default_input_buffers --default_input_scalars "
            "--parsable_output")
    done = succeeded(rungen(apps["both"], line))
    assert done.stdout.startswith("local_laplacian  BEST_TIME_MSEC_PER_ITER  ")
    done = rungen(apps["both"], "--describe")
    assert done.returncode == -signal.SIGABRT
    assert done.stderr == ("Must specify --name if multiple filters are registered; registered "
                           "filters are:\n  harris\n  local_laplacian\n\n")


# --- apps/harris: an output from (3, 3) -----------------------------------------------------------

def test_harris_output_is_as_large_as_its_input_covers(apps, tmp_path):
    # The stand-in reads 2 pixels around each output pixel: its output starts at (2, 2) and
    # is 4 smaller each way, larger than its estimates' (3, 3) + 58x42, which fit too.
    rgba = np.random.default_rng(4).integers(0, 256, size=(48, 64, 4), dtype=np.uint8)
    iio.imwrite(tmp_path / "rgba.png", rgba)
    done = succeeded(rungen(apps["harris"], f"input={tmp_path / 'rgba.png'} "
                                            f"output={tmp_path / 'out.npy'} --verbose"))
    assert "Output output: Shape is [[2,60,1],[2,44,60]]" in done.stderr
    image = np.moveaxis(rgba, 2, 0).astype(np.float32) / 255
    assert_harris_close(np.load(tmp_path / "out.npy"), harris(image, 2, 2, 60, 44))


@pytest.mark.parametrize("flags", [
    "--output_extents=[3+50,5+30] input=INPUT output=OUT",
    "input=INPUT output=OUT:[3+50,5+30]",
])
def test_output_mins_from_the_command_line(apps, tmp_path, flags):
    image = np.random.default_rng(5).random((3, 48, 64), dtype=np.float32)
    np.save(tmp_path / "in.npy", image)
    done = succeeded(rungen(apps["harris"], flags + " --verbose", INPUT=tmp_path / "in.npy",
                            OUT=tmp_path / "out.npy"))
    assert "Output output: Shape is [[3,50,1],[5,30,50]]" in done.stderr
    assert_harris_close(np.load(tmp_path / "out.npy"), harris(image, 3, 5, 50, 30))


def test_an_input_other_than_the_estimates_sizes_the_output_less_the_border(apps, tmp_path):
    image = np.random.default_rng(6).random((3, 30, 40), dtype=np.float32)
    np.save(tmp_path / "in.npy", image)
    done = succeeded(rungen(apps["harris"], f"input={tmp_path / 'in.npy'} "
                                            f"output={tmp_path / 'out.npy'} --verbose"))
    # harris reads 2 pixels around each output pixel.
    assert ("Output output is sized as large as the inputs cover (the first, input, less what "
            "the pipeline reads around it): [2+36,2+26]") in done.stderr
    assert_harris_close(np.load(tmp_path / "out.npy"), harris(image, 2, 2, 36, 26))


def test_an_input_too_small_for_any_guess_says_how_the_output_was_sized(apps, tmp_path):
    done = rungen(apps["harris"], f"input=zero:[4,4,3] output={tmp_path / 'out.npy'}")
    # (RunGen would compute it from memory it never wrote: refused, ending as RunGen's
    # failures do)
    assert done.returncode == -signal.SIGABRT
    assert "input: too small" in done.stderr
    assert ("outputs sized automatically: output [4,4] (like the first input, input, which "
            "the inputs do not cover); give --output_extents=[W,H,...] or "
            "output=FILE:[W,H,...] to choose") in done.stderr


# --- the sample pipelines ---------------------------------------------------------------------

def test_float_output_to_png_is_converted_with_a_warning(host_pipelines, tmp_path):
    done = succeeded(rungen(host_pipelines["brighten", "bundled"],
                            "input=constant:0.25:[40,30] scale=2 offset=0.125 output=OUT",
                            OUT=tmp_path / "out.png"))
    assert done.stderr == ('Warning: Image for argument "output" is of type float32 but is being '
                           'saved as type uint16; data loss may have occurred.\n')
    written = iio.imread(tmp_path / "out.png")
    assert written.dtype == np.uint16 and written.shape == (30, 40)
    assert (written == round(0.625 * 65535)).all()


def test_a_png_that_cannot_hold_an_output_is_refused_before_any_run(host_pipelines, tmp_path):
    # 5 channels: no PNG holds them. Refused before the runs (which would take long).
    done = rungen(host_pipelines["async_fold_storage", "bundled"],
                  "--output_extents=[64,64,5] --iterations 1000000 output=OUT",
                  OUT=tmp_path / "out.png")
    assert done.returncode == -signal.SIGABRT
    assert done.stderr.endswith("Error in I/O: Can't write PNG files that have other than 1, "
                                "2, 3, or 4 channels\n")  # (halide_image_io's words)
    assert "iteration" not in done.stdout


def test_the_sample_histogram_takes_its_constrained_size(host_pipelines, tmp_path):
    image = np.random.default_rng(7).integers(0, 256, size=(30, 50), dtype=np.uint8)
    iio.imwrite(tmp_path / "in.png", image)
    succeeded(rungen(host_pipelines["histogram", "bundled"], "input=IN output=OUT",
                     IN=tmp_path / "in.png", OUT=tmp_path / "hist.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "hist.npy"),
                                  np.bincount(image.ravel(), minlength=256))


def test_an_8_bit_png_into_the_blur(host_pipelines, tmp_path):
    gray = np.random.default_rng(1).integers(0, 256, size=(34, 50), dtype=np.uint8)
    iio.imwrite(tmp_path / "in.png", gray)
    succeeded(rungen(host_pipelines["blur3x3", "bundled"], "input=IN output=OUT",
                     IN=tmp_path / "in.png", OUT=tmp_path / "out.png"))
    np.testing.assert_array_equal(iio.imread(tmp_path / "out.png"),
                                  blur_reference(gray.astype(np.uint16) * 257))


# --- halide_image_io's type conversion ------------------------------------------------------

@pytest.mark.parametrize("values, dtype, expected", [
    (np.array([0, 1, 128, 255], np.uint8), np.uint16, [0, 257, 32896, 65535]),
    (np.array([0, 257, 32896, 65535, 383], np.uint16), np.uint8, [0, 1, 128, 255, 1]),
    (np.array([0x12345678], np.uint32), np.uint8, [0x12]),  # rounded
    (np.array([0x12345678], np.uint32), np.uint16, [0x1234]),  # truncated
    (np.array([0, 255], np.uint8), np.float32, [0.0, 1.0]),
    # (beyond [0, 1], around: lround(2 * 255) = 510 is 254 as a uint8, -255 is 1)
    (np.array([0.0, 0.5, 1.0, 2.0, -1.0], np.float32), np.uint8, [0, 128, 255, 254, 1]),
    (np.array([0.5], np.float64), np.uint16, [32768]),
    (np.array([True, False]), np.float32, [1.0, 0.0]),
    (np.array([0, 3], np.int16), np.bool_, [False, True]),
    (np.array([-1], np.int8), np.uint16, [65535]),  # signed types are read as their bits
])
def test_halide_image_conversion(values, dtype, expected):
    from shim.cli.images import convert

    converted = convert(values, dtype)
    assert converted.dtype == np.dtype(dtype)
    np.testing.assert_allclose(converted, np.array(expected, dtype), rtol=1e-6)
