"""A harness that drives an Allocator the way PyTorch drives it on a GPU, over a modelled driver with hazard
tracking on, so stream-ordering bugs fail on the CPU.

Every allocation is written by a kernel queued on its stream; a use on another stream (record_stream) queues a
kernel there that waits for the writer (an event wait, as `wait_stream` would); every free is preceded by a last
kernel on the allocation's stream that checks the block still holds its byte. Kernels run only when a stream is
completed (by the test, a seeded random schedule, or a synchronize), so memory the allocator hands out early is
caught: by the driver, as a hazard, when the new owner's kernel is queued while another stream's work on the same
physical bytes is still pending; and by the shadow here, when two live allocations share physical bytes.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

import gmlake
from gmlake import Allocator, OutOfMemoryError

# the driver's own rule for two physical extents meeting
from gmlake.core._driver import _overlap
from gmlake.core.errors import HazardError


@dataclass
class Live:
    """A live allocation, as the shadow sees it."""

    ptr: int
    size: int
    stream: int
    value: int
    extents: list
    users: set = field(default_factory=set)


def _fails_once(method):
    """Mark the harness broken when an operation raises, so close() (a state machine's teardown) does not bury
    the first failure under the consequences of the bug."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.broken = True
            raise
    return wrapper


class StreamHarness:
    """An allocator over `driver` (made hazard-tracking here) with a shadow of the bytes each live allocation, and so
    each stream, may touch. Every operation ends with `verify()`: the driver's hazards, then `Allocator.check()`."""

    def __init__(self, driver: gmlake.Driver, policy: gmlake.Policy | str = "gmlake-paper", *, limit: int | None = None,
                 **knobs) -> None:
        driver.track_hazards()
        if isinstance(policy, str):
            policy = gmlake.policies.get(policy, **knobs)
        self.driver = driver
        self.alloc = Allocator(driver, policy, limit=limit)
        self.alloc.debug_checks = True     # every invariant inside every operation, not only between them
        self.live: dict[int, Live] = {}
        self.rebacked = 0
        self.broken = False

    def _value(self) -> int:
        used = {b.value for b in self.live.values()}
        return next(v for v in range(1, 256) if v not in used)

    @_fails_once
    def verify(self) -> None:
        """Raise if the driver logged a hazard or the allocator's invariants are broken."""
        self.driver.check_hazards()
        self.alloc.check()

    @_fails_once
    def malloc(self, size: int, stream: int = 0) -> int | None:
        """Allocate and queue the kernel that writes the new block on `stream`; None on a clean out-of-memory."""
        try:
            ptr = self.alloc.malloc(size, stream)
        except OutOfMemoryError:
            self.verify()
            return None
        rebacked = self.alloc.stats()["rebacked_chunks"]
        if rebacked != self.rebacked:
            # Re-backing moved live bytes to new handles at the same addresses (Note [Taking slots back at the
            # edge]): their physical extents are new; the bytes are checked by each block's next kernel.
            self.rebacked = rebacked
            for other in self.live.values():
                other.extents = self.driver.physical(other.ptr, other.size)
        extents = self.driver.physical(ptr, size)
        for other in self.live.values():
            shared = _overlap(extents, other.extents)
            if shared is not None:
                raise HazardError(
                    f"malloc({size}, stream {stream}) returned 0x{ptr:x}, whose handle {shared[0]} bytes "
                    f"[{shared[1]}, {shared[2]}) belong to the live allocation 0x{other.ptr:x} of stream {other.stream}")
        block = Live(ptr, size, stream, self._value(), extents)
        self.driver.launch(stream, ptr, size, write=block.value, label=f"write of malloc 0x{ptr:x} on stream {stream}")
        self.live[ptr] = block
        self.verify()
        return ptr

    @_fails_once
    def use_on(self, ptr: int, stream: int) -> None:
        """Use a live block on another stream too: record_stream, then a kernel there after an event wait."""
        block = self.live[ptr]
        self.alloc.record_stream(ptr, stream)
        self.driver.launch(stream, ptr, block.size, expect=block.value, after=(block.stream,),
                           label=f"use of 0x{ptr:x} on stream {stream}")
        block.users.add(stream)
        self.verify()

    @_fails_once
    def free(self, ptr: int) -> None:
        """Queue the block's last use on its stream, then free it."""
        block = self.live.pop(ptr)
        self.driver.launch(block.stream, ptr, block.size, expect=block.value,
                           label=f"last use of 0x{ptr:x} before its free on stream {block.stream}")
        self.alloc.free(ptr)
        self.verify()

    @_fails_once
    def complete(self, stream: int, upto: int | None = None) -> None:
        """Run `stream`'s queued work, all of it or up to ticket `upto`."""
        self.driver.complete_stream(stream, upto)
        self.verify()

    @_fails_once
    def complete_random(self, rng: random.Random) -> None:
        self.driver.complete_random(rng)
        self.verify()

    @_fails_once
    def empty_cache(self) -> None:
        self.alloc.empty_cache()
        self.verify()

    def close(self) -> None:
        """Free everything, run all work, give everything back; nothing may leak. Does nothing after a failure."""
        if self.broken:
            return
        for ptr in list(self.live):
            self.free(ptr)
        self.driver.complete_all()
        self.verify()
        self.alloc.close()
        self.verify()
        leaks = self.driver.leaks()
        assert leaks == {k: 0 for k in leaks}, leaks
