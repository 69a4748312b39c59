"""Generators for tests/test_build_flavors*.py: one pipeline for each kind of build and
schedule that Halide's own AOT tests (test/generator) exercise and the shim's other tests do
not, written for these tests. Built the way a user builds them: this file through Halide's
generator command line (``python generators.py -g NAME -o DIR -e object target=...
[param=value...]``), then ``cc -shared``.

The extern stages they call are C, in externs.c beside this file (a library of the tests'
own, compiled at test time).
"""

import halide as hl

x, y, z, c, t = hl.vars("x y z c t")
xo, yo, xi, yi = hl.vars("xo yo xi yi")


def scalar(param, default=None, lo=None, hi=None, estimate=None):
    """A scalar input's default, range and estimate, as C++'s Input<T>{name, def, min, max}
    and set_estimate give them: they land in the pipeline's metadata."""
    kind = param.type()

    def typed(value):  # (a float through a double, rounded once to the parameter's type)
        return hl.cast(kind, hl.f64(value) if isinstance(value, float) else value)

    if default is not None:
        param.parameter().set_default_value(typed(default))
    if lo is not None:
        param.set_min_value(typed(lo))
    if hi is not None:
        param.set_max_value(typed(hi))
    if estimate is not None:
        param.set_estimate(estimate)


# --- metadata: every scalar type, buffers typed in code or by generator params -----------------

@hl.generator(name="flv_metadata")
class FlvMetadata:
    """Every scalar type Halide's metadata describes, with defaults, ranges and estimates (some
    with none of them); buffers whose type and dimensions come from the code, and others
    from generator params (``planes.type=uint8 planes.dim=3``, ``mask.type=...``); a float16
    buffer; outputs: a plain one, a Tuple (two buffers in the metadata), one typed by a
    generator param and a 0-D scalar output. Every input reaches the outputs."""

    pixels = hl.InputBuffer(hl.UInt(8), 3)
    planes = hl.InputBuffer(None, None)          # planes.type / planes.dim on the command line
    halves = hl.InputBuffer(hl.Float(16), 1)
    no_default = hl.InputScalar(hl.Int(32))
    flag = hl.InputScalar(hl.Bool())
    i8 = hl.InputScalar(hl.Int(8))
    i16 = hl.InputScalar(hl.Int(16))
    i32 = hl.InputScalar(hl.Int(32))
    i64 = hl.InputScalar(hl.Int(64))
    u8 = hl.InputScalar(hl.UInt(8))
    u16 = hl.InputScalar(hl.UInt(16))
    u32 = hl.InputScalar(hl.UInt(32))
    u64 = hl.InputScalar(hl.UInt(64))
    f16 = hl.InputScalar(hl.Float(16))
    f32 = hl.InputScalar(hl.Float(32))
    f64 = hl.InputScalar(hl.Float(64))
    pointer = hl.InputScalar(hl.Handle())
    plain = hl.OutputBuffer(hl.Float(32), 3)
    pair = hl.OutputBuffer([hl.Float(32), hl.Int(32)], 3)
    chosen = hl.OutputBuffer(None, 2)            # chosen.type on the command line
    total = hl.OutputScalar(hl.Float(64))

    def generate(self):
        scalar(self.flag, True, estimate=False)
        scalar(self.i8, 8, -8, 127, estimate=3)
        scalar(self.i16, 16, -16, 127)
        scalar(self.i32, 32, -32, 127)
        scalar(self.i64, 64, -64, 127)
        scalar(self.u8, 80, 8, 255)
        scalar(self.u16, 160, 16, 2550)
        scalar(self.u32, 320, 32, 2550)
        scalar(self.u64, 640, 64, 2550)
        scalar(self.f16, 1.5, -4.0, 1024.0)
        scalar(self.f32, 32.1234, -3200.1234, 3200.1234, estimate=48.5)
        scalar(self.f64, 64.25, -6400.25, 6400.25)
        # (no_default: none of them; pointer: a handle, default NULL)
        f64 = hl.Float(64)
        ints = (hl.cast(f64, self.i8) + hl.cast(f64, self.i16) + hl.cast(f64, self.i32)
                + hl.cast(f64, self.i64) + hl.cast(f64, self.no_default))
        unsigned = (hl.cast(f64, self.u8) + hl.cast(f64, self.u16) + hl.cast(f64, self.u32)
                    + hl.cast(f64, self.u64))
        floats = hl.cast(f64, self.f16) + hl.cast(f64, self.f32) + self.f64
        sums = ints * 1000 + unsigned + floats + hl.select(self.flag, 0.5, 0.0)
        value = (hl.cast(hl.Float(32), self.pixels[x, y, c]) * 2
                 + hl.cast(hl.Float(32), self.planes[x, y, c])
                 + hl.cast(hl.Float(32), self.halves[x])
                 + hl.cast(hl.Float(32), sums))
        self.plain[x, y, c] = value
        self.pair[x, y, c] = (value + 1, hl.cast(hl.Int(32), self.pixels[x, y, c]) - c)
        self.chosen[x, y] = hl.cast(self.chosen.type(), self.pixels[x, y, 0] + x)
        r = hl.RDom([(0, 4)])
        self.total[()] = sums + hl.cast(f64, hl.sum(self.halves[r.x]))
        # Estimates: a whole input, another's second dimension only, an output's x and y
        # (its c bounded, which is an estimate too), another's y only.
        self.pixels.set_estimates([(0, 2592), (42, 1968), (0, 3)])
        self.planes.dim(1).set_estimate(7, 99)
        self.plain.set_estimate(x, 10, 2592).set_estimate(y, 20, 1968).bound(c, 0, 3)
        self.chosen.set_estimate(y, 5, 50)


# --- generator params that change the pipeline -------------------------------------------------

@hl.generator(name="flv_rpn")
class FlvRpn:
    """The output is an expression in x and y given as a string generator param, in reverse
    Polish notation (``expression="x 3 * y +"``), in the type another generator param names
    (``kind=int16``), scaled by an int generator param and made parallel by a bool one:
    each build of this one generator is a different pipeline."""

    expression = hl.GeneratorParam("x y +")
    kind = hl.GeneratorParam("int32")
    scale = hl.GeneratorParam(1)
    rows_in_parallel = hl.GeneratorParam(False)

    def configure(self):
        self.add_input("offset", hl.InputScalar(self._kind()))
        self.add_output("output", hl.OutputBuffer(self._kind(), 2))

    def _kind(self):
        return {"int16": hl.Int(16), "int32": hl.Int(32), "float32": hl.Float(32),
                "uint8": hl.UInt(8)}[str(self.kind)]

    def generate(self):
        kind = self._kind()
        stack = []
        for token in str(self.expression).split():
            if token in ("x", "y"):
                stack.append(hl.cast(kind, x if token == "x" else y))
            elif token in ("+", "-", "*", "/"):
                right, left = stack.pop(), stack.pop()
                stack.append({"+": left + right, "-": left - right, "*": left * right,
                              "/": left / right}[token])
            else:
                stack.append(hl.cast(kind, int(token)))
        assert len(stack) == 1, f"malformed expression {self.expression!r}"
        self.output[x, y] = stack[0] * hl.cast(kind, self.scale) + self.offset
        if self.rows_in_parallel:
            self.output.parallel(y)


# --- nested externs ----------------------------------------------------------------------------

def _extern_layout(func):
    """Extern stages' storage planes-innermost: their buffers reach the C with c fastest."""
    func.compute_root()
    func.reorder_storage(c, x, y)


@hl.generator(name="flv_nest_combine")
class FlvNestCombine:
    """A Halide pipeline called as an extern stage by the two below: first * 10 + second."""

    first = hl.InputBuffer(hl.Float(32), 3)
    second = hl.InputBuffer(hl.Float(32), 3)
    combined = hl.OutputBuffer(hl.Float(32), 3)

    def generate(self):
        self.combined[x, y, c] = self.first[x, y, c] * 10 + self.second[x, y, c]
        # Any layout: the callers' buffers have c innermost (x's stride is 3, not 1).
        for buffer in (self.first, self.second, self.combined.output_buffer()):
            buffer.dim(0).set_stride(hl.Expr())


@hl.generator(name="flv_nest_inner")
class FlvNestInner:
    """Two extern stages in C (flv_leaf, externs.c), their results combined by the extern
    stage flv_nest_combine (a Halide pipeline); user_context passed down to each."""

    level = hl.InputScalar(hl.Float(32))
    inner = hl.OutputBuffer(hl.Float(32), 3)

    def generate(self):
        scalar(self.level, 1.0)
        ucon = hl.user_context_value()
        low, high, both = hl.Func("leaf_low"), hl.Func("leaf_high"), hl.Func("inner_combined")
        low.define_extern("flv_leaf", [ucon, self.level], hl.Float(32), [x, y, c])
        high.define_extern("flv_leaf", [ucon, self.level + 2], hl.Float(32), [x, y, c])
        both.define_extern("flv_nest_combine", [ucon, low, high], hl.Float(32), [x, y, c])
        self.inner[x, y, c] = both[x, y, c]
        for func in (low, high, both):
            _extern_layout(func)


@hl.generator(name="flv_nest_root")
class FlvNestRoot:
    """The root: flv_nest_inner twice and flv_nest_combine, computed per row of a parallel
    loop, so that pipelines call pipelines from Halide's worker threads; the level comes in as
    a 0-D buffer, read at a constant index as an extern stage's scalar argument. The output
    is interleaved (c innermost, x stride 3): a numpy array of shape (3, H, W) transposed
    from (H, W, 3) is such a buffer."""

    level = hl.InputBuffer(hl.Float(32), 0)
    root = hl.OutputBuffer(hl.Float(32), 3)

    def generate(self):
        ucon = hl.user_context_value()
        one, two, both = hl.Func("inner_one"), hl.Func("inner_two"), hl.Func("root_combined")
        one.define_extern("flv_nest_inner", [ucon, self.level[()]], hl.Float(32), [x, y, c])
        two.define_extern("flv_nest_inner", [ucon, self.level[()] + 1], hl.Float(32), [x, y, c])
        both.define_extern("flv_nest_combine", [ucon, one, two], hl.Float(32), [x, y, c])
        self.root[x, y, c] = both[x, y, c]
        for func in (one, two, both):
            func.compute_at(self.root, y).reorder_storage(c, x, y)
        self.root.output_buffer().dim(0).set_stride(3)
        self.root.output_buffer().dim(2).set_min(0).set_extent(3).set_stride(1)
        self.root.reorder_storage(c, x, y)
        self.root.parallel(y, 4)


# --- an extern stage writing the pipeline's output ---------------------------------------------

@hl.generator(name="flv_extern_output")
class FlvExternOutput:
    """The output is an extern stage (flv_add, externs.c) over a Halide stage computed per
    tile: the C writes the pipeline's own output buffer, tile by tile, in parallel."""

    input = hl.InputBuffer(hl.Int(32), 2)
    addend = hl.InputScalar(hl.Int(32))
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        tripled = hl.Func("tripled")
        tripled[x, y] = self.input[x, y] * 3
        self.output.define_extern("flv_add", [tripled, self.addend], [hl.Int(32)], [x, y])
        self.output.tile(x, y, xo, yo, xi, yi, 16, 8).parallel(yo)
        tripled.compute_at(self.output, xo)


# --- async producers inside parallel loops -----------------------------------------------------

@hl.generator(name="flv_async_parallel")
class FlvAsyncParallel:
    """Async producers at three loop levels inside two nested parallel loops: a chain that
    needs many of Halide's threads at once, each waiting on semaphores. The first producer is
    an extern stage in C (flv_jitter) that sleeps at places a seed picks, so each run orders
    the threads differently."""

    output = hl.OutputBuffer(hl.Int(32), 3)

    def generate(self):
        seeds, near, mid, far = (hl.Func(n) for n in ("seeds", "near", "mid", "far"))
        seeds.define_extern("flv_jitter", [], hl.Int(32), [x, y, z])
        near[x, y, z] = seeds[x - 1, y, z] + 2 * seeds[x + 1, y, z]
        mid[x, y, z] = near[x, y - 1, z] - near[x, y + 1, z] + z
        far[x, y, z] = mid[x - 1, y, z] * 3 + mid[x + 1, y, z]
        self.output[x, y, z] = far[x, y, z] + x
        far.compute_at(self.output, y)
        mid.store_at(far, y).compute_at(far, x).async_()
        near.store_at(self.output, y).compute_at(far, y).async_()
        seeds.store_at(far, y).compute_at(near, x).async_()
        self.output.parallel(z).parallel(y)


# --- failures midway ---------------------------------------------------------------------------

@hl.generator(name="flv_cleanup")
class FlvCleanup:
    """Two compute_root stages, each a heap allocation (the first on the GPU where the target
    has one); an application's halide_malloc that fails the second makes the call fail
    midway, after the first allocation."""

    output = hl.OutputBuffer(hl.Int(32), 1)

    def generate(self):
        first, second = hl.Func("first"), hl.Func("second")
        first[x] = x * 7
        second[x] = first[2 * x] - first[2 * x + 1]
        self.output[x] = second[x] + 1
        first.compute_root()
        second.compute_root()
        if self.target().has_gpu_feature():
            first.gpu_tile(x, xo, xi, 16)


# --- user_context: GPU pipelines on threads, and many calls each with its own context ---------

@hl.generator(name="flv_gpu_add")
class FlvGpuAdd:
    input = hl.InputBuffer(hl.Int(32), 2)
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        self.output[x, y] = self.input[x, y] + 2
        if self.target().has_gpu_feature():
            self.output.gpu_tile(x, y, xo, yo, xi, yi, 16, 16, hl.TailStrategy.GuardWithIf)


@hl.generator(name="flv_gpu_mul")
class FlvGpuMul:
    input = hl.InputBuffer(hl.Int(32), 2)
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        self.output[x, y] = self.input[x, y] * 3
        if self.target().has_gpu_feature():
            self.output.gpu_tile(x, y, xo, yo, xi, yi, 16, 16, hl.TailStrategy.GuardWithIf)


@hl.generator(name="flv_tagged")
class FlvTagged:
    """Built with the user_context feature. A compute_root stage (a halide_malloc), rows in
    parallel; every row prints the call's tag (from a worker thread), and a negative input
    fails a require naming the tag and the row; stores are traced."""

    input = hl.InputBuffer(hl.Float(32), 2)
    tag = hl.InputScalar(hl.Int(32))
    output = hl.OutputBuffer(hl.Float(32), 2)

    def generate(self):
        doubled = hl.Func("doubled")
        doubled[x, y] = self.input[x, y] * 2
        doubled.compute_root()
        checked = hl.require(self.input[x, y] >= 0, doubled[x, y], hl.Expr("call"), self.tag,
                             hl.Expr("negative at row"), y)
        self.output[x, y] = hl.print_when(x == 0, checked, "call", self.tag, "row", y)
        self.output.parallel(y)
        self.output.trace_stores()


# --- Halide's memory profiler --------------------------------------------------------------------

@hl.generator(name="flv_orbits")
class FlvOrbits:
    """Built with the profile feature. A Tuple-valued iteration computed per 8x8 tile of a
    parallel loop: one heap allocation per tile (two float32 planes, iterations + 1 deep); the
    first iteration to leave a radius found with argmin, whose vector-wide state is on the
    stack."""

    cx = hl.InputScalar(hl.Float(32))
    cy = hl.InputScalar(hl.Float(32))
    steps = hl.InputScalar(hl.Int(32))
    escape = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        orbit = hl.Func("orbit")
        start_re = hl.cast(hl.Float(32), x) / 40 - 1.5
        start_im = hl.cast(hl.Float(32), y) / 20 - 1.0
        orbit[x, y, t] = (start_re, start_im)
        i = hl.RDom([(1, self.steps)], "i")
        re, im = orbit[x, y, i - 1][0], orbit[x, y, i - 1][1]
        orbit[x, y, i] = (re * re - im * im + self.cx, 2 * re * im + self.cy)
        step = hl.RDom([(1, self.steps)], "step")
        out_re, out_im = orbit[x, y, step][0], orbit[x, y, step][1]
        left = hl.argmin(out_re * out_re + out_im * out_im < 4)
        self.escape[x, y] = hl.select(left[1], 0, left[0])
        orbit.compute_at(self.escape, xo)
        self.escape.tile(x, y, xo, yo, xi, yi, 8, 8).parallel(yo).vectorize(xi, 4) \
            .unroll(xi).unroll(yi, 2)


# --- an extern stage on OpenCL -----------------------------------------------------------------

@hl.generator(name="flv_cl_extern")
class FlvClExtern:
    """A define_extern stage on OpenCL (flv_cl_affine, externs.c: its own OpenCL kernel on the
    runtime's context and queue, left queued as it returns) between a CPU stage and a GPU
    stage."""

    input = hl.InputBuffer(hl.Int(32), 1)
    output = hl.OutputBuffer(hl.Int(32), 1)

    def generate(self):
        staged, on_device = hl.Func("staged"), hl.Func("on_device")
        staged[x] = self.input[x] + 1
        on_device.define_extern("flv_cl_affine", [staged], hl.Int(32), 1,
                                hl.NameMangling.Default, hl.DeviceAPI.OpenCL)
        self.output[x] = on_device[x] - 5
        staged.compute_root()
        on_device.compute_root()
        self.output.gpu_tile(x, xo, xi, 16, hl.TailStrategy.GuardWithIf)


# --- copy stages ---------------------------------------------------------------------------------

@hl.generator(name="flv_copy_stages")
class FlvCopyStages:
    """Work that goes device, host, device, host, with an explicit copy stage between each
    (Func.copy_to_device / copy_to_host), some copying a tile of a bigger buffer and some a
    whole one. Built for a CPU target, the same stages are copy_to_host copies (each a
    halide_buffer_copy to host memory): from an input that lives on the shim's simulated
    host device they copy from device memory."""

    input = hl.InputBuffer(hl.Float(32), 2)
    output = hl.OutputBuffer(hl.Float(32), 2)

    def generate(self):
        first, back, second = hl.Func("first"), hl.Func("back"), hl.Func("second")
        first[x, y] = self.input[x, y] * 2
        back[x, y] = first[x, y] + 3
        second[x, y] = back[x, y] * back[x, y]
        self.output[x, y] = second[x, y] - 1
        tx, ty = hl.Var("tx"), hl.Var("ty")
        self.output.compute_root().tile(x, y, tx, ty, x, y, 48, 32)
        if self.target().has_gpu_feature():
            first.compute_at(self.output, tx).gpu_tile(x, y, xo, yo, xi, yi, 8, 8)
            second.compute_at(self.output, tx).tile(x, y, tx, ty, x, y, 24, 16) \
                .gpu_tile(x, y, xo, yo, xi, yi, 8, 8)
            back.compute_at(second, tx)
            self.input.in_(first).copy_to_device().compute_at(self.output, tx).store_root()
            first.in_(back).copy_to_host().compute_at(second, tx)
            back.in_(second).copy_to_device().compute_at(second, tx)
            second.in_(self.output).copy_to_host().compute_at(self.output, tx)
        else:
            first.compute_at(self.output, tx)
            back.compute_at(self.output, tx)
            second.compute_at(self.output, tx)
            self.input.in_(first).copy_to_host().compute_at(self.output, tx).store_root()
            first.in_(back).copy_to_host().compute_at(self.output, tx)


@hl.generator(name="flv_copy_frames")
class FlvCopyFrames:
    """Frames of a sum, each brought over by an async copy stage double-buffered with
    fold_storage while the previous frame is summed. On a GPU target the frames are
    computed on the host and the copy stage takes them to the device (copy_to_device), where
    the sum runs; on a CPU target the input's frames are copied by a copy_to_host stage."""

    input = hl.InputBuffer(hl.Int(32), 3)
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        frames = hl.Func("frames")
        frames[x, y, t] = self.input[x, y, t] * (t + 1)
        r = hl.RDom([(0, self.input.dim(2).extent())], "r")
        self.output[x, y] = 0
        self.output[x, y] += frames[x, y, r]
        copy = frames.in_()
        copy.store_root().compute_at(self.output, r.x).fold_storage(t, 2).async_()
        frames.compute_at(copy, hl.Var.outermost())
        if self.target().has_gpu_feature():
            copy.copy_to_device()
            self.output.gpu_tile(x, y, xo, yo, xi, yi, 16, 16, hl.TailStrategy.GuardWithIf)
            self.output.update().reorder(x, y, r.x).gpu_tile(x, y, xo, yo, xi, yi, 16, 16,
                                                             hl.TailStrategy.GuardWithIf)
        else:
            self.input.in_(frames).copy_to_host().compute_at(copy, hl.Var.outermost())
            self.output.update().reorder(x, y, r.x)


if __name__ == "__main__":
    hl.main()
