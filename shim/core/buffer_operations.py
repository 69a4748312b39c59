"""The device operations a program asks for on a shim.Buffer (its methods, DLPack exports
and imports, its finalizer), built on the runtime core's (shim/core/runtime.py).

Each runs as a runtime call of its own (shim/core/bridge.py: reported, profiled, DeviceError if it
fails), and, unlike the operations Halide's generated code calls, first waits for the pipeline
calls running on the same elements (families.await_calls).
"""

from __future__ import annotations

from shim.memory import aliasing
from shim.memory import families
from shim.native import flags
from shim.native import interrupts
from shim.core import runtime
from shim.base import sections
from shim.memory.aliasing import has_allocation
from shim.backends.base import interface_of
from shim.core.bridge import E, Failure, run_for_python
from shim.base.errors import ArgumentError, DeviceError
from shim.memory.families import await_calls, locked
from shim.native.flags import DEVICE_DIRTY, HOST_DIRTY
from shim.native import ffi, lib


def adopt(parent_raw, parent_box, view_raw, view_box) -> None:
    """Register a crop or slice of ``parent_raw`` in the parent's family (see aliasing.adopt)."""
    with locked(parent_raw) as family:
        aliasing.adopt(family, parent_raw, parent_box, view_raw, view_box)


def reshape(raw, change) -> None:
    """Buffer's in-place changes of geometry (set_min, translate, transpose, crop, ...):
    ``change(family)`` rewrites what describes the struct, under the family's lock, once the
    pipeline calls using its elements have ended, so that no call sees half of it."""
    with locked(raw) as family:
        await_calls(family, raw)
        change(family)


def mark_dirty(raw, bit: int, value: bool) -> None:
    """Buffer.set_host_dirty / set_device_dirty. Under the family's lock, so that a copy in
    progress on another thread, which clears the bit once it is done, cannot swallow a mark
    made meanwhile (the program wrote the memory after the copy read it). For a member of a
    shared family, through the family's regions; raises DeviceError when the other side
    holds overlapping changes."""
    with locked(raw) as family:
        # A mark waits for the calls writing the buffer; a device-side one for those reading
        # it too: a CPU pipeline reading it would find it newer on the device mid-call and
        # fail (Halide's device_dirty_with_no_device_support).
        await_calls(family, raw, writers_only=not (bit == DEVICE_DIRTY and value))
        if bit == DEVICE_DIRTY and value and not has_allocation(raw):
            raise ArgumentError("dirty", "this Buffer has no device allocation (nor, for a crop, "
                                         "does its parent), so no device copy can hold changes; "
                                         "copy_to_device() or device_malloc() first")
        if not family.shared:
            if value and flags.of(raw) & flags.other_side(bit):
                raise DeviceError(E.halide_error_code_host_and_device_dirty,
                                  str(aliasing.uncopied_changes(bit)), context="set dirty")
            flags.assign(raw, bit, value)
            return
        runtime.in_runtime_call("set dirty", aliasing.mark,
                                E.halide_error_code_copy_to_host_failed if bit == HOST_DIRTY
                                else E.halide_error_code_copy_to_device_failed,
                                family, raw, bit, value, runtime.transfer)


def malloc_device(raw, interface) -> None:
    """Buffer.device_malloc: as halide_device_malloc, and since new device memory holds
    nothing, the host has the data: the next copy_to_device uploads it. (Halide leaves the
    flags alone, and a later copy_to_device of a clean buffer leaves garbage on the device.
    A shared family's regions say so already.) Served by the native layer where the family
    is idle (native_stubs/fast/buffer_families.c)."""
    if lib.shim_buffer_device_malloc(raw, interface) == 0:
        return

    def device_malloc(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            if runtime.lives_elsewhere(raw, interface):  # (halide_device_malloc's refusal)
                raise Failure(E.halide_error_code_incompatible_device_interface,
                              "device_malloc does not move a buffer to another device; "
                              "copy_to_device does")
            if has_allocation(raw):
                return
            runtime.allocate_behind_host(raw, interface, family)

    run_for_python("device_malloc", device_malloc, E.halide_error_code_device_malloc_failed, raw)


def move_device(raw, interface) -> None:
    """Buffer.copy_to_device to another device than the one the buffer is on: once the calls
    using it have finished, what only the device holds comes home, that allocation goes, and
    a new one on ``interface`` gets the data. A family that has had crops or slices shares
    one allocation, which none of its members moves alone. (Decided under the lock: a buffer
    that is no longer elsewhere by then is simply copied to the device.)"""
    def copy_to_device(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            await_calls(family)
            if runtime.lives_elsewhere(raw, interface):
                if family.shared:
                    raise Failure(E.halide_error_code_incompatible_device_interface,
                                  "the buffer and the crops or slices made of it (even ones "
                                  "since dropped) share one allocation, which cannot move for "
                                  "one of them; free its device memory first (device_free)")
                runtime.bring_home(raw, family)
                runtime.free_allocation(raw, family)
            runtime.copy_to_device_of(raw, interface, family)

    run_for_python("copy_to_device", copy_to_device, E.halide_error_code_copy_to_device_failed,
                   raw)


def free_device(raw) -> None:
    """Buffer.device_free: wait for pipeline calls using the allocation, bring what only the
    device holds home (to host memory, if the buffer has any), then free; if the download
    fails, the allocation stays and DeviceError says why. A later device use uploads again.
    Served by the native layer where the family is idle and nothing needs bringing home
    (native_stubs/fast/buffer_families.c)."""
    if lib.shim_buffer_device_free(raw) == 0:
        return

    def device_free(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            await_calls(family)
            runtime.bring_home(raw, family)
            runtime.free_allocation(raw, family)

    run_for_python("device_free", device_free, E.halide_error_code_device_free_failed, raw)


def release(raw, *, copy_back: bool) -> None:
    """A shim.Buffer is being dropped: it leaves its family and gives up its device handle,
    under the family's lock (so that a concurrent allocation cannot attach it meanwhile).
    ``copy_back``: its device results go to host memory first. The memory goes even if that
    download fails; the DeviceError then says what was lost."""
    def device_free(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            if copy_back and family is not None and family.shared:
                family.exposed = True  # (the last member's drop brings the data home)
            try:
                if copy_back:
                    runtime.bring_home(raw, family)
            finally:
                families.unregister_owned(raw)
                if has_allocation(raw):
                    handle = raw.device
                    runtime.set_device(raw, 0, ffi.NULL)
                    if family is not None and handle in family.handles:
                        runtime.drop_handle(family, handle, force=True)

    run_for_python("release a dropped Buffer", device_free,
                   E.halide_error_code_device_free_failed, raw)


def pin_device(raw, backend):
    """Keep ``raw``'s allocation on ``backend`` alive, whatever happens to ``raw``, until the
    returned function is called (a DLPack export: the consumer may outlive the Buffer).
    Returns (unpin, the pinned handle, the allocation it points into); BufferError if ``raw``
    is no longer on ``backend`` (another thread freed or moved it)."""
    with locked(raw) as family:
        handle = raw.device
        if not has_allocation(raw) or raw.device_interface != interface_of(backend):
            raise BufferError(f"the buffer is no longer on {backend.kind}: another thread freed "
                              "or moved its device memory during the export")
        family.add_handle(handle, family.offset_of(handle))
        family.handles[handle][2].exported = True  # never pooled for reuse (Memory.exported)
        memory = family.memory_of(handle)

    def unpin() -> None:
        if families.forking() or families.abandoned(family):
            return  # a forked child: another thread's family, as it left it (see families)
        if sections.inside():  # a finalizer inside the layer's own work (see shim/base/sections.py)
            sections.later(unpin)
            return
        with interrupts.deferred():
            family.lock.acquire()
            try:
                runtime.drop_handle(family, handle)
            finally:
                family.lock.release()

    return unpin, handle, memory


def wrap_device(raw, backend, native: int, offset: int) -> None:
    """Give ``raw`` memory someone else allocated on ``backend`` (DLPack imports), its min
    element ``offset`` bytes in; the memory stays theirs."""
    def wrap_device_memory(uc):
        runtime.wrap(raw, backend, interface_of(backend), native, offset)

    run_for_python("wrap device memory", wrap_device_memory,
                   E.halide_error_code_device_malloc_failed)
