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

    def __init__(self, *, requested: int, reserved: int, allocated: int, cached: int, limit: int | None = None,
                 capacity: int = 0) -> None:
        self.requested = requested
        self.reserved = reserved
        self.allocated = allocated
        self.cached = cached
        self.limit = limit
        self.capacity = capacity
        cap = []
        if limit is not None:           # None: no cap; 0 is a cap under which nothing fits (Note [No limit])
            cap.append(f"cap {_mib(limit)}")
        if capacity:
            cap.append(f"device capacity {_mib(capacity)}")
        super().__init__(f"gmlake: out of memory: {self._figures()}" + (f"; {', '.join(cap)}" if cap else ""))

    def _figures(self) -> str:
        return (f"tried to allocate {_mib(self.requested)} ({self.requested} bytes); {_mib(self.reserved)} reserved, "
                f"{_mib(self.allocated)} allocated, {_mib(self.cached)} cached and free")

    def torch_message(self, device: int, capturing: bool = False, *, device_free: int | None = None,
                      stitches: int | None = None, page: int | None = None,
                      capped_page: int | None = None, tail_page: int | None = None) -> str:
        """The text of the torch.OutOfMemoryError that ends an allocation through the torch bridge: PyTorch's own
        opening (the words tools look for, the request, the device's capacity and free memory, the cap as "allowed"),
        then gmlake's report: the figures, the stitches made so far, the limit in force and what to try.
        `device_free`: the device's free memory now (None: not known). `page`: the large pages the policy's
        expandable ranges map (None: it maps none), and `capped_page` those they map while a cap binds (the policy's
        capped_page_large; None: `page`); where the pages in force are coarser than the finest and the cached free
        bytes with the room under the limit would hold the request, the message suggests the finest, through the
        knob that sets those pages, as PyTorch's suggests expandable segments; first, where `tail_page` is 0 (the
        policy could cut its blocks' tail pages and does not), the finest tail pages, which cost fewer driver calls
        (docs/benchmarks.md, "Fine pages at a block's tail")."""
        free = f" of which {format_torch_size(device_free)} is free" if device_free is not None else ""
        capped = self.limit is not None
        zero_cap = self.limit == 0
        # a cap at or above the device's memory is none (the core's _cap_binds): the device is the limit then
        binds = capped and not zero_cap and (not self.capacity or self.limit < self.capacity)
        allowed = f"{format_torch_size(self.limit)} allowed; " if capped else ""
        if zero_cap:
            limit = "a cap of 0 bytes (set_per_process_memory_fraction(0): no allocation fits)"
        elif binds:
            limit = (f"the cap of {_mib(self.limit)} (set_per_process_memory_fraction or GMLAKE_LIMIT) binds before "
                     f"the device's {_mib(self.capacity)}")
        elif capped:
            limit = (f"the device's own {_mib(self.capacity)} (the cap of {_mib(self.limit)} is not below it, so it "
                     f"does not bind)")
        else:
            limit = f"no cap, the device's own {_mib(self.capacity)}"
        made = f"; {stitches} stitches made so far" if stitches is not None else ""
        tries = "free tensors or use a smaller batch and retry"
        if binds:
            tries += ", or raise the cap"
        if self.cached >= self.requested and not zero_cap:
            tries += (f" ({_mib(self.cached)} is cached and free, in pieces of segments still in use that the policy "
                      f"could not join for this request)")
        room = (self.limit - self.reserved if self.reserved < self.limit else 0) if binds else (device_free or 0)
        knob = "expandable_page_large"
        if page and binds and capped_page:
            page, knob = capped_page, "capped_page_large"
        if page and page > FINEST_PAGE and self.cached and self.cached + room >= self.requested and not zero_cap:
            # free bytes inside coarse pages that live blocks share are what finer pages reach (docs/benchmarks.md)
            tails = (f"GMLAKE_KNOBS=tail_page={FINEST_PAGE >> 20}MiB (docs/benchmarks.md, \"Fine pages at a "
                     f"block's tail\"), or finer still " if tail_page == 0 and knob == "expandable_page_large" else "")
            tries += (f"; if it ran out at the edge, finer pages may fit it: {tails}"
                      f"GMLAKE_KNOBS={knob}={FINEST_PAGE >> 20}MiB (docs/benchmarks.md, \"Fine pages "
                      f"from the start\")")
        return (f"CUDA out of memory. Tried to allocate {format_torch_size(self.requested)}. GPU {device} has a total "
                f"capacity of {format_torch_size(self.capacity)}{free}. {allowed}gmlake: {self.requested} bytes asked; "
                f"{_mib(self.reserved)} reserved, {_mib(self.allocated)} allocated, {_mib(self.cached)} cached and "
                f"free{made}; limit in force: "
                f"{limit}. The allocator is still usable: {tries}."
                + (" (This request came during CUDA graph capture, when the allocator can neither wait for memory "
                   "nor release any: reserve it before capturing.)" if capturing else ""))


FINEST_PAGE = 2 << 20      # the CUDA driver's allocation granularity on the GPUs measured: the finest page


def format_torch_size(n: int) -> str:
    """A byte count as PyTorch's out-of-memory message writes it (bytes, KiB, MiB or GiB, two decimals), for the
    message below only: everywhere else sizes are written by gmlake.policies.settings.format_size."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if n <= scale << 10:
            return f"{n / scale:.2f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


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
    """A policy hook raised, or answered out of range (its type or its value); the request it was deciding was
    undone and the allocator stays usable. The hook's own exception is the `__cause__` (its traceback is the
    policy's code).

    Attributes: policy (the policy's label, as results name it), hook, request (the request's index where a replay
    numbers them, else None), size (bytes asked) and stream of the request, bad_answer (True: the hook answered out
    of range; False: it raised).
    """

    def __init__(self, message: str, *, policy: str = "", hook: str = "", request: int | None = None, size: int = 0,
                 stream: int = 0, bad_answer: bool = False) -> None:
        super().__init__(message)
        self.policy = policy
        self.hook = hook
        self.request = request
        self.size = size
        self.stream = stream
        self.bad_answer = bad_answer


class InvariantError(GmlakeError, AssertionError):
    """`Allocator.check()` found internal state that contradicts itself (a bug in the allocator core). Raised as a
    real exception, so it survives `python -O`, which strips `assert`."""


class HazardError(GmlakeError, AssertionError):
    """A modelled driver with hazard tracking on saw what would corrupt data or fault on a GPU: memory handed to a
    stream while another stream's queued work still touches it, a range unmapped under queued work, a handle
    released while still mapped, or bytes a queued kernel found overwritten."""
