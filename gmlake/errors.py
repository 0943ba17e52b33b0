"""Exceptions gmlake raises. Each says what happened in numbers, so a user can act on it."""
from __future__ import annotations


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


class GmlakeError(Exception):
    """Base of gmlake's errors."""


class OutOfMemoryError(GmlakeError, MemoryError):
    """No memory could be found for a request, even after releasing cached memory.

    Attributes hold the numbers at the time of failure, in bytes.
    """

    def __init__(self, *, requested: int, reserved: int, allocated: int, cached: int, limit: int = 0,
                 capacity: int = 0) -> None:
        self.requested = requested
        self.reserved = reserved
        self.allocated = allocated
        self.cached = cached
        self.limit = limit
        self.capacity = capacity
        cap = []
        if limit:
            cap.append(f"cap {_mib(limit)}")
        if capacity:
            cap.append(f"device capacity {_mib(capacity)}")
        super().__init__(
            f"gmlake: out of memory: tried to allocate {_mib(requested)} ({requested} bytes); "
            f"{_mib(reserved)} reserved, {_mib(allocated)} allocated, {_mib(cached)} cached and free"
            + (f"; {', '.join(cap)}" if cap else "")
        )


class CaptureOutOfMemoryError(OutOfMemoryError):
    """A request during CUDA graph capture found no memory without relieving memory pressure, which synchronizes the
    device, and stream capture forbids that. The allocator is unchanged: end the capture, free memory, or reserve
    more before capturing."""

    def __init__(self, **figures) -> None:
        super().__init__(**figures)
        self.args = (self.args[0] + "; during CUDA graph capture, where freeing cached memory is not possible (it "
                     "must synchronize the device, which stream capture forbids)",)


class GraphCaptureError(GmlakeError, RuntimeError):
    """An operation that must synchronize the device or query events was called while a graph is being captured."""


class DriverError(GmlakeError, RuntimeError):
    """A driver call failed for a reason other than memory exhaustion."""

    def __init__(self, call: str, code: int, description: str) -> None:
        self.call = call
        self.code = code
        self.description = description
        super().__init__(f"gmlake: driver call {call} failed: {description} (code {code})")


class InvalidPointerError(GmlakeError, ValueError):
    """A free or lookup of an address that is not a live allocation (double free, or a foreign pointer)."""


class PolicyError(GmlakeError, RuntimeError):
    """A Python policy hook raised; the request it was deciding was undone."""


class InvariantError(GmlakeError, AssertionError):
    """`Allocator.check()` found internal state that contradicts itself (a bug in the allocator core). Raised as a
    real exception, so it survives `python -O`, which strips `assert`."""


class HazardError(GmlakeError, AssertionError):
    """A modelled driver with hazard tracking on saw what would corrupt data or fault on a GPU: memory handed to a
    stream while another stream's queued work still touches it, a range unmapped under queued work, a handle
    released while still mapped, or bytes a queued kernel found overwritten."""
