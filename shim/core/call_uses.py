"""Pipeline calls in flight, as their Buffers' families see them.

A pipeline call on shim.Buffers records a Use in each Buffer's family for as long as it runs
(``begin_call``, ``end_call``), so that other threads' operations on the same elements wait for
it (families.await_calls). For a crop or slice, the call's beginning and end are also what
moves the family's regions (shim/memory/aliasing.py): what the call writes joins its parent. The C
fast paths do the same from plans (native_stubs/fast/shared_records.c); this is the general run.
"""

from __future__ import annotations

from shim.memory import aliasing
from shim.memory import families
from shim.native import flags
from shim.native import interrupts
from shim.core import runtime
from shim.core.bridge import E
from shim.base.errors import DeviceError
from shim.memory.families import Family, Use
from shim.native.regions import intersect


def begin_call(call_id: int, arguments, host_write: bool) -> list:
    """A pipeline call is about to run with ``arguments``, (struct, family, is_output) of
    shim.Buffers: each family records the use, so that other threads' operations on those
    elements wait for the call to end (``end_call``, with what this returns). A call that
    writes an output on the host (a CPU pipeline) first brings the family's device-side
    changes home. (A Buffer's family never changes: its lock is taken directly.)"""
    inputs = [families.address_of(raw) for raw, _, output in arguments if not output]
    # Operations of other threads waiting for the families' calls go first; the call waits
    # before it holds any use (see families.await_operations).
    for _, family, _ in arguments:
        if family.lock.awaiting:
            with family.lock:
                families.await_operations(family)
    uses = []
    try:
        with interrupts.deferred():
            for raw, family, output in arguments:
                with family.lock:
                    uses.append((raw, family, _begin_use(call_id, raw, family, output, inputs,
                                                         host_write)))
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
            runtime.in_runtime_call("before the pipeline", aliasing.download_all,
                                    E.halide_error_code_copy_to_host_failed, family,
                                    runtime.transfer, raw)
        aliasing.begin_call(family, use, raw)
    else:
        family.uses.append(use)
        if use.replaces:  # its results replace what either side held (as aliasing's)
            flags.assign(raw, flags.DIRTY, False)
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
        runtime.in_runtime_call("after the pipeline", replay,
                                E.halide_error_code_host_and_device_dirty, family)
