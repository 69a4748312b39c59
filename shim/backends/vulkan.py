"""The Vulkan backend, in C against the Vulkan loader (no Python package).

The device is native_stubs/backends/vulkan.c's: one instance, device and compute queue for the
process, chosen as Halide's runtime chooses (``HL_VK_DEVICE_TYPE``: "cpu", "gpu",
"integrated-gpu", "discrete-gpu", "virtual-gpu", else the first GPU, else the first device;
``HL_VK_LAYERS`` or ``VK_INSTANCE_LAYERS``; ``HL_VK_EXTENSIONS``; or what a program set with
halide_vulkan_set_*). Kernel launches, shader modules and pipelines are in C too
(native_stubs/backends/vulkan_kernels.c), crops at offsets Vulkan cannot bind included, and so
are memory and copies (vulkan_memory.c); this class allocates, hands out handles, and asks the C
for copies, each of which returns once done.

A handle is a shim_vk_handle (abi/shim_backends.h): the VkBuffer and the byte offset of the
buffer's min element. Halide 21's own handle is its allocator's private region struct, which no
code outside its runtime can read.
"""

from __future__ import annotations

import time

from shim.base import sections
from shim.backends.base import Backend, BackendError, Memory, fork_guard
from shim.base.errors import DeviceUnavailable
from shim.native import ffi, lib
from shim.native.regions import CopyPlan

# Bytes for a message from the C side.
_MESSAGE = 512

_HOST_TO_DEVICE, _DEVICE_TO_HOST, _DEVICE_TO_DEVICE = 0, 1, 2


def _message(buffer) -> str:
    return ffi.string(buffer).decode(errors="replace")


def _device_names() -> list[str]:
    """The machine's Vulkan devices, from an instance made for the question; DeviceUnavailable
    where there is no loader or no device."""
    names = ffi.new(f"char[{8 * 1024}]")
    count = lib.shim_vk_probe(names, len(names))
    if count < 0:
        raise DeviceUnavailable(_message(names))
    return [line for line in _message(names).splitlines() if line][:count]


def unavailable_reason() -> str | None:
    """Why this machine has no usable Vulkan device, or None if it has one."""
    try:
        return None if _device_names() else "the Vulkan loader lists no device"
    except DeviceUnavailable as e:
        return str(e)


class VulkanMemory(Memory):
    def __init__(self, native, nbytes: int, owned: bool = True):
        super().__init__(nbytes, owned)
        self.native_memory = native  # shim_vk_memory *
        # handle value -> its shim_vk_handle cdata, kept alive while the handle is out
        self.handles: dict[int, object] = {}


class VulkanBackend(Backend):
    kind = "vulkan"
    index = lib.SHIM_BACKEND_VULKAN
    # kDLVulkan, exported only to a consumer that asks (dl_device=(7, 0)), host memory
    # otherwise, as for OpenCL: a VkBuffer is of use only on the shim's VkDevice
    # (halide_vulkan_acquire_context gives it). ``data`` is the VkBuffer, ``byte_offset`` the
    # buffer's offset in it.
    dlpack_device_type = 7
    dlpack_on_request_only = True
    # After CUDA and after OpenCL. Every GPU vendor that ships Vulkan ships OpenCL too, and on
    # a machine without a GPU both are CPU devices (lavapipe, PoCL): OpenCL then stays the
    # default the README and `python -m shim demo` promise, and its launches are queued where
    # each Vulkan launch waits for its kernel (a pipeline built for Vulkan alone runs on Vulkan
    # whatever the order).
    default_rank = 2

    @classmethod
    def available(cls) -> list[str]:
        """The names of the Vulkan devices on this machine ([] without a loader)."""
        try:
            return _device_names()
        except Exception:  # noqa: BLE001 - never raises: shim.devices() lists what is there
            return []

    def __init__(self):
        super().__init__()
        self._usable = fork_guard("Vulkan")
        message = ffi.new(f"char[{_MESSAGE}]")
        status = lib.shim_vk_start(message, _MESSAGE)
        if status != 0:
            raise DeviceUnavailable(f"no usable Vulkan device: {_message(message)} "
                                    f"(Halide error {status})")
        facts = ffi.new("uint64_t[8]")
        lib.shim_vk_device_facts(facts)
        self.alignment = max(int(facts[0]), 1)  # minStorageBufferOffsetAlignment
        self._memory_size = int(facts[1]) or None
        self._version = (int(facts[2]), int(facts[3]))
        self.max_storage_buffer_range = int(facts[4])
        self._timestamps = bool(facts[5])
        # False with $HALIDE_SHIM_VULKAN_STAGED_COPIES=1: every copy then takes the staged path
        # (what a discrete GPU's device-local memory needs), also on lavapipe.
        self.maps_memory = bool(facts[6])
        # Whether launches are left running (the device's timeline semaphores), False with
        # $HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH=1 or on a Vulkan 1.0/1.1 device.
        self.launches_async = bool(facts[7])
        self._modules: dict[bytes, object] = {}  # source digest -> shim_vk_module *
        self._module_lock = sections.Lock()
        # Pipelines' own allocations are served in C from this backend's pool (which lives as
        # long as the process: the backend registry keeps every backend).
        lib.shim_vk_serve_allocations(self._pool.native)
        self.serves_allocations = True
        self.transfers.served = self.index

    @property
    def name(self) -> str:
        return ffi.string(lib.shim_vk_device_name()).decode(errors="replace")

    def compute_capability(self) -> tuple[int, int]:
        # Halide's Vulkan runtime reports the device's Vulkan API version.
        return self._version

    def memory_size(self) -> int | None:
        return self._memory_size

    def _check(self, status: int, message, what: str) -> None:
        if status != 0:
            raise BackendError(f"{what}: {_message(message)}")

    # --- memory --------------------------------------------------------------------------

    # Launches are not waited for (where the device has timeline semaphores), but every
    # submission runs after all submitted before it, so memory needs no settling before reuse:
    # the next holder's work follows the last one's. Whatever touches it from the host, or
    # gives it back to the driver, waits in C first (shim_vk_drain).

    def _allocate_new(self, nbytes: int) -> VulkanMemory:
        self._usable()
        message = ffi.new(f"char[{_MESSAGE}]")
        native = lib.shim_vk_allocate(nbytes, message, _MESSAGE)
        if native == ffi.NULL:
            raise BackendError(_message(message))
        return VulkanMemory(native, nbytes)

    def _free_now(self, memory: VulkanMemory) -> None:
        _forget_handles(memory)
        native, memory.native_memory = memory.native_memory, ffi.NULL
        if native != ffi.NULL:
            lib.shim_vk_free(native)

    # The pool holds shim_vk_memory pointers, which native_stubs/devices/served.c takes and
    # frees too: a Memory object goes in as its pointer and comes out as a new object.

    def into_pool(self, memory: VulkanMemory) -> int:
        _forget_handles(memory)
        native, memory.native_memory = memory.native_memory, ffi.NULL
        return int(ffi.cast("uintptr_t", native))

    def out_of_pool(self, native: int, capacity: int) -> VulkanMemory:
        return VulkanMemory(ffi.cast("shim_vk_memory *", native), capacity)

    def adopt_served(self, native: int, nbytes: int, capacity: int, handles: list) -> VulkanMemory:
        memory = self.out_of_pool(native, capacity)
        memory.nbytes = nbytes
        # The handles the native layer made (shim_vk_handle_release frees them).
        for handle in handles:
            memory.handles[handle] = ffi.cast("shim_vk_handle *", handle)
        self._live[id(memory)] = memory
        return memory

    def placement(self, offset: int) -> int:
        # Where the core can place an allocation so that a crop lands on a bindable offset.
        return -offset % self.alignment

    def handle(self, memory: VulkanMemory, offset: int, nbytes: int) -> int:
        struct = ffi.new("shim_vk_handle *")
        struct.buffer = lib.shim_vk_buffer_of(memory.native_memory)
        struct.offset, struct.nbytes = offset, nbytes
        struct.memory = memory.native_memory
        value = int(ffi.cast("uintptr_t", struct))
        memory.handles[value] = struct
        return value

    def release_handle(self, memory: VulkanMemory, handle: int) -> None:
        struct = memory.handles.pop(handle, None)
        if struct is not None:
            lib.shim_vk_handle_release(struct)

    def wrap(self, native: int) -> VulkanMemory:
        if native == 0:
            raise BackendError("cannot wrap VK_NULL_HANDLE")
        self._usable()
        wrapped = lib.shim_vk_wrap(native)
        if wrapped == ffi.NULL:
            raise BackendError("out of memory wrapping a VkBuffer")
        return VulkanMemory(wrapped, 0, owned=False)

    def native(self, memory: VulkanMemory) -> int:
        return int(lib.shim_vk_buffer_of(memory.native_memory))

    def detached(self, memory: VulkanMemory) -> None:
        # The caller owns the VkBuffer now; its VkDeviceMemory stays bound to it for the life
        # of the process (the caller has no way to free it), as the host device keeps its
        # detached memory.
        super().detached(memory)
        _forget_handles(memory)
        _detached.append(memory)
        self.sync()  # (the caller's own work on it follows none of the shim's barriers)

    # --- copies --------------------------------------------------------------------------

    def _transfer(self, direction: int, src, dst, host: int, plan: CopyPlan) -> None:
        self._usable()
        outer = len(plan.shape) - 1
        shape = ffi.new("int64_t[]", list(plan.shape))
        src_strides = ffi.new("int64_t[]", list(plan.src_strides) or [0])
        dst_strides = ffi.new("int64_t[]", list(plan.dst_strides) or [0])
        message = ffi.new(f"char[{_MESSAGE}]")
        status = lib.shim_vk_transfer(direction, src, dst, ffi.cast("void *", host), shape,
                                      src_strides, dst_strides, outer, plan.src_offset,
                                      plan.dst_offset, message, _MESSAGE)
        self._check(status, message, "Vulkan copy")

    def write(self, memory: VulkanMemory, plan: CopyPlan, host_address: int) -> None:
        self._transfer(_HOST_TO_DEVICE, ffi.NULL, memory.native_memory, host_address, plan)

    def read(self, memory: VulkanMemory, plan: CopyPlan, host_address: int) -> None:
        self._transfer(_DEVICE_TO_HOST, memory.native_memory, ffi.NULL, host_address, plan)

    def copy(self, src: VulkanMemory, dst: VulkanMemory, plan: CopyPlan) -> None:
        self._transfer(_DEVICE_TO_DEVICE, src.native_memory, dst.native_memory, 0, plan)

    def sync(self) -> None:
        self._usable()
        status = lib.shim_vk_sync()
        if status != 0:
            raise BackendError(f"vkQueueWaitIdle failed (VkResult {status})")

    # --- kernels -------------------------------------------------------------------------

    def module(self, source: bytes):
        """The module for ``source`` (a shim_vk_module*), made once per source."""
        import hashlib  # (here: 4 ms of every import shim otherwise)

        self._usable()
        key = hashlib.sha256(source).digest()
        module = self._modules.get(key)
        if module is None:
            with self._module_lock:
                module = self._modules.get(key)
                if module is None:
                    message = ffi.new(f"char[{_MESSAGE}]")
                    module = lib.shim_vk_module_new(source, len(source), message, _MESSAGE)
                    if module == ffi.NULL:
                        raise BackendError(f"Vulkan module: {_message(message)}")
                    self._modules[key] = module
        return module

    # --- DLPack ---------------------------------------------------------------------------

    def dlpack_data(self, handle: int) -> tuple[int, int]:
        struct = ffi.cast("shim_vk_handle *", handle)
        return int(struct.buffer), int(struct.offset)

    def dlpack_consumer_stream(self, stream):
        """DLPack defines no stream for Vulkan: None (the export waits for the shim's work) or
        -1 (no synchronization)."""
        if stream is None or stream == -1:
            return stream
        raise BufferError(f"stream {stream}: DLPack has no stream for Vulkan; pass None (the "
                          "export waits for the shim's Vulkan work) or -1")

    def make_visible(self, consumer, memory: VulkanMemory) -> None:
        """The consumer's own submissions follow none of the shim's barriers: every launch
        still running finishes first."""
        if consumer != -1:
            self.sync()

    def check_dlpack_memory(self, data: int, byte_offset: int, nbytes: int) -> None:
        """Refuse (BufferError) a tensor's ``data`` unless it is a VkBuffer of the shim's
        holding ``nbytes`` from ``byte_offset``: any other value would reach the driver as a
        handle it cannot check."""
        for memory in list(self._live.values()):
            if memory.native_memory != ffi.NULL and self.native(memory) == data:
                if memory.capacity and byte_offset + nbytes > memory.capacity:
                    raise BufferError(f"the tensor spans bytes [{byte_offset}, "
                                      f"{byte_offset + nbytes}) of a VkBuffer of "
                                      f"{memory.capacity} bytes")
                return
        raise BufferError(f"data {data:#x} is not a VkBuffer of the shim's Vulkan device")

    # --- device timing, for profiles: timestamps the device writes when it reaches a mark -----

    # Every submission waits for the ones before it, and each mark is a submission of its own
    # that is waited for: a mark's time is when the device finished the work before it.

    def _timestamp(self) -> int:
        ns = ffi.new("uint64_t *")
        status = lib.shim_vk_timestamp(ns)
        if status != 0:
            raise BackendError(f"a Vulkan timestamp failed (VkResult {status})")
        return int(ns[0])

    def timing_origin(self):
        if not self._timestamps:
            return None
        self._usable()
        device = self._timestamp()
        return time.perf_counter_ns(), device

    def timing_track(self, stream) -> str:
        return f"Vulkan queue ({self.name})"

    def timing_marker(self, stream):
        return self._timestamp()

    def timing_read(self, origin, before, after) -> tuple[int, int]:
        host, device = origin
        return host + before - device, max(after - before, 0)


def _forget_handles(memory: VulkanMemory) -> None:
    """Drop every handle into ``memory`` (freeing those the native layer made)."""
    for struct in memory.handles.values():
        lib.shim_vk_handle_release(struct)
    memory.handles.clear()


# Memory whose VkBuffer a caller took with detach_native, kept (see VulkanBackend.detached).
_detached: list[VulkanMemory] = []
