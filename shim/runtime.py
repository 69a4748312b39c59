"""The Python runtime core: the device-interface operations behind the shim's interfaces.

The native library validates each call as Halide 21 does and answers the no-ops itself
(native_stubs/device_generic.c); what reaches this module is real work. Each operation takes
the lock of the buffer's allocation family (shim/families.py), re-checks the state it was
called for, has the backend move the bytes, and updates the flags, clearing a dirty bit only
after the copy it describes has completed. Return codes are those of Halide's generic layer.

Errors never escape as exceptions into C: a failure is reported through halide_error (so the
message reaches the caller's call context) and returned as Halide's error code; the Python
exception behind it is kept for the caller, who raises shim.DeviceError from it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

from shim import aliasing, families, interrupts, profiler, streams
from shim.backends.base import BackendError, interface_of
from shim.devices import backend_for_interface, default_device
from shim.errors import ArgumentError, DeviceError
from shim.families import Family, Use, locked
from shim.native import CallContext, ffi, lib
from shim.regions import Layout, NegativeStrides, host_memory, intersect, plan

HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty
E = lib  # Halide's error codes are enum constants of the native library


class Failure(Exception):
    """An operation refused or failed with a specific Halide error code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


# --- reporting -----------------------------------------------------------------------------

# Exceptions behind failures, by call context id, for the caller to chain from.
_exceptions: dict[int, BaseException] = {}
_exceptions_guard = threading.Lock()  # only for this dict, never held across work


def _report(user_context, code: int, message: str, exception: BaseException) -> int:
    lib.halide_error(user_context, (message.rstrip() + "\n").encode("utf-8", "replace"))
    call = lib.shim_current_call()
    if call != ffi.NULL:
        with _exceptions_guard:
            _exceptions.setdefault(lib.shim_call_id(call), exception)
    return code


def take_exception(call_id: int) -> BaseException | None:
    """The exception behind the first failure reported in a call context, if any."""
    with _exceptions_guard:
        return _exceptions.pop(call_id, None)


def guarded(operation, failure_code: int, user_context, *args) -> int:
    """Run one operation for a C caller: its result, or a reported error code."""
    profiled = profiler.begin_call(operation, args)
    result = _run_guarded(operation, failure_code, user_context, args)
    profiler.end(profiled, result)
    return result


def _run_guarded(operation, failure_code: int, user_context, args) -> int:
    name = operation.__name__
    try:
        operation(user_context, *args)
        return E.halide_error_code_success
    except Failure as e:
        return _report(user_context, e.code, f"{name}: {e}", e)
    except BackendError as e:
        return _report(user_context, failure_code, f"{name} failed: {e}", e)
    except BaseException as e:  # noqa: BLE001 - nothing may unwind into C
        return _report(user_context, failure_code,
                       f"{name} failed: {type(e).__name__}: {e}", e)


def raise_failure(result: int, message: str, cause: BaseException | None, what: str):
    """Raise what a failed runtime call stands for: DeviceError, unless it failed because the
    program is being interrupted or is exiting (KeyboardInterrupt, SystemExit), which must
    reach the program as they are, never as an error a ``except ShimError`` would swallow."""
    if cause is not None and not isinstance(cause, Exception):
        raise cause
    raise DeviceError(result, message, context=what) from cause


@contextmanager
def runtime_call(what: str):
    """Make the calling thread's runtime calls report into a fresh call context, and raise
    DeviceError for a failing one. Yields a ``check(result)`` function."""
    with interrupts.deferred():
        context = CallContext.begin()
        try:
            lib.shim_call_set_stream(context.pointer, ffi.cast("void *", streams.current()))
            previous = lib.shim_call_enter(context.pointer)

            def check(result: int) -> None:
                if result != 0:
                    raise_failure(result, context.errors().strip(), take_exception(context.id), what)

            try:
                yield check
            finally:
                lib.shim_call_leave(previous)
        finally:
            context.end()


def run_for_python(what: str, operation, failure_code: int, *args) -> None:
    """Run a device-layer operation for a Python caller (a Buffer method) as the C callbacks
    run them for Halide: reported into a fresh call context, profiled, and raised as
    DeviceError (or KeyboardInterrupt) if it fails."""
    with runtime_call(what) as check:
        check(guarded(operation, failure_code, ffi.NULL, *args))


# --- pipeline calls in flight --------------------------------------------------------------

def _inside_pipeline_call() -> bool:
    """Whether the calling thread works for a running pipeline call (its generated code, on
    the caller's thread or one of Halide's workers)."""
    call = lib.shim_current_call()
    return call != ffi.NULL and lib.shim_call_in_pipeline(call)


def _await_calls(family: Family | None, raw=None, *, writers_only: bool = False) -> None:
    """Called with the family's lock held, by an operation a program asked for: wait, with
    the lock released, until no running pipeline call uses the elements ``raw`` covers (all
    the family's, for None): neither its kernels nor its flags may change under it. A
    pipeline's own device calls never wait (they are its generated code, ordered as Halide
    orders them), and a call holds no uses while it prepares its buffers (PreparedCall), so
    no two calls ever wait for each other."""
    if family is None or not family.uses or _inside_pipeline_call():
        return
    member = family.members.get(families.address_of(raw)) if family.shared and raw is not None else None
    box = member.box if member is not None else None
    while any(_conflicts(use, box, writers_only) for use in family.uses):
        if interrupts.take_pending():
            raise KeyboardInterrupt
        family.lock.wait(0.05)


def _conflicts(use: Use, box, writers_only: bool) -> bool:
    if writers_only and not use.output:
        return False
    return box is None or use.box is None or intersect(box, use.box) is not None


# --- helpers -------------------------------------------------------------------------------

def _flags(raw) -> int:
    return lib.shim_flags_get(raw)


def _set_device(raw, handle: int, interface) -> None:
    lib.shim_buffer_set_device(raw, handle, interface)


def _allocation(raw, family: Family | None) -> tuple[Family, int]:
    """The family and byte offset of the allocation ``raw``'s handle points into."""
    if family is None or raw.device not in family.handles:
        raise Failure(E.halide_error_code_internal_error,
                      f"device handle {raw.device:#x} was not made by this runtime")
    return family, family.offset_of(raw.device)


def _host_address(raw) -> int:
    return int(ffi.cast("uintptr_t", raw.host))


def _mirror(raw, device_offset: int, to_device: bool):
    layout = Layout.of(raw)
    if to_device:
        return plan(layout.elem_size, layout.extents, layout.strides, layout.strides,
                    0, device_offset)
    return plan(layout.elem_size, layout.extents, layout.strides, layout.strides,
                device_offset, 0)


def _span(raw, failure_code: int) -> int:
    try:
        return Layout.of(raw).nbytes_span
    except NegativeStrides as e:
        raise Failure(failure_code, str(e)) from None


def _allocate(raw, interface, family: Family | None) -> Family:
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
        elif family.backend is not backend:
            raise Failure(E.halide_error_code_incompatible_device_interface,
                          f"the buffer's parent lives on {family.backend.name}")
        else:
            aliasing.attach(family, raw)
        return family
    nbytes = _span(raw, E.halide_error_code_device_malloc_failed)
    try:
        memory = backend.allocate(nbytes)
    except BackendError as e:
        raise Failure(E.halide_error_code_device_malloc_failed, str(e)) from e
    if family is None:
        family = families.family_for(raw, backend)
    family.backend, family.memory = backend, memory
    handle = backend.handle(memory, 0, nbytes)
    family.add_handle(handle, 0)
    _set_device(raw, handle, interface)
    return family


def _allocate_behind_host(raw, interface, family: Family | None) -> Family:
    """Allocate for a Buffer operation. New device memory holds nothing, so where the buffer
    has host memory that holds the data: it is marked host-dirty *before* the handle is
    published, or a lock-free copy_to_device on another thread could find the buffer
    allocated and clean and use the garbage. (Halide leaves the flags alone: a clean buffer
    copied to a new allocation stays garbage there.)"""
    if raw.host != ffi.NULL and (family is None or not family.shared) \
            and not _output_of_a_running_call(family, raw):
        lib.shim_flags_assign(raw, HOST_DIRTY, True)
    return _allocate(raw, interface, family)


def _output_of_a_running_call(family: Family | None, raw) -> bool:
    """Whether a pipeline call running now writes ``raw`` (so uploading it would be wasted)."""
    address = families.address_of(raw)
    return family is not None and any(use.replaces and use.address == address for use in family.uses)


def _download(raw, family: Family | None) -> None:
    """Device -> host for a device-dirty buffer; clears device_dirty once the data is there."""
    if _flags(raw) & HOST_DIRTY:
        raise Failure(E.halide_error_code_copy_to_host_failed,
                      "the buffer is both host-dirty and device-dirty")
    if raw.host == ffi.NULL:
        raise Failure(E.halide_error_code_copy_to_host_failed, "the buffer has no host memory")
    family, offset = _allocation(raw, family)
    _read(family, _mirror(raw, offset, to_device=False), _host_address(raw))
    lib.shim_flags_assign(raw, DEVICE_DIRTY, False)


def _bring_home(raw, family: Family | None) -> None:
    """Before an allocation goes: what only the device holds goes to host memory (if the
    buffer has any); a failure is copy_to_host's."""
    if family is None or family.shared or not raw.device or raw.host == ffi.NULL \
            or not _flags(raw) & DEVICE_DIRTY:
        return
    try:
        _download(raw, family)
    except BackendError as e:
        raise Failure(E.halide_error_code_copy_to_host_failed,
                      f"copying the device's results home first failed: {e}") from e


def _write(family: Family, copy, host_address: int) -> None:
    with profiler.timed_copy(family.backend, "upload", copy.nbytes):
        family.backend.write(family.memory, copy, host_address)
    family.backend.transfers.add("uploaded", copy.nbytes)


def _read(family: Family, copy, host_address: int) -> None:
    with profiler.timed_copy(family.backend, "download", copy.nbytes):
        family.backend.read(family.memory, copy, host_address)
    family.backend.transfers.add("downloaded", copy.nbytes)


def _transfer(family: Family, copy, host_address: int, to_device: bool) -> None:
    (_write if to_device else _read)(family, copy, host_address)


def _shared(operation, family: Family, *args) -> None:
    """Run one of shim/aliasing.py's operations on a shared family."""
    try:
        operation(family, *args)
    except aliasing.Conflict as e:
        raise Failure(E.halide_error_code_host_and_device_dirty, str(e)) from None


def _drop_device(raw, family: Family | None, *, free: bool = True) -> None:
    if aliasing.is_proxy(raw.device_interface):
        return  # a member without a handle of its own: nothing to drop
    shared = family is not None and family.shared
    if raw.device and family is not None:
        _drop_handle(family, raw.device, free=free, active=raw)
    if shared:
        # Still in the family: the proxy stands for the allocation the others hold or will.
        _set_device(raw, families.address_of(raw), aliasing.PROXY)
    else:
        _set_device(raw, 0, ffi.NULL)


def _drop_handle(family: Family, handle: int, *, free: bool = True, active=None,
                 force: bool = False) -> None:
    """Give up one handle into the family's memory. Dropping the last one downloads what only
    the device holds first; if that fails the memory stays (and the error is raised), unless
    ``force``: a Buffer being dropped gives its memory back whatever happens."""
    if family.shared and family.device_regions and family.last_handle(handle):
        try:
            _shared(aliasing.download_all, family, _transfer, active)  # never drop device-only data
        except BaseException:
            if force:
                family.drop_handle(handle, free=free)
            raise
    family.drop_handle(handle, free=free)


def pin_device(raw, backend):
    """Keep ``raw``'s allocation on ``backend`` alive, whatever happens to ``raw``, until the
    returned function is called (a DLPack export: the consumer may outlive the Buffer).
    Returns (unpin, the pinned handle, the allocation it points into); BufferError if ``raw``
    is no longer on ``backend`` (another thread freed or moved it)."""
    with locked(raw) as family:
        handle = raw.device
        if not handle or aliasing.is_proxy(raw.device_interface) \
                or raw.device_interface != interface_of(backend):
            raise BufferError(f"the buffer is no longer on {backend.kind}: another thread freed "
                              "or moved its device memory during the export")
        family.add_handle(handle, family.offset_of(handle))
        family.handles[handle][2].exported = True  # never pooled for reuse (Memory.exported)
        memory = family.memory_of(handle)

    def unpin() -> None:
        if family.lock.held_by_current_thread():  # a finalizer inside the family's own work
            family.deferred.append(unpin)
            return
        with interrupts.deferred():
            family.lock.acquire()
            try:
                _drop_handle(family, handle)
            finally:
                family.lock.release()
        family.run_deferred()

    return unpin, handle, memory


# --- the operations ------------------------------------------------------------------------

def device_malloc(uc, raw, interface):
    with locked(raw) as family:
        if raw.device and not aliasing.is_proxy(raw.device_interface):
            return  # another thread allocated it while we waited
        _allocate(raw, interface, family)


def device_free(uc, raw, interface):
    with locked(raw) as family:
        _await_calls(family)
        _free(raw, family)


def _free(raw, family: Family | None) -> None:
    _drop_device(raw, family)
    if family is not None and family.shared:
        family.refresh_bits(raw)
    else:
        lib.shim_flags_assign(raw, DEVICE_DIRTY, False)


def device_sync(uc, raw, interface):
    if not aliasing.is_proxy(interface):
        backend_for_interface(interface).sync()


def device_release(uc, interface):
    if not aliasing.is_proxy(interface):
        backend = backend_for_interface(interface)
        backend.release_unused()  # Halide's device_release empties its free list too
        backend.release()


def copy_to_host(uc, raw, interface):
    with locked(raw) as family:
        _await_calls(family, raw, writers_only=True)
        if family is not None and family.shared:
            _shared(aliasing.download, family, raw, _transfer)
        elif _flags(raw) & DEVICE_DIRTY:
            _download(raw, family)


def copy_to_device(uc, raw, interface):
    with locked(raw) as family:
        _await_calls(family, raw)
        _copy_to_device(raw, interface, family)


def _copy_to_device(raw, interface, family: Family | None) -> None:
    if family is not None and family.shared:
        if _lives_elsewhere(raw, interface) and not aliasing.is_proxy(interface):
            raise Failure(E.halide_error_code_incompatible_device_interface,
                          "the buffer lives on another device interface")
        family = _allocate(raw, interface, family)
        _shared(aliasing.upload_all, family, _transfer, raw)
        return
    if raw.device and raw.device_interface != interface:
        raise Failure(E.halide_error_code_incompatible_device_interface,
                      "the buffer lives on another device interface")
    _upload(raw, interface, family)


def _lives_elsewhere(raw, interface) -> bool:
    """Whether ``raw`` has an allocation on another interface than ``interface``."""
    current = raw.device_interface
    return bool(raw.device) and not aliasing.is_proxy(current) and current != interface


def _upload(raw, interface, family: Family | None) -> None:
    """copy_to_device of a buffer outside a shared family, allocating on ``interface`` if
    it has no allocation yet."""
    if not raw.device:
        family = _allocate_behind_host(raw, interface, family)
    flags = _flags(raw)
    if not flags & HOST_DIRTY:
        return
    if flags & DEVICE_DIRTY:
        raise Failure(E.halide_error_code_copy_to_device_failed,
                      "the buffer is both host-dirty and device-dirty")
    family, offset = _allocation(raw, family)
    _write(family, _mirror(raw, offset, to_device=True), _host_address(raw))
    lib.shim_flags_assign(raw, HOST_DIRTY, False)


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
            _allocate(raw, interface, family)
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
        lib.shim_flags_assign(raw, HOST_DIRTY | DEVICE_DIRTY, False)


def wrap_native(uc, raw, native, interface):
    _wrap(raw, backend_for_interface(interface), interface, native, 0)


def wrap_device(raw, backend, native: int, offset: int) -> None:
    """Give ``raw`` memory someone else allocated on ``backend`` (DLPack imports), its min
    element ``offset`` bytes in; the memory stays theirs."""
    def wrap_device_memory(uc):
        _wrap(raw, backend, interface_of(backend), native, offset)

    run_for_python("wrap device memory", wrap_device_memory,
                   E.halide_error_code_device_malloc_failed)


def _wrap(raw, backend, interface, native: int, offset: int) -> None:
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
        _set_device(raw, handle, interface)


def detach_native(uc, raw, interface):
    with locked(raw) as family:
        if family is not None and family.shared and not aliasing.is_proxy(interface):
            raise Failure(E.halide_error_code_device_detach_native_failed,
                          "a crop or slice's allocation belongs to its family")
        _drop_device(raw, family, free=False)


def _crop_into(src, dst, interface, dst_min_offset) -> None:
    if aliasing.is_proxy(interface):
        return  # the parent has no allocation yet: neither has the crop, as in Halide
    with locked(src) as family:
        family, src_offset = _allocation(src, family)
        offset = src_offset + dst_min_offset
        nbytes = _span(dst, E.halide_error_code_device_crop_failed)
        handle = family.backend.handle(family.memory, offset, nbytes)
        family.add_handle(handle, offset)
        _set_device(dst, handle, interface)


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
        if family is not None and family.shared:
            _shared(aliasing.absorb, family, raw, False)  # its changes stay with the family
        _drop_device(raw, family)


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
            dst_family = _allocate(dst, dst_interface, dst_family)
        src_layout, dst_layout = Layout.of(src), Layout.of(dst)
        if src_layout.elem_size != dst_layout.elem_size:
            raise Failure(E.halide_error_code_device_buffer_copy_failed,
                          "source and destination element sizes differ")
        box = _overlap(src_layout, dst_layout)
        src_flags = _flags(src)
        from_device_valid = bool(src.device) and (src.host == ffi.NULL or not src_flags & HOST_DIRTY)
        from_host_valid = src.host != ffi.NULL and (not src_flags & DEVICE_DIRTY or src.device == 0)
        to_device = dst_interface != ffi.NULL
        if not to_device and dst.host == ffi.NULL:
            raise Failure(E.halide_error_code_host_is_null, "the destination has no host memory")

        def box_plan(src_base, dst_base):
            lo = [b[0] for b in box]
            extents = [b[1] - b[0] for b in box]
            return plan(src_layout.elem_size, extents, src_layout.strides, dst_layout.strides,
                        src_base + src_layout.offset_of(lo), dst_base + dst_layout.offset_of(lo))

        same_backend = (to_device and src.device
                        and lib.shim_backend_of(src.device_interface) == lib.shim_backend_of(dst_interface))
        if from_device_valid and same_backend:
            src_family, src_offset = _allocation(src, src_family)
            dst_family, dst_offset = _allocation(dst, dst_family)
            copy = box_plan(src_offset, dst_offset)
            with profiler.timed_copy(dst_family.backend, "device copy", copy.nbytes):
                dst_family.backend.copy(src_family.memory, dst_family.memory, copy)
            dst_family.backend.transfers.add("device_copied", copy.nbytes)
        elif not to_device and from_host_valid:
            copy = box_plan(0, 0)
            np.copyto(copy.dst_view(host_memory(_host_address(dst), copy.dst_span)),
                      copy.src_view(host_memory(_host_address(src), copy.src_span)))
        elif not to_device and from_device_valid:
            src_family, src_offset = _allocation(src, src_family)
            _read(src_family, box_plan(src_offset, 0), _host_address(dst))
        else:
            if not from_host_valid:
                if not (from_device_valid and src.host != ffi.NULL):
                    raise Failure(E.halide_error_code_incompatible_device_interface,
                                  "no copy path: the source's valid data is on another device "
                                  "and neither buffer has host memory")
                _download(src, src_family)  # bounce through the source's host memory
            dst_family, dst_offset = _allocation(dst, dst_family)
            _write(dst_family, box_plan(0, dst_offset), _host_address(src))
        if families.address_of(src) != families.address_of(dst):
            if to_device:
                lib.shim_flags_assign(dst, HOST_DIRTY, False)
                lib.shim_flags_assign(dst, DEVICE_DIRTY, True)
            else:
                lib.shim_flags_assign(dst, DEVICE_DIRTY, False)
                lib.shim_flags_assign(dst, HOST_DIRTY, True)


def _overlap(a: Layout, b: Layout) -> list[tuple[int, int]]:
    """Per dimension, [lo, hi) of the intersection of two buffers' boxes."""
    box = []
    for a_min, a_extent, b_min, b_extent in zip(a.mins, a.extents, b.mins, b.extents):
        lo, hi = max(a_min, b_min), min(a_min + a_extent, b_min + b_extent)
        box.append((lo, max(lo, hi)))
    return box


# --- shared families, for shim.Buffer and prepared calls --------------------------------------

def adopt(parent_raw, parent_box, view_raw, view_box) -> None:
    """Register a crop or slice of ``parent_raw`` in the parent's family (see aliasing.adopt)."""
    with locked(parent_raw) as family:
        aliasing.adopt(family, parent_raw, parent_box, view_raw, view_box)


def mark_dirty(raw, bit: int, value: bool) -> None:
    """Buffer.set_host_dirty / set_device_dirty. Under the family's lock, so that a copy in
    progress on another thread, which clears the bit once it is done, cannot swallow a mark
    made meanwhile (the program wrote the memory after the copy read it). For a member of a
    shared family, through the family's regions; raises DeviceError when the other side
    holds overlapping changes."""
    with locked(raw) as family:
        _await_calls(family, raw, writers_only=True)
        if bit == DEVICE_DIRTY and value and (not raw.device or aliasing.is_proxy(raw.device_interface)):
            raise ArgumentError("value", "this Buffer has no device allocation (nor, for a crop, "
                                         "does its parent), so no device copy can hold changes; "
                                         "copy_to_device() or device_malloc() first")
        if not family.shared:
            other = DEVICE_DIRTY if bit == HOST_DIRTY else HOST_DIRTY
            if value and _flags(raw) & other:
                raise DeviceError(E.halide_error_code_host_and_device_dirty,
                                  str(aliasing.uncopied_changes(bit)), context="set dirty")
            lib.shim_flags_assign(raw, bit, value)
            return
        _in_runtime_call("set dirty", aliasing.mark,
                         E.halide_error_code_copy_to_host_failed if bit == HOST_DIRTY
                         else E.halide_error_code_copy_to_device_failed,
                         family, raw, bit, value, _transfer)


def malloc_device(raw, interface) -> None:
    """Buffer.device_malloc: as halide_device_malloc, and since new device memory holds
    nothing, the host has the data: the next copy_to_device uploads it. (Halide leaves the
    flags alone, and a later copy_to_device of a clean buffer leaves garbage on the device.
    A shared family's regions say so already.)"""
    def device_malloc(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            if _lives_elsewhere(raw, interface):  # (halide_device_malloc's refusal)
                raise Failure(E.halide_error_code_incompatible_device_interface,
                              "device_malloc does not move a buffer to another device; "
                              "copy_to_device does")
            if raw.device and not aliasing.is_proxy(raw.device_interface):
                return
            _allocate_behind_host(raw, interface, family)

    run_for_python("device_malloc", device_malloc, E.halide_error_code_device_malloc_failed, raw)


def move_device(raw, interface) -> None:
    """Buffer.copy_to_device to another device than the one the buffer is on: once the calls
    using it have finished, what only the device holds comes home, that allocation goes, and
    a new one on ``interface`` gets the data. A crop or slice shares its family's allocation
    and cannot move alone. (Decided under the lock: a buffer that is no longer elsewhere by
    then is simply copied to the device.)"""
    def copy_to_device(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            _await_calls(family)
            if _lives_elsewhere(raw, interface):
                if family.shared:
                    raise Failure(E.halide_error_code_incompatible_device_interface,
                                  "a crop or slice shares its family's allocation and cannot "
                                  "move alone; free the family's device memory first")
                _bring_home(raw, family)
                _free(raw, family)
            _copy_to_device(raw, interface, family)

    run_for_python("copy_to_device", copy_to_device, E.halide_error_code_copy_to_device_failed,
                   raw)


def free_device(raw) -> None:
    """Buffer.device_free: wait for pipeline calls using the allocation, bring what only the
    device holds home (to host memory, if the buffer has any), then free; if the download
    fails, the allocation stays and DeviceError says why. A later device use uploads again."""
    def device_free(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            _await_calls(family)
            _bring_home(raw, family)
            _free(raw, family)

    run_for_python("device_free", device_free, E.halide_error_code_device_free_failed, raw)


def release(raw, *, copy_back: bool) -> None:
    """A shim.Buffer is being dropped: it leaves its family and gives up its device handle,
    under the family's lock (so that a concurrent allocation cannot attach it meanwhile).
    ``copy_back``: its device results go to host memory first. The memory goes even if that
    download fails; the DeviceError then says what was lost."""
    def device_free(uc, raw):  # (named for profiles)
        with locked(raw) as family:
            try:
                if copy_back:
                    _bring_home(raw, family)
            finally:
                families.unregister_owned(raw)
                if raw.device and not aliasing.is_proxy(raw.device_interface):
                    handle = raw.device
                    _set_device(raw, 0, ffi.NULL)
                    if family is not None and handle in family.handles:
                        _drop_handle(family, handle, force=True)

    run_for_python("release a dropped Buffer", device_free,
                   E.halide_error_code_device_free_failed, raw)


def begin_call(call_id: int, arguments, host_write: bool) -> list:
    """A pipeline call is about to run with ``arguments``, (struct, family, is_output) of
    shim.Buffers: each family records the use, so that other threads' operations on those
    elements wait for the call to end (``end_call``, with what this returns). A call that
    writes an output on the host (a CPU pipeline) first brings the family's device-side
    changes home. (A Buffer's family never changes: its lock is taken directly.)"""
    inputs = [families.address_of(raw) for raw, _, output in arguments if not output]
    uses = []
    try:
        with interrupts.deferred():
            for raw, family, output in arguments:
                with family.lock:
                    uses.append((raw, family, _begin_use(call_id, raw, family, output, inputs,
                                                         host_write)))
                if family.deferred:
                    family.run_deferred()
    except BaseException:
        end_call(call_id, uses)
        raise
    return uses


def _begin_use(call_id: int, raw, family: Family, output: bool, inputs: list,
               host_write: bool) -> Use:
    address = families.address_of(raw)
    box = family.members[address].box if family.shared else None
    use = Use(call_id, address, box, output, replaces(raw, family, output, inputs))
    if family.shared:
        if output and host_write and family.device_regions:
            _in_runtime_call("before the pipeline", aliasing.download_all,
                             E.halide_error_code_copy_to_host_failed, family, _transfer, raw)
        aliasing.begin_call(family, use, raw)
    else:
        family.uses.append(use)
        if use.replaces:  # its results replace what either side held (as aliasing's)
            lib.shim_flags_assign(raw, HOST_DIRTY | DEVICE_DIRTY, False)
    return use


def replaces(raw, family: Family, output: bool, inputs: list) -> bool:
    """Whether a call writes ``raw`` (``output``) without reading it first: none of its inputs
    (their structs' addresses) is ``raw`` or, in a shared family, overlaps it. (Fixed for a
    call's Buffers: two Buffers can only overlap in one shared family.)"""
    address = families.address_of(raw)
    if not output or address in inputs:
        return False
    if not family.shared:
        return True
    box = family.members[address].box
    for input_address in inputs:
        member = family.members.get(input_address)
        if member is not None and intersect(member.box, box):
            return False
    return True


def end_call(call_id: int, uses: list) -> None:
    """The pipeline call has returned: what it wrote joins each family (a crop's results reach
    its parent), and operations waiting for it go ahead."""
    failure = None
    with interrupts.deferred():
        for raw, family, use in uses:
            with family.lock:
                try:
                    if family.shared:
                        _take_results(family, use, raw)
                    else:
                        family.uses.remove(use)
                except DeviceError as e:
                    failure = failure or e
                finally:
                    family.lock.notify_all()
            if family.deferred:
                family.run_deferred()
    if failure is not None:
        raise failure


def _take_results(family: Family, use: Use, raw) -> None:
    """aliasing.end_call, for end_call. It copies nothing and waits for nothing, so it runs
    as it is: as a runtime call it would cost more than the rest of a call on a crop. Only a
    failure goes through one, to reach the caller as any other does (DeviceError, message)."""
    try:
        aliasing.end_call(family, use, raw)
    except BaseException as e:
        failure = e

        def replay(family: Family) -> None:
            raise failure

        replay.__name__ = aliasing.end_call.__name__  # (the message names the operation)
        _in_runtime_call("after the pipeline", replay, E.halide_error_code_host_and_device_dirty,
                         family)


def _in_runtime_call(what: str, operation, failure_code: int, family: Family, *args) -> None:
    """Run one of shim/aliasing.py's operations on a shared family for a Python caller:
    DeviceError if it fails (a conflict: host_and_device_dirty)."""
    def shared_operation(uc):
        _shared(operation, family, *args)

    shared_operation.__name__ = operation.__name__  # (for profiles)
    run_for_python(what, shared_operation, failure_code)


# --- the callbacks the native library calls ------------------------------------------------

# What a callback returns if even reporting its failure fails: still a failure, never success.
_UNREPORTED_FAILURE = E.halide_error_code_generic_error

@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_malloc(uc, buf, interface):
    return guarded(device_malloc, E.halide_error_code_device_malloc_failed, uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_free(uc, buf, interface):
    return guarded(device_free, E.halide_error_code_device_free_failed, uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_sync(uc, buf, interface):
    return guarded(device_sync, E.halide_error_code_device_sync_failed, uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_release(uc, interface):
    return guarded(device_release, E.halide_error_code_generic_error, uc, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_copy_to_host(uc, buf, interface):
    return guarded(copy_to_host, E.halide_error_code_copy_to_host_failed, uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_copy_to_device(uc, buf, interface):
    return guarded(copy_to_device, E.halide_error_code_copy_to_device_failed, uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_and_host_malloc(uc, buf, interface):
    return guarded(device_and_host_malloc, E.halide_error_code_device_malloc_failed,
                    uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_and_host_free(uc, buf, interface):
    return guarded(device_and_host_free, E.halide_error_code_device_free_failed,
                    uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_buffer_copy(uc, src, dst_interface, dst):
    return guarded(buffer_copy, E.halide_error_code_device_buffer_copy_failed,
                    uc, src, dst_interface, dst)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_crop(uc, src, dst, interface):
    return guarded(device_crop, E.halide_error_code_device_crop_failed, uc, src, dst, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_slice(uc, src, slice_dim, slice_pos, dst, interface):
    return guarded(device_slice, E.halide_error_code_device_crop_failed,
                    uc, src, slice_dim, slice_pos, dst, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_device_release_crop(uc, buf, interface):
    return guarded(device_release_crop, E.halide_error_code_device_crop_failed,
                    uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_wrap_native(uc, buf, handle, interface):
    return guarded(wrap_native, E.halide_error_code_device_malloc_failed,
                    uc, buf, handle, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_detach_native(uc, buf, interface):
    return guarded(detach_native, E.halide_error_code_device_detach_native_failed,
                    uc, buf, interface)


@ffi.def_extern(error=_UNREPORTED_FAILURE)
def shim_py_compute_capability(uc, major, minor, interface):
    return guarded(compute_capability, E.halide_error_code_generic_error,
                    uc, major, minor, interface)
