"""Crops that alias their parent on the device (Halide issue 8395), and dirty bits that
reach the parent.

In Halide, a crop of a buffer that has no device allocation gets an allocation of its own on
first device use, and a crop's dirty bits never reach its parent: realize a pipeline into
crops on the GPU, read the parent, and the results are not there. Here a shim.Buffer and its
crops and slices form a shared family (shim/memory/families.py):

- a crop made while the parent has no device allocation carries the proxy interface, which
  stands for "the parent's allocation, not yet made"; the first device use of any member
  allocates the parent's whole extent on the device asked for, and every member aliases it;
- what is newer on the host or on the device is kept as boxes in the parent's coordinates,
  filled in from what the shim sees (pipeline outputs after each call, set_*_dirty, bits set
  by code the shim did not see) and never both at once: before a member is used on the device
  every host-side change is uploaded, and before the host side is written every device-side
  change is downloaded;
- every member's dirty bits are derived from the boxes, so the C fast paths, which only read
  a struct's own flags, see the family's state: reading the parent after a kernel wrote a crop
  downloads exactly the boxes that changed;
- data is never dropped: freeing the last handle into the allocation downloads what only the
  device holds first.

Every function here is called with the family's lock held (see shim/core/runtime.py).
"""

from __future__ import annotations

import struct

from shim.native import flags
from shim.memory.families import Family, Member, Use, address_of, dirty_bits
from shim.native.flags import DEVICE_DIRTY, DIRTY, HOST_DIRTY
from shim.native import ffi, lib
from shim.native.regions import (
    box_plan,
    contains,
    intersect,
    overlaps,
    subtract_all,
    with_box,
    without_box,
)

PROXY = lib.shim_backend_interface(lib.SHIM_BACKEND_PROXY)


class Conflict(Exception):
    """The same part of a family changed on the host and on the device."""


def is_proxy(interface) -> bool:
    return interface == PROXY


def has_allocation(raw) -> bool:
    """Whether ``raw`` has device memory of its own: a handle, and not the proxy a member of a
    shared family carries while the family has no allocation (in C: shim_has_allocation, in
    native_stubs/shim_native.h)."""
    return bool(raw.device) and raw.device_interface != PROXY


def adopt(family: Family, parent_raw, parent_box, view_raw, view_box) -> None:
    """Make ``view_raw`` (a crop or slice of ``parent_raw``, spanning ``view_box`` in the
    root's coordinates) a member: aliasing the allocation if there is one, else the proxy."""
    family.share(parent_raw, parent_box)
    member = Member(view_raw, view_box)
    family.add_member(member)
    flags.assign(view_raw, flags.REGIONS, True)
    if family.memory is not None:
        attach(family, view_raw)
    else:
        lib.shim_buffer_set_device(view_raw, member.address, PROXY)
    # Only the new member's bits: refreshing every member would make creating n crops cost
    # n squared.
    family.refresh_bits(view_raw, only=view_raw)


def allocate(family: Family, backend, raw) -> None:
    """Allocate the root's whole extent on ``backend`` for member ``raw``'s first device use;
    every member aliases it. The root starts ``device_base`` bytes in, as far as ``raw`` needs
    to sit where the backend's kernels can take it directly (an OpenCL sub-buffer needs an
    aligned offset: a crop elsewhere is staged around every launch). New device memory holds
    nothing yet: the host is newer everywhere, so the first device use of any member uploads it
    (except where a running pipeline call writes it)."""
    family.device_base = backend.placement(_host_offset(family, raw))
    family.backend = backend
    family.memory = backend.allocate_for(family.root_layout, raw.type.code,
                                         family.device_base + family.root_layout.nbytes_span)
    family.regions = (frozenset(subtract_all([family.root_box()],
                                             [use.box for use in family.uses if use.replaces])),
                      frozenset())
    family.refresh_bits()  # before any member's handle is published (see runtime.allocate_behind_host)
    for member in list(family.members.values()):
        attach(family, member.raw)


def attach(family: Family, raw) -> None:
    """Give member ``raw`` a handle into the family's allocation, where its elements are."""
    if raw.device and not is_proxy(raw.device_interface):
        return
    offset = family.device_base + _host_offset(family, raw)
    nbytes = _span(family, family.member_of(raw).box)
    handle = family.backend.handle(family.memory, offset, nbytes)
    family.add_handle(handle, offset)
    lib.shim_buffer_set_device(raw, handle, lib.shim_backend_interface(family.backend.index))


def _host_offset(family: Family, raw) -> int:
    """Where member ``raw``'s first element is, in bytes from the root's."""
    return int(ffi.cast("uintptr_t", raw.host)) - family.root_host


def _span(family: Family, box) -> int:
    """Bytes from the first element of ``box`` to just past its last, in the root's layout."""
    layout = family.root_layout
    return (sum((extent - 1) * stride for (_, extent), stride in zip(box, layout.strides))
            + layout.elem_size)


def absorb(family: Family, raw, written: bool) -> None:
    """Take ``raw``'s dirty bits into the family's regions. ``written``: a pipeline just
    wrote the member's whole box, on the side its bits say; that write is the newest, so it
    replaces whatever either side held there. Otherwise only bits no region explains count
    (set by code the shim did not see), and they may not overlap the other side's changes."""
    member = family.member_of(raw)
    if written:
        _take_output(family, member)
        return
    bits = flags.of(raw)
    for bit, side in ((DEVICE_DIRTY, "device"), (HOST_DIRTY, "host")):
        if not bits & bit or overlaps(_regions(family, bit), member.box):
            continue
        if overlaps(_regions(family, flags.other_side(bit)), member.box):
            raise Conflict(f"part of this buffer changed on the {side} while the other side "
                           "held changes not yet copied")
        _newer_on(family, bit, member)
    family.refresh_bits(raw)


def _take_output(family: Family, member: Member) -> None:
    """absorb, for a member a pipeline just wrote."""
    side = flags.of(member.raw) & DIRTY
    if side == DIRTY:
        raise Conflict("a pipeline left its output marked newer on both the host and the device")
    if side:
        _newer_on(family, side, member)
    family.refresh_bits(member.raw)


def _regions(family: Family, bit: int) -> frozenset:
    """The family's changes on the side ``bit`` stands for."""
    return family.host_regions if bit == HOST_DIRTY else family.device_regions


def _newer_on(family: Family, bit: int, member: Member) -> None:
    """``member``'s box is now newer on the side ``bit`` stands for: it joins that side's
    regions and leaves the other's."""
    family.regions = member.derived(_newer_on_host if bit == HOST_DIRTY else _newer_on_device,
                                    family.regions, family.generation)


# What calls do to a family's regions (host, device), as pure functions of a member's box and
# the regions, for Member.derived.

def _newer_on_host(box, host: frozenset, device: frozenset) -> tuple[frozenset, frozenset]:
    return with_box(host, box), without_box(device, box)


def _newer_on_device(box, host: frozenset, device: frozenset) -> tuple[frozenset, frozenset]:
    return without_box(host, box), with_box(device, box)


def _replaced(box, host: frozenset, device: frozenset) -> tuple[frozenset, frozenset]:
    return without_box(host, box), without_box(device, box)


def uncopied_changes(bit: int) -> Conflict:
    """The refusal to mark a buffer newer on one side (``bit``) while the other side holds
    changes to it: for members here, and for plain Buffers in shim/core/buffer_operations.py."""
    side, copy = (("device", "copy_to_host") if bit == HOST_DIRTY
                  else ("host", "copy_to_device"))
    return Conflict(f"the {side} holds changes to this buffer that were never copied; copy "
                    f"them first ({copy})")


def mark(family: Family, raw, bit: int, value: bool, transfer) -> None:
    """``Buffer.set_host_dirty`` / ``set_device_dirty`` on a member. Setting a side dirty
    first brings the other side's changes over (they cannot overlap this member: that is a
    conflict), so that the family never holds changes on both sides."""
    member = family.member_of(raw)
    other = _regions(family, flags.other_side(bit))
    if value:
        if overlaps(other, member.box):
            raise uncopied_changes(bit)
        if other:
            if bit == HOST_DIRTY:
                download_all(family, transfer, raw)
            else:
                upload_all(family, transfer, raw)
        _newer_on(family, bit, member)  # (the other side holds no changes now)
    elif bit == HOST_DIRTY:
        family.host_regions = without_box(family.host_regions, member.box)
    else:
        family.device_regions = without_box(family.device_regions, member.box)
    family.refresh_bits(raw)


def download(family: Family, raw, transfer) -> None:
    """copy_to_host of a member: download the changed boxes that overlap it."""
    member = family.member_of(raw)
    box = member.box
    if flags.of(raw) & DEVICE_DIRTY and not overlaps(family.device_regions, box):
        # dirty for a reason the shim did not see
        family.device_regions = with_box(family.device_regions, box)
    parts = [part for part in (intersect(region, box) for region in family.device_regions) if part]
    _move(family, parts, to_device=False, transfer=transfer)
    family.device_regions = frozenset(subtract_all(family.device_regions, parts))
    family.refresh_bits(raw)


def download_all(family: Family, transfer, active=None) -> None:
    _move(family, family.device_regions, to_device=False, transfer=transfer)
    family.device_regions = frozenset()
    family.refresh_bits(active)


def upload_all(family: Family, transfer, active=None) -> None:
    """Before a member is used on the device: every host-side change goes up."""
    _move(family, family.host_regions, to_device=True, transfer=transfer)
    family.host_regions = frozenset()
    family.refresh_bits(active)


def begin_call(family: Family, use: Use, raw) -> None:
    """A pipeline call is starting on member ``raw``: its flags are its kernels' now. An
    output's bits start clear, so that afterwards they say on which side the call left its
    results (it writes the whole box)."""
    family.uses.append(use)
    if use.replaces:
        # The call's results replace what either side held there: nothing there is to be
        # uploaded or downloaded any more (an upload queued after its kernels would even
        # overwrite their results).
        family.regions = family.members[use.address].derived(_replaced, family.regions,
                                                             family.generation)
        flags.assign(raw, DIRTY, False)


def end_call(family: Family, use: Use, raw) -> None:
    """The call has returned: take in what it wrote and give the member's flags back to the
    family (once the call has no other use of it: it may be its input and its output)."""
    family.uses.remove(use)
    if use.output:
        _take_output(family, family.members[use.address])
    elif not family.in_use(use.address):
        family.refresh_bits(raw)


# --- plans for the C fast paths -------------------------------------------------------------
#
# What begin_call and end_call do on a member, worked out once per state of the family for
# native_stubs/fast/shared_records.c, which carries a plan out whenever the family is in the state
# it was made for: the same ``regions`` object (a plan's first field; see Family). These only
# read the family, and are called without its lock: whatever changes meanwhile gives the
# family a new ``regions`` object, for which the plan is never used.


def begin_plan(family: Family, raw, output: bool, replaces: bool,
               host_write: bool) -> tuple | None:
    """begin_call on member ``raw`` for a call that writes it (``output``; ``replaces``: without
    reading it) and writes its outputs on the host (``host_write``): (regions, the Use to
    record, the regions after). None where beginning takes more than that (a CPU call writing a
    member while the device holds changes: call_uses.begin_call brings them home)."""
    regions, generation = family.regions, family.generation
    member = family.members.get(address_of(raw))
    if member is None or (output and host_write and regions[1]):
        return None
    after = member.derived(_replaced, regions, generation) if replaces else regions
    return regions, Use(0, member.address, member.box, output, replaces), after


def end_plan(family: Family, raw, use: Use, side: int) -> tuple | None:
    """end_call for ``use``, the family's only use, of member ``raw``, which the call left with
    the dirty bits ``side``: (regions, the regions after, every member's dirty bits after as
    packed native uint64 pairs (address, bits), the members (whose structs those are)). None
    for a conflict (end_call raises it)."""
    regions, generation = family.regions, family.generation
    members = tuple(family.members.values())
    member = family.members.get(address_of(raw))
    if member is None or side == DIRTY:
        return None
    after = regions
    if use.output and side:
        after = member.derived(_newer_on_host if side == HOST_DIRTY else _newer_on_device,
                               regions, generation)
    bits = [value for each in members
            for value in (each.address, each.derived(dirty_bits, after, generation))]
    return regions, after, struct.pack(f"={len(bits)}Q", *bits), members


def _move(family: Family, boxes, to_device: bool, transfer) -> None:
    if not boxes:
        return
    if family.memory is None:
        raise Conflict("the family has no device allocation to copy to or from")
    for box in _outermost(boxes):
        transfer(family, box_plan(family.root_layout, box, family.device_base, to_device),
                 family.root_host, to_device)


def _outermost(boxes) -> list:
    """The boxes, without those another box contains (they would be copied twice)."""
    kept = []
    for box in sorted(boxes, key=lambda b: -_volume(b)):
        if not any(contains(k, box) for k in kept):
            kept.append(box)
    return kept


def _volume(box) -> int:
    volume = 1
    for _, extent in box:
        volume *= extent
    return volume
