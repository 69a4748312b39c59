"""What type checkers know of the types the native library makes (native_stubs/; shim/native
fetches them when it is imported): the members Python sees, as the C code defines them. The
shim's public classes derive from them (shim.Pipeline from CallPlan, shim.Buffer from
HostExporter, shim.Profile from HeldContext): declared here, those classes are checked as
themselves instead of as subclasses of an unknown type, which a type checker lets pass anything."""

from types import TracebackType
from typing import Any, Protocol, TypeVar

_T_co = TypeVar("_T_co", covariant=True)

class _Entering(Protocol[_T_co]):
    def _enter(self) -> _T_co: ...

class CallPlan:
    """native_stubs/fast/fastcall.c: shim.Pipeline's fast path and bounds cache."""

    def __init__(self, *args: Any) -> None: ...
    # What a call returns depends on its outputs (a Buffer, the array given, a tuple of them).
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def _known(self, argv_address: int, /) -> bool: ...
    def _remember(self, argv_address: int, /) -> None: ...

class PreparedRun:
    """native_stubs/fast/prepared_call.c: shim.PreparedCall's run."""

    def __init__(self, *args: Any) -> None: ...
    def __call__(self) -> Any: ...

class FamilyState:
    """native_stubs/fast/family_state.c: the state of a family that the fast paths read."""

    regions: Any

class LockState:
    """native_stubs/fast/family_state.c: a family lock's state that the fast paths read."""

    owner: Any
    waiting: int

class MemberPlans:
    """native_stubs/fast/shared_records.c: what calls on a Buffer do in its shared family."""

class Finalized:
    """native_stubs/calls/signals_held.c: ``_finalize()`` runs with signal handlers held."""

class HostExporter(Finalized):
    """native_stubs/calls/host_export.c: the buffer protocol, exporting ``_host_export()``'s
    array."""

    def __buffer__(self, flags: int, /) -> memoryview: ...

class HeldContext:
    """native_stubs/calls/signals_held.c: ``with`` calls ``_enter()`` and ``_exit(*exc)`` with
    signal handlers held; ``as`` gives what ``_enter()`` returns."""

    def __enter__(self: _Entering[_T_co]) -> _T_co: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None, /) -> None: ...
