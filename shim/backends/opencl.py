"""The OpenCL backend, through pyopencl (PoCL's CPU device where there is no GPU).

One context and one in-order command queue for the process, on the device chosen by
``shim.device("opencl", platform=..., device=...)``, by $HALIDE_SHIM_OPENCL_PLATFORM and
$HALIDE_SHIM_OPENCL_DEVICE, by Halide's own HL_OCL_PLATFORM_NAME / HL_OCL_DEVICE_TYPE, or
else: the first platform with a GPU, else the first platform with any device.

Kernel launches are in C (native_stubs/backends/opencl.c), crops at offsets OpenCL cannot make
sub-buffers at included; this module compiles programs (once per device and source, shared by
every pipeline, their binaries kept in an on-disk cache across processes) from Halide's source
with an offset per buffer (see program_source), allocates memory and copies.
"""

from __future__ import annotations

import gc
import os
import re
import threading
import time
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING

from shim.base import private_files
from shim.base import sections
from shim.base.progress import if_slow
from shim.backends.base import Backend, BackendError, Memory, fork_guard
from shim.base.errors import DeviceUnavailable
from shim.native import ffi, lib
from shim.native.regions import CopyPlan, rectangles, runs

if TYPE_CHECKING:
    import pyopencl


def _cl():
    try:
        import pyopencl
    except ImportError as e:  # pragma: no cover - pyopencl is a dependency
        raise DeviceUnavailable(f"OpenCL needs pyopencl: {e}") from None
    return pyopencl


def _platforms():
    cl = _cl()
    try:
        return cl.get_platforms()
    except cl.LogicError:  # PLATFORM_NOT_FOUND_KHR: no ICD installed
        return []


def build_failure_hint(log: str) -> str:
    """What to do about a driver that cannot compile for this machine at all."""
    if "unknown target CPU" not in log:
        return ""
    # PoCL's LLVM names the host CPU for code generation; one older than the CPU answers
    # "generic", which its x86 front end refuses: every program fails, whatever it holds.
    return ("\n(the OpenCL driver's compiler does not know this CPU: PoCL from pip carries "
            "LLVM 14; a newer PoCL, such as Debian's package pocl-opencl-icd, targets the CPU "
            "by its features)")


def _select(platform, device):
    """The (platform, device) to use, from arguments, environment or the default rule."""
    platforms = _platforms()
    if not platforms:
        raise DeviceUnavailable(
            "no OpenCL platform found: install an OpenCL driver, e.g. "
            "`pip install pocl-binary-distribution` for PoCL's CPU device, or your GPU "
            "vendor's ICD")
    platform = platform if platform is not None else (
        os.environ.get("HALIDE_SHIM_OPENCL_PLATFORM") or _preference(lib.halide_opencl_get_platform_name)
        or os.environ.get("HL_OCL_PLATFORM_NAME"))
    device = device if device is not None else os.environ.get("HALIDE_SHIM_OPENCL_DEVICE")
    device_type = (_preference(lib.halide_opencl_get_device_type)
                   or os.environ.get("HL_OCL_DEVICE_TYPE", "")).lower()
    names = ", ".join(f"{i}: {p.name}" for i, p in enumerate(platforms))
    if platform is not None:
        chosen = _pick(platforms, platform, lambda p: p.name)
        if chosen is None:
            raise DeviceUnavailable(f"no OpenCL platform matches {platform!r}; platforms: {names}")
        candidates = [chosen]
    else:
        candidates = platforms
    cl = _cl()
    wanted = {"gpu": cl.device_type.GPU, "cpu": cl.device_type.CPU,
              "acc": cl.device_type.ACCELERATOR}.get(device_type)

    def devices_of(p, types):
        return [d for d in p.get_devices() if types is None or d.type & types]

    if device is not None:
        for p in candidates:
            chosen = _pick(p.get_devices(), device, lambda d: d.name)
            if chosen is not None:
                return p, chosen
        raise DeviceUnavailable(f"no OpenCL device matches {device!r} on platforms: {names}")
    for types in ([wanted] if wanted else [cl.device_type.GPU, None]):
        for p in candidates:
            found = devices_of(p, types)
            if found:
                return p, found[0]
    raise DeviceUnavailable(f"no OpenCL device found on platforms: {names}")


def _preference(getter) -> str | None:
    """A preference native code set with Halide's halide_opencl_set_* functions."""
    value = getter(ffi.NULL)
    return None if value == ffi.NULL else ffi.string(value).decode()


def _pick(items, selector, name_of):
    """An item by index (int or digits) or by a case-insensitive name substring."""
    if isinstance(selector, int) or str(selector).isdigit():
        index = int(selector)
        return items[index] if 0 <= index < len(items) else None
    for item in items:
        if str(selector).lower() in name_of(item).lower():
            return item
    return None


def _icd_loader_path() -> str:
    """The libOpenCL pyopencl is linked against, so C launches go through the same loader."""
    import pyopencl._cl  # noqa: F401  (loads the library)

    with open("/proc/self/maps") as maps:
        found = re.findall(r"(/\S*libOpenCL\S*\.so\S*)", maps.read())
    if not found:
        raise DeviceUnavailable("cannot find the OpenCL ICD loader pyopencl uses")
    return found[0]


def _held(kind, handle: int):
    """The live pyopencl object of class ``kind`` whose OpenCL handle is ``handle``, or None.

    An int from outside (a DLPack stream, a tensor's data) cannot be checked by the driver:
    every OpenCL call dereferences it, and garbage crashes the ICD loader. A handle that a live
    pyopencl object owns is valid for as long as that object lives. pyopencl keeps no registry
    of its objects, so this scans the interpreter's: milliseconds, on paths that cache or
    rarely come here."""
    cl = _cl()
    for candidate in gc.get_objects():
        if issubclass(type(candidate), kind):  # (type(): no __class__ lookups on foreign objects)
            try:
                if candidate.int_ptr == handle:
                    return candidate
            except cl.Error:  # released
                continue
    return None


class OpenCLMemory(Memory):
    def __init__(self, buffer, nbytes: int, owned: bool = True):
        super().__init__(nbytes, owned)
        self.buffer = buffer  # pyopencl.Buffer
        # handle value -> (shim_cl_handle cdata, sub-buffer or None): kept alive with the handle
        self.handles: dict[int, tuple] = {}


class OpenCLBackend(Backend):
    kind = "opencl"
    index = lib.SHIM_BACKEND_OPENCL
    # After CUDA: an OpenCL device may be a CPU (PoCL, which the test extra installs). Among
    # OpenCL devices, a GPU platform comes first (see _select).
    default_rank = 1

    @classmethod
    def available(cls, images: bool = False) -> list[str]:
        """"device (platform)" for every OpenCL device on this machine (``images``: those with
        image memory); none without pyopencl (which people who only run CPU or CUDA pipelines
        need not install) or a driver."""
        try:
            return [f"{d.name} ({p.name})" for p in _platforms() for d in p.get_devices()
                    if d.image_support or not images]
        except Exception:  # noqa: BLE001 - no pyopencl, or pyopencl's own errors for a broken driver
            return []

    # Consumer queues a DLPack export last synchronized with, by handle: held, so the handle
    # stays valid, and at most this many, since finding one takes a scan (see _held).
    CONSUMER_QUEUES = 8

    def __init__(self, platform=None, device=None):
        super().__init__()
        cl = _cl()
        self._platform, self._device = _select(platform, device)
        self._usable = fork_guard("OpenCL")
        self._context = cl.Context([self._device])
        # Profiling enabled for shim.profile's device times (markers), at no measurable cost.
        self._queue = cl.CommandQueue(self._context, self._device,
                                      properties=cl.command_queue_properties.PROFILING_ENABLE)
        self._consumer_queues: OrderedDict[int, object] = OrderedDict()
        self._consumer_lock = sections.Lock()  # for the dict only
        self.alignment = max(self._device.mem_base_addr_align // 8, 1)
        self._programs: dict[bytes, tuple] = {}  # source digest -> (program, module cdata)
        self._compile_lock = threading.Lock()  # one compile per source, never held by launches
        self._build_options = " ".join(filter(None, [
            f"-D MAX_CONSTANT_BUFFER_SIZE={self._device.max_constant_buffer_size}",
            f"-D MAX_CONSTANT_ARGS={self._device.max_constant_args}",
            _preference(lib.halide_opencl_get_build_options) or os.environ.get("HL_OCL_BUILD_OPTIONS", "")]))
        loader = _icd_loader_path()
        status = lib.shim_opencl_bind(loader.encode(), ffi.cast("void *", self.context.int_ptr),
                                      ffi.cast("void *", self.queue.int_ptr))
        if status != 0:
            raise DeviceUnavailable(f"cannot bind kernel launches to {loader} (status {status})")
        # Pipelines' own allocations are served in C from this backend's pool (which lives as
        # long as the process: the backend registry keeps every backend).
        lib.shim_opencl_set_alignment(self.alignment)  # (crops made in C: served.c)
        lib.shim_opencl_serve_allocations(self._pool.native)
        self.serves_allocations = True
        self.transfers.served = self.index

    @property
    def name(self) -> str:
        return f"{self._device.name.strip()} ({self._platform.name.strip()})"

    @property
    def images_supported(self) -> bool:
        """Whether the device has image memory (shim/backends/opencl_image.py)."""
        return bool(self._device.image_support)

    # Every device operation goes through the context or the queue: here a forked child is
    # refused before it reaches the driver (kernel launches, in C, refuse on their own).

    @property
    def context(self) -> pyopencl.Context:
        self._usable()
        return self._context

    @property
    def queue(self) -> pyopencl.CommandQueue:
        self._usable()
        return self._queue

    # DLPack defines no stream value for OpenCL; the shim's is the cl_command_queue handle (an
    # int) of a queue the process holds. None asks for everything queued so far to have
    # finished; -1 for no synchronization.
    dlpack_device_type = 4  # kDLOpenCL
    dlpack_on_request_only = True  # (no mainstream consumer reads a cl_mem)

    def dlpack_stream(self):
        return self.queue.int_ptr

    def dlpack_data(self, handle: int) -> tuple[int, int]:
        struct = ffi.cast("shim_cl_handle *", handle)
        return int(ffi.cast("uintptr_t", struct.mem)), int(struct.offset)

    def dlpack_consumer_stream(self, stream):
        """The queue a consumer named for make_visible: None and -1 as they are, a handle as
        the pyopencl CommandQueue that owns it, which must be alive and in the shim's context
        (a handle nothing in this process owns is refused: see _held)."""
        if stream is None or stream == -1:
            return stream
        if stream == self.queue.int_ptr:
            return self.queue
        queue = self._consumer_queue(stream) if stream > 0 else None
        if queue is None:
            raise BufferError(f"stream {stream} is not an OpenCL command queue this process holds: "
                              "for OpenCL, DLPack's stream must be None, -1, or the int_ptr of a "
                              "live pyopencl.CommandQueue in the shim's context")
        if queue.context.int_ptr != self.context.int_ptr:
            raise BufferError(f"stream {stream} is a command queue of another OpenCL context; it "
                              "must be in the shim's (shim.device('opencl').context)")
        return queue

    def _consumer_queue(self, handle: int):
        with self._consumer_lock:
            queue = self._consumer_queues.get(handle)
            if queue is not None:
                self._consumer_queues.move_to_end(handle)
                return queue
        queue = _held(_cl().CommandQueue, handle)
        if queue is not None:
            with self._consumer_lock:
                self._consumer_queues[handle] = queue
                while len(self._consumer_queues) > self.CONSUMER_QUEUES:
                    self._consumer_queues.popitem(last=False)
        return queue

    def make_visible(self, consumer, memory: OpenCLMemory) -> None:
        # The shim runs all its OpenCL work on one in-order queue: ordering after everything
        # queued so far covers ``memory``.
        if consumer is None:
            self.sync()
        elif consumer != -1 and consumer is not self.queue:  # (-1: no synchronization)
            cl = _cl()
            try:
                done = cl.enqueue_marker(self.queue)  # completes when everything before it has
                cl.enqueue_barrier(consumer, wait_for=[done])
                self.queue.flush()
            except cl.Error as e:
                raise BackendError(f"ordering the consumer's queue after the shim's failed: "
                                   f"{e}") from None

    def check_dlpack_memory(self, data: int, byte_offset: int, nbytes: int) -> None:
        """Refuse (BufferError) a DLPack tensor's ``data`` unless it is a cl_mem in the shim's
        context, alive in this process, holding ``nbytes`` from ``byte_offset``."""
        cl = _cl()
        buffer = next((m.buffer for m in list(self._live.values()) if m.buffer.int_ptr == data),
                      None) or _held(cl.Buffer, data)
        if buffer is None:
            raise BufferError(f"data {data:#x} is not an OpenCL buffer this process holds (the "
                              "shim's, or a live pyopencl.Buffer's)")
        if buffer.context.int_ptr != self.context.int_ptr:
            raise BufferError(f"data {data:#x} is an OpenCL buffer of another context")
        if byte_offset + nbytes > buffer.size:
            raise BufferError(f"the tensor spans bytes [{byte_offset}, {byte_offset + nbytes}) of "
                              f"an OpenCL buffer of {buffer.size} bytes")

    # Device timing: markers in the one queue all the shim's OpenCL work goes to.

    def timing_origin(self):
        marker = _cl().enqueue_marker(self.queue)
        marker.wait()
        return time.perf_counter_ns(), marker.profile.end

    def timing_track(self, stream) -> str:
        return f"OpenCL queue ({self._device.name.strip()})"

    def timing_marker(self, stream):
        return _cl().enqueue_marker(self.queue)

    def timing_read(self, origin, before, after) -> tuple[int, int]:
        host, device = origin
        return host + before.profile.end - device, max(after.profile.end - before.profile.end, 0)

    def matches(self, platform=None, device=None) -> bool:
        _, chosen = _select(platform, device)
        return chosen.int_ptr == self._device.int_ptr

    # --- memory --------------------------------------------------------------------------

    # Allocation and free (reuse is the generic layer's: Backend.allocate). The shim's OpenCL
    # work all goes to one in-order queue, so memory needs no settling before reuse: whatever
    # the next holder enqueues runs after what the last one did.

    def _allocate_new(self, nbytes: int) -> OpenCLMemory:
        cl = _cl()
        try:
            buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
        except cl.Error as e:
            raise BackendError(f"clCreateBuffer({nbytes}) failed: {e}") from None
        return OpenCLMemory(buffer, nbytes)

    def _free_now(self, memory: OpenCLMemory) -> None:
        _forget_handles(memory)
        memory.buffer.release()

    def into_pool(self, memory: OpenCLMemory) -> int:
        # The pool holds a reference of its own (native_stubs/devices/served.c takes and frees
        # entries too), and the pyopencl object goes.
        native = memory.buffer.int_ptr
        lib.shim_opencl_retain(native)
        memory.buffer.release()
        return native

    def out_of_pool(self, native: int, capacity: int) -> OpenCLMemory:
        return OpenCLMemory(_cl().Buffer.from_int_ptr(native, retain=False), capacity)

    def adopt_served(self, native: int, nbytes: int, capacity: int, handles: list) -> OpenCLMemory:
        memory = self.out_of_pool(native, capacity)
        memory.nbytes = nbytes
        # The handles the native layer made (shim_opencl_handle_release frees them, with the
        # sub-buffers it made for them).
        for handle in handles:
            memory.handles[handle] = (ffi.cast("shim_cl_handle *", handle), None)
        self._live[id(memory)] = memory
        return memory

    def reusable(self, memory: OpenCLMemory) -> bool:
        # A handle still out may have a sub-buffer into the memory: OpenCL keeps released
        # memory alive for it, a pool would hand it to someone else.
        return not memory.handles

    def memory_size(self) -> int:
        return self._device.global_mem_size

    def placement(self, offset: int) -> int:
        # A sub-buffer needs an offset aligned to the device's base address alignment.
        return -offset % self.alignment

    def handle(self, memory: OpenCLMemory, offset: int, nbytes: int) -> int:
        struct = ffi.new("shim_cl_handle *")
        struct.offset, struct.nbytes = offset, nbytes
        struct.mem = ffi.cast("void *", memory.buffer.int_ptr)
        sub = None
        if offset == 0:
            struct.launch_mem = struct.mem
        elif offset % self.alignment == 0:
            cl = _cl()
            try:
                sub = memory.buffer.get_sub_region(offset, max(nbytes, 1))
            except cl.Error as e:
                raise BackendError(f"clCreateSubBuffer at offset {offset} failed: {e}") from None
            struct.launch_mem = ffi.cast("void *", sub.int_ptr)
        # else: launch_mem stays NULL and launches stage the crop (native_stubs/backends/opencl.c).
        value = int(ffi.cast("uintptr_t", struct))
        memory.handles[value] = (struct, sub)
        return value

    def release_handle(self, memory: OpenCLMemory, handle: int) -> None:
        struct, sub = memory.handles.pop(handle, (None, None))
        if struct is not None:
            lib.shim_opencl_handle_release(struct)
        if sub is not None:
            sub.release()

    def wrap(self, native: int) -> OpenCLMemory:
        cl = _cl()
        try:
            buffer = cl.Buffer.from_int_ptr(native, retain=True)
        except cl.Error as e:
            raise BackendError(f"not a cl_mem: {e}") from None
        return OpenCLMemory(buffer, buffer.size, owned=False)

    def native(self, memory: OpenCLMemory) -> int:
        return memory.buffer.int_ptr

    def detached(self, memory: OpenCLMemory) -> None:
        # The caller owns the cl_mem now: keep OpenCL's reference count as it was.
        super().detached(memory)
        _forget_handles(memory)
        if memory.owned:
            _cl().Buffer.from_int_ptr(memory.buffer.int_ptr, retain=True)

    # --- copies --------------------------------------------------------------------------

    def write(self, memory: OpenCLMemory, plan: CopyPlan, host_address: int) -> None:
        if len(plan.shape) == 1:
            self._contiguous(_WRITE, memory, plan.dst_offset, host_address + plan.src_offset,
                             plan.chunk)
            return
        host, plan = plan.host_window(host_address, host_is_src=True)
        for rect in _rectangles(plan):
            self._copy(memory.buffer, host, rect, buffer_is_dst=True)

    def read(self, memory: OpenCLMemory, plan: CopyPlan, host_address: int) -> None:
        if len(plan.shape) == 1:
            self._contiguous(_READ, memory, plan.src_offset, host_address + plan.dst_offset,
                             plan.chunk)
            return
        host, plan = plan.host_window(host_address, host_is_src=False)
        for rect in _rectangles(plan):
            self._copy(memory.buffer, host, rect, buffer_is_dst=False)

    def _contiguous(self, direction: int, memory: OpenCLMemory, offset: int, host: int,
                    nbytes: int) -> None:
        """One run of bytes (a dense buffer's copy): through the native layer, as its served
        copies go, without the rectangle arithmetic and pyopencl's blocking transfer, tens of
        microseconds a copy on PoCL."""
        self._usable()  # (a forked child: refused, saying why)
        code = lib.shim_opencl_transfer(direction, memory.buffer.int_ptr, offset,
                                        ffi.cast("void *", host), 0, 0, nbytes)
        if code != 0:
            what = "write" if direction == _WRITE else "read"
            raise BackendError(f"OpenCL {what} failed: error {code}")

    def _copy(self, buffer, host, rect, buffer_is_dst):
        cl = _cl()
        (src_offset, dst_offset, region, src_pitches, dst_pitches) = rect
        buffer_offset, host_offset = (dst_offset, src_offset) if buffer_is_dst else (src_offset, dst_offset)
        buffer_pitches, host_pitches = (dst_pitches, src_pitches) if buffer_is_dst else (src_pitches, dst_pitches)
        dst, src = (buffer, host) if buffer_is_dst else (host, buffer)
        try:
            cl.enqueue_copy(self.queue, dst, src, buffer_origin=(buffer_offset, 0, 0),
                            host_origin=(host_offset, 0, 0), region=region,
                            buffer_pitches=buffer_pitches, host_pitches=host_pitches,
                            is_blocking=True)
        except cl.Error as e:
            raise BackendError(f"OpenCL {'write' if buffer_is_dst else 'read'} failed: {e}") from None

    def copy(self, src: OpenCLMemory, dst: OpenCLMemory, plan: CopyPlan) -> None:
        self._copy_device(src.buffer, dst.buffer, plan)
        self.queue.finish()

    def _copy_device(self, src, dst, plan: CopyPlan) -> None:
        cl = _cl()
        try:
            try:
                for src_offset, dst_offset, region, src_pitches, dst_pitches in _rectangles(plan):
                    cl.enqueue_copy(self.queue, dst, src, src_origin=(src_offset, 0, 0),
                                    dst_origin=(dst_offset, 0, 0), region=region,
                                    src_pitches=src_pitches, dst_pitches=dst_pitches)
            except cl.Error as e:
                refused = (cl.status_code.MEM_COPY_OVERLAP, cl.status_code.INVALID_VALUE)
                if e.code not in refused or src.int_ptr != dst.int_ptr:
                    raise
                # Within one allocation a driver may refuse rectangles whose bytes do not
                # overlap (PoCL: a crop's element copied to its neighbour's), and OpenCL
                # refuses any whose two sides' pitches differ (CL_INVALID_VALUE: a slice's
                # elements from a row of its parent); run by run, as Halide's own OpenCL
                # runtime copies, each is checked exactly.
                for src_offset, dst_offset in runs(plan):
                    cl.enqueue_copy(self.queue, dst, src, byte_count=plan.chunk,
                                    src_offset=src_offset, dst_offset=dst_offset)
        except cl.Error as e:
            raise BackendError(f"OpenCL device copy failed: {e}") from None

    def sync(self) -> None:
        self.queue.finish()

    # --- kernels -------------------------------------------------------------------------

    def module(self, source: bytes):
        """The compiled module for ``source`` (a shim_cl_module*), compiling it once."""
        import hashlib  # (here, as json, binary_cache: 6 ms of every import shim otherwise)

        key = hashlib.sha256(source).digest()
        entry = self._programs.get(key)
        if entry is None:
            with self._compile_lock:
                entry = self._programs.get(key)
                if entry is None:
                    entry = self._programs[key] = self._compile(source)
        return entry[1]

    def _compile(self, source: bytes):
        # (A first build from source takes seconds; the program cache makes later ones quick.)
        with if_slow(f"compiling a pipeline's OpenCL kernels ({len(source) // 1024 + 1} KiB "
                     f"of source) for {self.name}"):
            program = self._build_program(program_source(source))
        module = lib.shim_opencl_module_new(ffi.cast("void *", program.int_ptr), source, len(source))
        if module == ffi.NULL:
            raise MemoryError("cannot allocate a kernel module")
        return program, module

    def _build_program(self, source: bytes):
        """Build ``source``: from the binary the on-disk program cache holds for it (see
        _program_cache), else from source, then storing the program's binary there."""
        cache = _program_cache()
        key = self._program_cache_key(source) if cache is not None and not _INCLUDE.search(source) else None
        program = None
        if key is not None:
            binary = cache.load(key)  # None if missing or damaged (checked before the driver sees it)
            if binary is not None:
                program = self._build_from_binary(binary)
        if program is None:
            program = self._build_from_source(source)
            if key is not None:
                self._store_binary(cache, key, program)
        return program

    def _build_from_source(self, source: bytes):
        cl = _cl()
        program = cl.Program(self.context, source.decode("utf-8", "replace"))
        try:
            # Never through pyopencl's own cache of binaries (cache_dir=False): it keeps them
            # in $XDG_CACHE_HOME/pyopencl, with pickles beside them, whoever owns that folder.
            program.build(options=self._build_options, cache_dir=False)
        except cl.Error as e:
            try:
                log = program.get_build_info(self._device, cl.program_build_info.LOG)
            except cl.Error:
                log = "(no build log)"
            raise BackendError(f"clBuildProgram failed ({e.code}), build log:\n{log.strip()}"
                               f"{build_failure_hint(log)}") from None
        program_builds["source"] += 1
        return program

    def _build_from_binary(self, binary: bytes):
        """The program built from a cached binary, or None where the driver refuses it (the
        caller then builds from source and replaces the entry)."""
        cl = _cl()
        try:
            program = cl.Program(self.context, [self._device], [binary])
            program.build(options=self._build_options)
        except cl.Error:
            program_builds["refused binary"] += 1
            return None
        program_builds["binary"] += 1
        return program

    def _store_binary(self, cache, key: str, program) -> None:
        cl = _cl()
        try:
            binaries = program.get_info(cl.program_info.BINARIES)  # PoCL compiles its kernels here
        except cl.Error:
            return
        if len(binaries) == 1 and binaries[0] and cache.store(key, bytes(binaries[0])):
            program_builds["stored"] += 1

    def _program_cache_key(self, source: bytes) -> str:
        """Everything the binary of ``source`` depends on (pyopencl adds only its include
        directory to the options: sources with #include are not cached)."""
        import hashlib
        import json

        p, d = self._platform, self._device
        return json.dumps({
            "format": PROGRAM_CACHE_FORMAT,
            "platform": [p.name, p.vendor, p.version],
            "device": [d.name, d.vendor, d.version, d.driver_version],
            "options": self._build_options,
            "source sha256": hashlib.sha256(source).hexdigest(),
        }, sort_keys=True)


def program_source(source: bytes) -> bytes:
    """What a program is built from: Halide's ``source`` with an element offset per buffer
    parameter where the kernel can take one, so that a crop at any offset is launched in place
    (native_stubs/backends/opencl_prototypes.c; the launches in opencl.c read the original
    source's prototypes the same way)."""
    size = ffi.new("size_t *")
    text = lib.shim_opencl_program_source(source, len(source), size)
    if text == ffi.NULL:
        raise MemoryError("cannot rewrite a pipeline's OpenCL source")
    try:
        return ffi.unpack(text, size[0])
    finally:
        lib.shim_opencl_free_source(text)


_WRITE, _READ = 0, 1  # shim_opencl_transfer's directions (abi/shim_backends.h)


def _rectangles(plan: CopyPlan):
    """The plan's rectangle copies, each slice pitch a whole number of rows: OpenCL refuses any
    other (CL_INVALID_VALUE), as CUDA does."""
    return rectangles(plan, whole_rows=True)


def _forget_handles(memory: OpenCLMemory) -> None:
    """Drop every handle into ``memory`` and what launches kept in them."""
    for struct, _ in memory.handles.values():
        lib.shim_opencl_handle_release(struct)
    memory.handles.clear()


# --- the on-disk program cache ----------------------------------------------------------

# Bump when the key or what is stored changes meaning: older entries then miss and age out.
PROGRAM_CACHE_FORMAT = 1
_INCLUDE = re.compile(rb"^[ \t]*#[ \t]*include\b", re.MULTILINE)  # the key cannot see included files

# Programs this process built, by how: "source", "binary" (from the cache), "refused binary"
# (a cached binary the driver would not build: rebuilt from source), "stored" (binaries written).
program_builds: Counter = Counter()


def _program_cache():
    """The on-disk cache of built program binaries: $HALIDE_SHIM_CACHE, else
    $XDG_CACHE_HOME/halide-shim/opencl (see shim/base/binary_cache.py, and shim/base/private_files.py
    for when a folder is not used); None where $HALIDE_SHIM_NO_PROGRAM_CACHE is set (to
    anything but 0). Read at every build."""
    if os.environ.get("HALIDE_SHIM_NO_PROGRAM_CACHE", "").strip() not in ("", "0"):
        return None
    from shim.base import binary_cache

    directory = os.environ.get("HALIDE_SHIM_CACHE") or private_files.cache_root() / "opencl"
    return binary_cache.BinaryCache(directory, "opencl")
