"""Running a pipeline: the run of a prepared call (in C, native_stubs/fast/prepared_call.c, where
it can; here otherwise: profiled calls, CUDA, a crop's family in a state C has no plan for), the bounds query's run, and what a run
reports (its prints, its failure as the right exception)."""

from __future__ import annotations

import contextlib
import contextvars
import sys

import numpy as np

from shim.core import call_uses
from shim.memory import families
from shim.native import flags, libraries
from shim.native import interrupts
from shim.profiling import profiler
from shim.native import streams
from shim.calls.arguments import Call
from shim.calls.binding import free_temporaries
from shim.core.bridge import backend_calls, raise_failure, take_exception
from shim.buffers.buffer import Buffer
from shim.backends.devices import backend_class, classes_for_apis
from shim.base.errors import DEVICE_ERROR_CODES, DeviceError, PipelineError
from shim.native import CallContext, HeldContext, PreparedRun, ffi, lib, print_text

# Where what a pipeline prints (halide_print) goes, in this thread: a function of the text (set
# by ``prints_to``), or None: Python's stderr.
_prints_to: contextvars.ContextVar = contextvars.ContextVar("prints_to", default=None)

# How often a call prepares buffers another thread keeps moving to a device it does not use.
_PREPARATION_ATTEMPTS = 100
# The most buffers a prepared call's C run takes (native_stubs/fast/prepared_call.c, MAX_MEMBERS).
_NATIVE_RUN_BUFFERS = 64


@contextlib.contextmanager
def prints_to(write):
    """Within the block, what the pipelines this thread calls print goes to ``write`` (a
    function of the text) instead of stderr: ``python -m shim run`` prints it as RunGen does."""
    token = _prints_to.set(write)
    try:
        yield
    finally:
        _prints_to.reset(token)


class Runner:
    """What running one pipeline takes: its entry point, the devices it runs on, and the
    report of each run."""

    def __init__(self, name: str, argv_fn, device_kinds: frozenset,
                 halide_profiler_abi: int | None = None):
        self.name, self.argv_fn = name, argv_fn
        # Built with Halide's profiler, by a release of that profiler ABI (None: without):
        # inside a profile, its calls get their per-Func figures.
        self.halide_profiler_abi = halide_profiler_abi
        # The device APIs the pipeline's code uses (none: it computes on the CPU only).
        self.device_kinds = device_kinds
        # A CPU pipeline writes its outputs on the host.
        self.host_write = not device_kinds
        backends = [backend_class(kind) for kind in device_kinds]
        self.backend_mask = sum(1 << backend.index for backend in classes_for_apis(device_kinds))
        # Whether its calls may run from C (the fast paths): not on a device the shim has no
        # backend for, nor on one that orders work across streams (CUDA's fences are Python's).
        self.native_calls = all(backend is not None and not backend.orders_streams
                                for backend in backends)

    def run_query(self, argv) -> None:
        """One run of the pipeline outside a PreparedCall: the bounds query."""
        with interrupts.deferred():
            context = CallContext.begin()
            try:
                lib.shim_call_set_stream(context.pointer, ffi.cast("void *", streams.current()))
                profiled = profiler.begin_pipeline(f"{self.name} (bounds query)", context.id)
                result = -1
                try:
                    result = lib.shim_call_argv(context.pointer, self.argv_fn, argv)
                    self.finish(context, result)
                finally:
                    profiler.end(profiled, result)
            finally:
                context.end()

    def run_structs(self, argv, structs: list, outputs: list) -> None:
        """One run on halide_buffer_t structs that are no Buffer's, with nothing of the shim's
        checks or bookkeeping: as the Python extension Halide generates runs its pipeline
        (shim/calls/extension.py). ``structs``: every buffer argument's, host memory only;
        ``outputs``: those the run writes. Then, as the extension: each output copied to the
        host if the run succeeded, and every struct's device memory freed whatever happened;
        a failure of either is the call's, unless the run failed first. Raises as a call does."""
        pointers = ffi.new("halide_buffer_t *[]", structs or 1)
        with interrupts.deferred():
            context = CallContext.begin(reset=False)
            try:
                profiled = profiler.begin_pipeline(self.name, context.id, self.halide_profiler_abi)
                result = -1
                try:
                    result = lib.shim_call_run(context.pointer, context.id,
                                               ffi.cast("void *", streams.current()), self.argv_fn,
                                               argv, pointers, len(structs), self.backend_mask)
                    previous = lib.shim_call_enter(context.pointer)
                    try:
                        for raw in outputs:
                            if result == 0:
                                result = lib.halide_copy_to_host(ffi.NULL, raw)
                        for raw in structs:
                            freed = lib.halide_device_free(ffi.NULL, raw)
                            result = result or freed
                    finally:
                        lib.shim_call_leave(previous)
                    self.finish(context, result)
                finally:
                    profiler.end(profiled, result)
            finally:
                context.end()

    def finish(self, context: CallContext, result: int) -> None:
        """Hand on what the call printed; raise for a failed call."""
        self._report(result, context.errors() if result else "",
                     context.prints() if context.printed() else "", context.id)

    def finish_fast(self, result: int, errors: bytes, prints: bytes, call_id: int,
                    prints_dropped: int = 0) -> None:
        """finish() for the fast paths (native_stubs/fast/fastcall.c), which pass the context's text
        (and how much print output it had no room for)."""
        self._report(result, errors.decode("utf-8", "replace"), print_text(prints, prints_dropped),
                     call_id)

    def _report(self, result: int, errors: str, prints: str, call_id: int) -> None:
        if prints:
            (_prints_to.get() or sys.stderr.write)(prints)
        if result != 0:
            message = errors.strip()
            cause = take_exception(call_id)
            if cause is not None or result in DEVICE_ERROR_CODES:  # a device call failed
                raise_failure(result, message, cause, self.name)
            if result == lib.halide_error_code_bad_type and libraries.types_spelled_several_ways():
                message += (" (if a Buffer of this call was in a call of a pipeline built by "
                            "another Halide release at the same time, on another thread: Halide "
                            "22 spells a buffer's type otherwise than 19 and 21, and a Buffer "
                            "goes to pipelines of one spelling at a time)")
            raise PipelineError(result, message, context=self.name)

    def prepare_device_state(self, buf: Buffer) -> None:
        """Make a Buffer that lives on a device this pipeline does not use acceptable to it:
        its current data goes to host memory (a CPU pipeline fails on device-dirty inputs), and
        a GPU pipeline on another API gets it without a device allocation, which it would
        otherwise refuse as a switch of interfaces."""
        backend = lib.shim_backend_of(buf.raw.device_interface)
        if backend < 0 or self.backend_mask & (1 << backend):
            return  # on a device the pipeline uses, or one the shim does not own
        if buf.device_dirty():
            buf.copy_to_host()
        if self.device_kinds and backend != lib.SHIM_BACKEND_PROXY:
            buf.device_free()


class PreparedCall(PreparedRun, HeldContext):
    """A pipeline call whose arguments are marshalled and bounds-checked once (see
    Pipeline.prepare). Calling it runs the pipeline and returns the outputs, as calling the
    Pipeline would; ``close()`` (or leaving its ``with`` block) frees the device memory of the
    buffers the shim made for the caller's arrays."""

    def __init__(self, runner: Runner, call: Call):
        if "_call" in self.__dict__:
            # Its run in C keeps pointers into the first call's memory, which new arguments
            # would let go (PreparedRun refuses a second making too, but only after this).
            raise TypeError("a PreparedCall is made once")
        self._runner = runner
        self._call = call
        buffers = [buf for _, _, buf in call.buffers]
        self._raw_buffers = ffi.new("halide_buffer_t *[]", [buf.raw for buf in buffers] or 1)
        self._outputs = [buf for _, arg, buf in call.buffers if arg.is_output]
        self._inputs = [buf for _, arg, buf in call.buffers if not arg.is_output]
        # (struct, family, is_output) of every buffer argument, for the families' records of
        # the call.
        self._arguments = [(buf.raw, buf.family, arg.is_output) for _, arg, buf in call.buffers]
        native = self._native_run()
        if native is not None:
            super().__init__(*native)

    # Calling a PreparedCall (PreparedRun's __call__) runs it in C where it can, else here.
    def _run_in_python(self):
        # Signal handlers run once the call is over and its results are where the caller asked
        # for them (shim/native/interrupts.py): a Ctrl-C never leaves a caller's array unwritten by a
        # call that ran.
        with interrupts.deferred():
            self._run_once()
            return self._results()

    def _native_run(self) -> tuple | None:
        """PreparedRun's arguments, where this call can run in C (native_stubs/fast/prepared_call.c):
        its pipeline's calls may, and its results need no copying into the caller's arrays or
        tensors."""
        runner, call = self._runner, self._call
        if (not runner.native_calls or call.device_outputs
                or any(target is not None for _, target in call.copy_back)
                or len(call.buffers) > _NATIVE_RUN_BUFFERS):
            return None
        inputs = [families.address_of(buf.raw) for _, arg, buf in call.buffers if not arg.is_output]
        array_inputs = {id(buf) for buf in call.array_inputs}
        to_host = {id(buf) for buf, _ in call.copy_back}
        members = [(buf, buf.call_record, arg.is_output,
                    call_uses.replaces(buf.raw, buf.family, arg.is_output, inputs),
                    id(buf) in array_inputs, id(buf) in to_host)
                   for _, arg, buf in call.buffers]
        results = call.results[0] if len(call.results) == 1 else tuple(call.results)
        return (_address(runner.argv_fn), _address(call.argv), _address(self._raw_buffers),
                runner.backend_mask, runner.host_write, members, results,
                runner.finish_fast, call_uses.end_call)

    def _run_once(self) -> None:
        runner, call = self._runner, self._call
        for buf in call.array_inputs:
            buf.set_host_dirty(True)  # the caller may have written to the array since
        context = CallContext.begin(reset=False)
        try:
            profiled = profiler.begin_pipeline(runner.name, context.id, runner.halide_profiler_abi)
            result = -1
            try:
                for _ in range(_PREPARATION_ATTEMPTS):
                    result = self._run_with_uses(context)
                    if result != lib.SHIM_CALL_NEEDS_PREPARATION:
                        break
                    # Outside the call's uses: preparing waits for other threads' calls on
                    # those buffers like any operation, and they never wait for this one.
                    for _, _, buf in call.buffers:
                        runner.prepare_device_state(buf)
                else:
                    raise DeviceError(lib.halide_error_code_incompatible_device_interface,
                                      "other threads kept moving this call's buffers to a "
                                      "device the pipeline does not use", context=runner.name)
                runner.finish(context, result)
            finally:
                profiler.end(profiled, result)
        finally:
            context.end()

    def _run_with_uses(self, context: CallContext) -> int:
        """One run, with the call's uses recorded in its buffers' families (shim/core/call_uses.py)
        from before it starts until its results are taken in. NEEDS_PREPARATION: it did not
        run."""
        runner = self._runner
        uses = call_uses.begin_call(context.id, self._arguments, host_write=runner.host_write)
        result = lib.SHIM_CALL_NEEDS_PREPARATION
        stream = streams.current()
        try:
            with backend_calls(runner.name):  # ordering the call's work across streams
                try:
                    if runner.device_kinds:
                        for backend, memory in self._device_memories():
                            backend.order_before(memory, stream)
                    result = self._run(context)
                finally:
                    if result != lib.SHIM_CALL_NEEDS_PREPARATION:
                        if runner.device_kinds:
                            for backend, memory in self._device_memories():
                                backend.ran_on(memory, stream)
                        else:
                            for buf in self._outputs:
                                # Code compiled for the CPU only writes outputs without marking
                                # them host-dirty; a device copy they may have would go stale.
                                flags.assign(buf.raw, flags.HOST_DIRTY, True)
        finally:
            # Even when ordering failed: uses left recorded would make every later operation
            # on these buffers wait for this call forever.
            call_uses.end_call(context.id, uses)  # a crop's results reach its parent
        return result

    def _device_memories(self):
        """(backend, allocation) of each of the call's Buffers that has one, for the backends'
        ordering of work across streams."""
        for _, family, _ in self._arguments:
            backend, memory = family.backend, family.memory
            if backend is not None and memory is not None:
                yield backend, memory

    def _results(self):
        call = self._call
        for buf in self._inputs:
            buf.mark_read()
        for buf in self._outputs:
            buf.mark_written()
        for output in call.device_outputs:
            output.copy_to_device()  # a CPU pipeline's results are still in host memory
        for output, target in call.copy_back:
            output.copy_to_host()
            if target is not None:
                np.copyto(target, output.numpy())
        return call.results[0] if len(call.results) == 1 else tuple(call.results)

    def _run(self, context: CallContext) -> int:
        call, runner = self._call, self._runner
        return lib.shim_call_run(context.pointer, context.id, ffi.cast("void *", streams.current()),
                                 runner.argv_fn, call.argv, self._raw_buffers,
                                 len(call.buffers), runner.backend_mask)

    def close(self) -> None:
        free_temporaries(self._call)

    # ``with``: leaving the block closes it, with signal handlers held (HeldContext), so that a
    # Ctrl-C cannot cut the close short.
    def _enter(self) -> PreparedCall:
        return self

    def _exit(self, *exc) -> None:
        self.close()


def _address(pointer) -> int:
    return int(ffi.cast("uintptr_t", pointer))
