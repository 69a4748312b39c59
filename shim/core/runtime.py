"""The device-interface operations behind the shim's interfaces: the Python runtime core.

The native library validates each call as Halide 21 does and answers the no-ops itself
(native_stubs/devices/device_generic.c); what reaches this module is real work, through the callbacks
of shim/core/callbacks.py. Each operation takes the lock of the buffer's allocation family
(shim/memory/families.py), re-checks the state it was called for, has the backend move the bytes,
and updates the flags, clearing a dirty bit only after the copy it describes has completed
(backends return from read, write and copy only then: see shim/backends/base.py). Return
codes are those of Halide's generic layer; a failure raises bridge.Failure, which
shim/core/bridge.py reports to the C caller.

The helpers below the operations are also what the operations a program asks for build on
(shim/core/buffer_operations.py, shim/core/call_uses.py).
"""

from __future__ import annotations

import numpy as np

from shim.memory import aliasing
from shim.memory import families
from shim.native import flags
from shim.profiling import profiler
from shim.memory.aliasing import has_allocation
from shim.backends.base import BackendError, interface_of
from shim.core.bridge import E, Failure, run_for_python
from shim.backends.devices import backend_for_interface, default_device
from shim.memory.families import Family, await_calls, locked
from shim.native.flags import DEVICE_DIRTY, HOST_DIRTY
from shim.native import ffi, lib
from shim.native.regions import Layout, NegativeStrides, mirror_plan, overlap_plan

# --- the operations, as Halide's device interface calls them -----------------------------

def device_malloc(uc, raw, interface):
    with locked(raw) as family:
        if has_allocation(raw):
            return  # another thread allocated it while we waited
        allocate(raw, interface, family)


def device_free(uc, raw, interface):
    with locked(raw) as family:
        await_calls(family)
        free_allocation(raw, family)


def device_sync(uc, raw, interface):
    if not aliasing.is_proxy(interface):
        backend_for_interface(interface).sync()


def device_release(uc, interface):
    if not aliasing.is_proxy(interface):
        backend = backend_for_interface(interface)
        release_unused(backend)  # Halide's device_release empties its free list too
        backend.release()


def copy_to_host(uc, raw, interface):
    with locked(raw) as family:
        await_calls(family, raw, writers_only=True)
        if family is not None and family.shared:
            on_shared(aliasing.download, family, raw, transfer)
        elif flags.of(raw) & DEVICE_DIRTY:
            _download(raw, family)


def copy_to_device(uc, raw, interface):
    with locked(raw) as family:
        await_calls(family, raw)
        copy_to_device_of(raw, interface, family)


def device_and_host_malloc(uc, raw, interface):
    with locked(raw) as family:
        if family is not None and family.shared:
            raise Failure(E.halide_error_code_device_malloc_failed,
                          "a crop or slice shares its parent's host memory")
        nbytes = _span(raw, E.halide_error_code_device_malloc_failed)
        host = lib.halide_malloc(uc, nbytes)
        if host == ffi.NULL:
            raise Failure(E.halide_error_code_device_malloc_failed, "out of host memory")
        raw.host = ffi.cast("uint8_t *", host)
        try:
            allocate(raw, interface, family)
        except BaseException:
            lib.halide_free(uc, host)
            raw.host = ffi.NULL
            raise


def device_and_host_free(uc, raw, interface):
    with locked(raw) as family:
        _drop_device(raw, family)
        if raw.host != ffi.NULL:
            lib.halide_free(uc, raw.host)
            raw.host = ffi.NULL
        flags.assign(raw, flags.DIRTY, False)


def wrap_native(uc, raw, native, interface):
    wrap(raw, backend_for_interface(interface), interface, native, 0)


def detach_native(uc, raw, interface):
    with locked(raw) as family:
        if family is not None and family.shared and not aliasing.is_proxy(interface):
            raise Failure(E.halide_error_code_device_detach_native_failed,
                          "a crop or slice's allocation belongs to its family")
        _drop_device(raw, family, free=False)


def device_crop(uc, src, dst, interface):
    layout = Layout.of(src)
    coords = [dst.dim[i].min for i in range(dst.dimensions)]
    _crop_into(src, dst, interface, layout.offset_of(coords))


def device_slice(uc, src, slice_dim, slice_pos, dst, interface):
    layout = Layout.of(src)
    kept = [dst.dim[i].min for i in range(dst.dimensions)]
    coords = kept[:slice_dim] + [slice_pos] + kept[slice_dim:]
    _crop_into(src, dst, interface, layout.offset_of(coords))


def device_release_crop(uc, raw, interface):
    with locked(raw) as family:
        if family is not None and family.has_member(raw):
            on_shared(aliasing.absorb, family, raw, False)  # its changes stay with the family
        _drop_device(raw, family)


def initialize_kernels(uc, state_ptr, src, size, interface):
    """A pipeline's GPU module, compiled (once per source) by the backend of ``interface``."""
    source = bytes(ffi.buffer(src, max(size - 1, 0)))  # size counts the terminating NUL
    state_ptr[0] = ffi.cast("void *", backend_for_interface(interface).module(source))


def device_start(uc, interface):
    """A pipeline's first use of a GPU API before Python's: the backend and its context."""
    backend_for_interface(interface)


def compute_capability(uc, major, minor, interface):
    if aliasing.is_proxy(interface):
        major[0] = minor[0] = 0
    else:
        major[0], minor[0] = backend_for_interface(interface).compute_capability()


def buffer_copy(uc, src, dst_interface, dst):
    """halide_buffer_copy: the overlap of src's and dst's boxes, into dst's host memory
    (dst_interface NULL) or its device allocation; the same choice of paths as Halide's."""
    with locked(src, dst) as (src_family, dst_family):
        if src is dst or families.address_of(src) == families.address_of(dst):
            dst_family = src_family
        if dst_interface != ffi.NULL and dst.device_interface not in (ffi.NULL, dst_interface):
            raise Failure(E.halide_error_code_incompatible_device_interface,
                          "buffer_copy does not switch a buffer's device interface")
        if dst_interface != ffi.NULL and not dst.device:
            dst_family = allocate(dst, dst_interface, dst_family)
            if families.address_of(src) == families.address_of(dst):
                src_family = dst_family  # (a copy onto itself: the source has it now too)
        src_layout, dst_layout = Layout.of(src), Layout.of(dst)
        if src_layout.elem_size != dst_layout.elem_size:
            raise Failure(E.halide_error_code_device_buffer_copy_failed,
                          "source and destination element sizes differ")
        src_flags = flags.of(src)
        from_device_valid = bool(src.device) and (src.host == ffi.NULL or not src_flags & HOST_DIRTY)
        from_host_valid = src.host != ffi.NULL and (not src_flags & DEVICE_DIRTY or src.device == 0)
        to_device = dst_interface != ffi.NULL
        if not to_device and dst.host == ffi.NULL:
            raise Failure(E.halide_error_code_host_is_null, "the destination has no host memory")

        def copy_plan(src_base, dst_base):
            return overlap_plan(src_layout, dst_layout, src_base, dst_base)

        same_backend = (to_device and src.device
                        and lib.shim_backend_of(src.device_interface) == lib.shim_backend_of(dst_interface))
        if from_device_valid and same_backend:
            src_family, src_offset = _allocation(src, src_family)
            dst_family, dst_offset = _allocation(dst, dst_family)
            copy = copy_plan(src_offset, dst_offset)
            with profiler.timed_copy(dst_family.backend, "device copy", copy.nbytes):
                dst_family.backend.copy(src_family.memory, dst_family.memory, copy)
            dst_family.backend.transfers.add("device_copied", copy.nbytes)
        elif not to_device and from_host_valid:
            copy = copy_plan(0, 0)
            np.copyto(copy.dst_host_view(_host_address(dst)),
                      copy.src_host_view(_host_address(src)))
        elif not to_device and from_device_valid:
            src_family, src_offset = _allocation(src, src_family)
            _read(src_family, copy_plan(src_offset, 0), _host_address(dst))
        else:
            if not from_host_valid:
                if not (from_device_valid and src.host != ffi.NULL):
                    raise Failure(E.halide_error_code_incompatible_device_interface,
                                  "no copy path: the source's valid data is on another device "
                                  "and neither buffer has host memory")
                _download(src, src_family)  # bounce through the source's host memory
            dst_family, dst_offset = _allocation(dst, dst_family)
            _write(dst_family, copy_plan(0, dst_offset), _host_address(src))
        if families.address_of(src) != families.address_of(dst):
            flags.put_dirty(dst, DEVICE_DIRTY if to_device else HOST_DIRTY)
            if dst_family is not None and dst_family.has_member(dst) \
                    and not dst_family.in_use(families.address_of(dst)):
                # A crop written outside a call: its box is newer on that side for the whole
                # family (a parent read after it brings it over), as after a call's output.
                # (In a call, the call's end takes it in.)
                on_shared(aliasing.absorb, dst_family, dst, True)


# --- allocations ---------------------------------------------------------------------------

def allocate(raw, interface, family: Family | None) -> Family:
    """Give ``raw`` a device allocation; called with its family's lock held. A member of a
    shared family aliases the family's allocation, made for the whole root if needed."""
    if aliasing.is_proxy(interface):  # "on the device the parent will be on": the default
        interface = interface_of(default_device())
    backend = backend_for_interface(interface)
    if family is not None and family.shared:
        if family.memory is None:
            try:
                aliasing.allocate(family, backend, raw)
            except (BackendError, NegativeStrides) as e:
                raise Failure(E.halide_error_code_device_malloc_failed, str(e)) from e
            profiler.memory_changed(backend)
        elif family.backend is not backend:
            raise Failure(E.halide_error_code_incompatible_device_interface,
                          f"the buffer's parent lives on {family.backend.name}")
        else:
            aliasing.attach(family, raw)
        return family
    nbytes = _span(raw, E.halide_error_code_device_malloc_failed)
    try:
        memory = (backend.allocate_for(Layout.of(raw), raw.type.code, nbytes)
                  if backend.shaped_memory else backend.allocate(nbytes))
    except BackendError as e:
        raise Failure(E.halide_error_code_device_malloc_failed, str(e)) from e
    profiler.memory_changed(backend)
    if family is None:
        family = families.family_for(raw, backend)
    family.backend, family.memory = backend, memory
    handle = backend.handle(memory, 0, nbytes)
    family.add_handle(handle, 0)
    set_device(raw, handle, interface)
    return family


def allocate_behind_host(raw, interface, family: Family | None) -> Family:
    """Allocate for a Buffer operation. New device memory holds nothing, so where the buffer
    has host memory that holds the data: it is marked host-dirty *before* the handle is
    published, or a lock-free copy_to_device on another thread could find the buffer
    allocated and clean and use the garbage. (Halide leaves the flags alone: a clean buffer
    copied to a new allocation stays garbage there.)"""
    if raw.host != ffi.NULL and (family is None or not family.shared) \
            and not _output_of_a_running_call(family, raw):
        flags.assign(raw, HOST_DIRTY, True)
    return allocate(raw, interface, family)


def _output_of_a_running_call(family: Family | None, raw) -> bool:
    """Whether a pipeline call running now writes ``raw`` (so uploading it would be wasted)."""
    if family is None:  # a fast call's numpy output (native_stubs/fast/run.h) has no family
        return lib.shim_call_replaces(lib.shim_current_call(), raw)
    address = families.address_of(raw)
    return any(use.replaces and use.address == address for use in family.uses)


def wrap(raw, backend, interface, native: int, offset: int) -> None:
    """Give ``raw`` memory someone else allocated on ``backend``, its min element ``offset``
    bytes in; the memory stays theirs."""
    with locked(raw) as family:
        if family is not None and family.shared:
            raise Failure(E.halide_error_code_device_malloc_failed,
                          "a crop or slice aliases its parent's allocation")
        if raw.device:
            raise Failure(E.halide_error_code_device_malloc_failed,
                          "the buffer already has a device allocation")
        try:
            memory = backend.wrap(native)
        except BackendError as e:
            raise Failure(E.halide_error_code_device_malloc_failed, str(e)) from e
        family = family or families.family_for(raw, backend)
        family.backend, family.memory = backend, memory
        handle = backend.handle(memory, offset, max(memory.nbytes - offset, 0))
        family.add_handle(handle, offset)
        set_device(raw, handle, interface)


def _crop_into(src, dst, interface, dst_min_offset) -> None:
    if aliasing.is_proxy(interface):
        return  # the parent has no allocation yet: neither has the crop, as in Halide
    with locked(src) as family:
        family, src_offset = _allocation(src, family)
        offset = src_offset + dst_min_offset
        nbytes = _span(dst, E.halide_error_code_device_crop_failed)
        handle = family.backend.handle(family.memory, offset, nbytes)
        family.add_handle(handle, offset)
        set_device(dst, handle, interface)


def free_allocation(raw, family: Family | None) -> None:
    """Drop ``raw``'s allocation (what only the device held is lost: see bring_home)."""
    _drop_device(raw, family)
    if family is not None and family.has_member(raw):
        family.refresh_bits(raw)
    else:
        flags.assign(raw, DEVICE_DIRTY, False)


def bring_home(raw, family: Family | None) -> None:
    """Before an allocation goes: what only the device holds goes to host memory (if the
    buffer has any); a failure is copy_to_host's."""
    if family is None or family.shared or not raw.device or raw.host == ffi.NULL \
            or not flags.of(raw) & DEVICE_DIRTY:
        return
    try:
        _download(raw, family)
    except BackendError as e:
        raise Failure(E.halide_error_code_copy_to_host_failed,
                      f"copying the device's results home first failed: {e}") from e


def _drop_device(raw, family: Family | None, *, free: bool = True) -> None:
    if aliasing.is_proxy(raw.device_interface):
        return  # a member without a handle of its own: nothing to drop
    member = family is not None and family.has_member(raw)
    if raw.device and family is not None:
        drop_handle(family, raw.device, free=free, active=raw)
    if member:
        # Still in the family: the proxy stands for the allocation the others hold or will.
        set_device(raw, families.address_of(raw), aliasing.PROXY)
    else:
        set_device(raw, 0, ffi.NULL)


def drop_handle(family: Family, handle: int, *, free: bool = True, active=None,
                force: bool = False) -> None:
    """Give up one handle into the family's memory. Dropping the last one downloads what only
    the device holds first, unless no member is left and none had its host memory seen (then
    nobody can read it); if that fails the memory stays (and the error is raised), unless
    ``force``: a Buffer being dropped gives its memory back whatever happens."""
    if family.shared and family.device_regions and family.last_handle(handle) \
            and (family.members or family.exposed):
        try:
            on_shared(aliasing.download_all, family, transfer, active)  # never drop device-only data
        except BaseException:
            if force:
                _memory_went(family.drop_handle(handle, free=free))
            raise
    _memory_went(family.drop_handle(handle, free=free))


def _memory_went(backend) -> None:
    if backend is not None:
        profiler.memory_changed(backend)


def release_unused(backend) -> int:
    """Give the backend's pooled allocations back to the driver; how many there were."""
    released = backend.release_unused()
    if released:
        profiler.memory_changed(backend)
    return released


def set_device(raw, handle: int, interface) -> None:
    lib.shim_buffer_set_device(raw, handle, interface)


# --- copies --------------------------------------------------------------------------------

def copy_to_device_of(raw, interface, family: Family | None) -> None:
    """copy_to_device, with the family's lock held and the calls using ``raw`` finished."""
    if family is not None and family.shared:
        if lives_elsewhere(raw, interface) and not aliasing.is_proxy(interface):
            raise Failure(E.halide_error_code_incompatible_device_interface,
                          "the buffer lives on another device interface")
        family = allocate(raw, interface, family)
        on_shared(aliasing.upload_all, family, transfer, raw)
        return
    if raw.device and raw.device_interface != interface:
        raise Failure(E.halide_error_code_incompatible_device_interface,
                      "the buffer lives on another device interface")
    _upload(raw, interface, family)


def lives_elsewhere(raw, interface) -> bool:
    """Whether ``raw`` has an allocation on another interface than ``interface``."""
    return has_allocation(raw) and raw.device_interface != interface


def _upload(raw, interface, family: Family | None) -> None:
    """copy_to_device of a buffer outside a shared family, allocating on ``interface`` if
    it has no allocation yet."""
    if not raw.device:
        family = allocate_behind_host(raw, interface, family)
    bits = flags.of(raw)
    if not bits & HOST_DIRTY:
        return
    if bits & DEVICE_DIRTY:
        raise Failure(E.halide_error_code_copy_to_device_failed,
                      "the buffer is both host-dirty and device-dirty")
    family, offset = _allocation(raw, family)
    _write(family, mirror_plan(Layout.of(raw), offset, to_device=True), _host_address(raw))
    flags.assign(raw, HOST_DIRTY, False)


def _download(raw, family: Family | None) -> None:
    """Device -> host for a device-dirty buffer; clears device_dirty once the data is there."""
    if flags.of(raw) & HOST_DIRTY:
        raise Failure(E.halide_error_code_copy_to_host_failed,
                      "the buffer is both host-dirty and device-dirty")
    if raw.host == ffi.NULL:
        raise Failure(E.halide_error_code_copy_to_host_failed, "the buffer has no host memory")
    family, offset = _allocation(raw, family)
    _read(family, mirror_plan(Layout.of(raw), offset, to_device=False), _host_address(raw))
    flags.assign(raw, DEVICE_DIRTY, False)


def _write(family: Family, copy, host_address: int) -> None:
    with profiler.timed_copy(family.backend, "upload", copy.nbytes):
        family.backend.write(family.memory, copy, host_address)
    family.backend.transfers.add("uploaded", copy.nbytes)


def _read(family: Family, copy, host_address: int) -> None:
    with profiler.timed_copy(family.backend, "download", copy.nbytes):
        family.backend.read(family.memory, copy, host_address)
    family.backend.transfers.add("downloaded", copy.nbytes)


def transfer(family: Family, copy, host_address: int, to_device: bool) -> None:
    """The one copy shim/memory/aliasing.py's operations ask for, between host memory and the
    family's allocation."""
    (_write if to_device else _read)(family, copy, host_address)


def _allocation(raw, family: Family | None) -> tuple[Family, int]:
    """The family and byte offset of the allocation ``raw``'s handle points into."""
    if family is None or raw.device not in family.handles:
        raise Failure(E.halide_error_code_internal_error,
                      f"device handle {raw.device:#x} was not made by this runtime")
    return family, family.offset_of(raw.device)


def _host_address(raw) -> int:
    return int(ffi.cast("uintptr_t", raw.host))


def _span(raw, failure_code: int) -> int:
    span = ffi.new("uint64_t *")
    if lib.shim_buffer_span(raw, span):  # (the common case, without a Layout)
        return span[0]
    try:
        return Layout.of(raw).nbytes_span
    except NegativeStrides as e:
        raise Failure(failure_code, str(e)) from None


# --- shared families -----------------------------------------------------------------------

def on_shared(operation, family: Family, *args) -> None:
    """Run one of shim/memory/aliasing.py's operations on a shared family; a conflict is a failure
    with host_and_device_dirty."""
    try:
        operation(family, *args)
    except aliasing.Conflict as e:
        raise Failure(E.halide_error_code_host_and_device_dirty, str(e)) from None


def in_runtime_call(what: str, operation, failure_code: int, family: Family, *args) -> None:
    """Run one of shim/memory/aliasing.py's operations on a shared family for a Python caller:
    DeviceError if it fails (a conflict: host_and_device_dirty)."""
    def shared_operation(uc):
        on_shared(operation, family, *args)

    shared_operation.__name__ = operation.__name__  # (for profiles)
    run_for_python(what, shared_operation, failure_code)
