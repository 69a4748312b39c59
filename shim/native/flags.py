"""A halide_buffer_t's flags, as the Python core reads and writes them: Halide's two dirty
bits and the shim's own REGIONS and PYTHON bits (native_stubs/devices/flags.c).

Every write goes through here. Generated code and Halide's runtime set and clear the dirty
bits on other threads while Python runs, so a write is an atomic update of the bits named,
never a read-modify-write of the whole word.
"""

from __future__ import annotations

from shim.native import lib

HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty
DIRTY = HOST_DIRTY | DEVICE_DIRTY
# The buffer is a member of a shared family: its dirty bits are derived from the family's
# regions, and the C fast paths leave it to the plans made for it (native_stubs/fast/shared_records.c).
REGIONS = lib.SHIM_BUFFER_FLAG_REGIONS
# The struct is a shim.Buffer's, whose family lives here: the native layer never serves its
# allocations itself (native_stubs/devices/served.c).
PYTHON = lib.SHIM_BUFFER_FLAG_PYTHON


def of(raw) -> int:
    return lib.shim_flags_get(raw)


def assign(raw, bits: int, value: bool) -> None:
    """Set (``value``) or clear the flag bits ``bits`` of ``raw``, atomically."""
    lib.shim_flags_assign(raw, bits, value)


def other_side(bit: int) -> int:
    """DEVICE_DIRTY for HOST_DIRTY and the other way round."""
    return DEVICE_DIRTY if bit == HOST_DIRTY else HOST_DIRTY


def put_dirty(raw, bits: int) -> None:
    """Give ``raw`` exactly the dirty bits ``bits``, setting before clearing: a member never
    looks clean, even for a moment, where it is not (the native layer's no-op checks read its
    flags without the lock; with both bits set they leave the call to the Python core, which
    waits for the lock)."""
    now = of(raw) & DIRTY
    if bits & ~now:
        assign(raw, bits & ~now, True)
    if now & ~bits:
        assign(raw, now & ~bits, False)

