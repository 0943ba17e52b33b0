"""What a policy hook sees: plain, read-only copies of the allocator's state, built only when a hook is called.

The core fills these in while it holds its lock, so they describe the moment of the decision; keeping one after the
hook returns is safe (they are copies), but it no longer describes the allocator.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

#: What `Policy.relieve_pressure` may ask for, from the least disruptive to the most. Each first waits for every
#: stream (so blocks freed on any stream serve any stream), then:
#:   "sync": releases nothing more;
#:   "release_other_pool": returns free memory of the pool the request does not use (up to the request's size);
#:   "release_all": returns every free chunk of both pools, evicting cached sBlocks (asking `evict_victim`);
#:   "reback": "release_all", then re-backs every partly used chunk in slots of `reback_slot` bytes, giving the free
#:   slots back (Note [Taking slots back at the edge]; nothing more where the policy's reback_slot is 0).
PRESSURE_ACTIONS = ("sync", "release_other_pool", "release_all", "reback")


class FreeBlock(NamedTuple):
    """A free primitive block: `size` bytes at `addr`, freed on `stream` (-1: usable by any stream), at `offset`
    bytes into segment `segment` (segments are numbered in creation order, the same on every driver)."""

    addr: int
    size: int
    stream: int
    segment: int
    offset: int


class CachedSBlock(NamedTuple):
    """A stitched block kept mapped after its allocation was freed.

    id: its serial number (stable while it lives); va / va_bytes: its virtual range; size: the bytes its pieces
    carry (its capacity); pieces: (home address, bytes) of each piece, in order; handles: physical handles it maps
    (what evicting it unmaps); stream: the stream its last allocation ran on; age: frees since its last use;
    free: whether all its pieces are free right now (False: some are in use by other allocations, so it can only
    serve a request after they are freed).
    """

    id: int
    va: int
    va_bytes: int
    size: int
    pieces: tuple
    handles: int
    stream: int
    age: int
    free: bool


class FreeBlocks(Sequence):
    """AllocatorState.free_blocks: the FreeBlocks a stream may use, walked from the allocator on first read.

    Most hooks never look at them, and the walk visits every free block the stream may use, so it is done only when
    read, and only while the hook runs (the allocator waits for the hook, so the walk sees the moment of the
    decision). Read after the hook returned, it raises: the allocator has moved on. A read inside the hook keeps the
    blocks, which can then be used after it as a plain copy."""

    __slots__ = ("_blocks", "_walk")

    def __init__(self, walk: Callable[[], tuple] | None = None, blocks: tuple | None = None):
        self._walk = walk
        self._blocks = blocks

    def _get(self) -> tuple:
        if self._blocks is None:
            if self._walk is None:
                raise RuntimeError("gmlake: AllocatorState.free_blocks was first read after its hook returned; read "
                                   "it inside the hook (the allocator has moved on since)")
            self._blocks = self._walk()
            self._walk = None
        return self._blocks

    def _expire(self) -> None:
        """The hook returned: no walk from now on (blocks already read stay)."""
        self._walk = None

    def __len__(self) -> int:
        return len(self._get())

    def __getitem__(self, index):
        return self._get()[index]

    def __iter__(self) -> Iterator[FreeBlock]:
        return iter(self._get())

    def __eq__(self, other) -> bool:
        return self._get() == (other._get() if isinstance(other, FreeBlocks) else other)

    def __hash__(self) -> int:
        return hash(self._get())

    def __repr__(self) -> str:
        return repr(self._get()) if self._blocks is not None or self._walk is not None else "FreeBlocks(<expired>)"


class AllocatorState(NamedTuple):
    """The allocator at the moment a hook is asked. Bytes throughout.

    reserved: physical memory held; allocated: bytes held by live allocations; active: allocated plus frees still
    waiting for other streams; limit: the cap set by set_limit (None: none); capacity: the device's memory (0: the
    driver models no bound); cached_sblocks: stitched blocks kept mapped; stream: the stream of the request being
    decided; free_blocks: the free blocks that stream may use (its own and those of no stream), both pools, in the
    core's best-fit order (the default pool's), a FreeBlocks sequence walked on first read inside the hook;
    private_pool: the private pool (graph capture, see docs/graphs.md)
    serving the request, 0 for the default pool. A pool's request asks only should_split, segment_layout and
    relieve_pressure (never choose_block or the stitch hooks: a pool neither searches the default pool nor stitches).
    """

    reserved: int
    allocated: int
    active: int
    limit: int | None
    capacity: int
    cached_sblocks: int
    stream: int
    free_blocks: FreeBlocks
    private_pool: int = 0

    @property
    def headroom(self) -> int:
        """Bytes the allocator may still reserve before the cap or the device's memory (None of either: -1)."""
        bound = self.limit if self.limit is not None else self.capacity or None
        return bound - self.reserved if bound is not None else -1
