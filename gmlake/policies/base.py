"""The policy interface: the decisions (hooks, or seams) a subclass may take over from the core, over the knobs it
declares (knobs.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.core.view import PRESSURE_ACTIONS, AllocatorState, CachedSBlock, FreeBlock
from gmlake.policies.knobs import SEGMENT_RULES, Knobs, MiB, knob, knob_specs


@dataclass(frozen=True)
class Policy(Knobs):
    """How the allocator places requests, splits blocks and keeps stitched blocks: the knobs it declares (Knobs,
    gmlake/policies/knobs.py) and the decisions a subclass may take over.

    Hooks (seams): every decision is a method a subclass may override to decide from Python: `choose_block`
    (placement), `should_split`, `choose_stitch` and `allow_stitch` (stitching), `segment_layout` (growth),
    `evict_victim` (eviction) and `relieve_pressure` (release under memory pressure). An override runs with the
    GIL, only where its decision is made; a seam no policy overrides costs nothing (the built-ins keep the nogil
    path). See docs/policies.md.
    """

    name: ClassVar[str] = "base"

    # ------------------------------------------------------------------ hooks (seams)
    # Every decision the core makes is a seam: the built-in answer is computed in C, and a subclass that overrides the
    # seam's method is asked from Python (with the GIL) at that decision only; the core checks `overrides` once, when
    # the Allocator is built. Hooks run while the allocator's lock is held: they must not call the allocator.
    # Answers are strict (True/False, an int that is not a bool, None only where allowed). An answer of the wrong
    # type or out of range fails the request with a PolicyError naming the hook; the allocator stays usable. See
    # docs/policies.md for a worked example of each.

    def choose_block(self, size: int, stream: int, pool: str, candidates: list, default: int | None,
                     state: AllocatorState) -> int | None:
        """Placement: which free block or cached sBlock serves a `size`-byte request (already rounded) on `stream`.

        `candidates` are every free block (`FreeBlock`) of `pool` ("small" or "large") big enough, the stream's own
        then those of no stream, each smallest first, then (large pool only) every cached sBlock (`CachedSBlock`)
        big enough whose pieces are free for the stream, smallest first. `default` is the index of the built-in
        choice (best fit, see `sblock_first`), or None where it found none. Return an index into `candidates`, or
        None to serve the request from new memory or a stitch instead."""
        return default

    def should_split(self, block_size: int, size: int, pool: str, default: bool) -> bool:
        """Splitting: split a free block of `block_size` bytes to serve `size` bytes? `default` is the built-in
        answer."""
        return default

    def choose_stitch(self, size: int, stream: int, blocks: list, default: list[int],
                      state: AllocatorState) -> list[int]:
        """Stitching: which free blocks to stitch for a `size`-byte request no free block fits, and in what order.

        Asked under the "chunks" and "expandable" segment rules, whatever `stitch`, `min_stitch_size` and
        `min_saved_chunks` say (they shape `default` only). `blocks` are the free large-pool blocks (`FreeBlock`)
        the stream may use, largest first; `default` the indices the built-in would stitch, in order ([]: it
        would grow instead). Return indices in stitch order, or [] to grow. The core cuts a piece from each in
        turn until the request is covered: the first piece starts at its block's address, later ones at their
        block's first chunk boundary, and every piece but the last ends on a chunk boundary (a block with no whole
        chunk adds nothing); a shortfall is allocated as new memory and stitched last. `allow_stitch` may still
        veto the result."""
        return default

    def allow_stitch(self, size: int, stream: int, pieces: list[int], new_bytes: int) -> bool:
        """Stitch `pieces` (free bytes, in stitch order) plus `new_bytes` of new memory for a `size`-byte request?
        False allocates the whole request as new memory instead."""
        return True

    def segment_layout(self, size: int, stream: int, pool: str, default: tuple[int, int],
                       state: AllocatorState) -> tuple[int, int]:
        """Growth: how a new segment for `size` bytes (a request, or a stitch's shortfall) is laid out, as
        (segment bytes, bytes per physical handle). `default` is the built-in layout: under "chunks" the size in
        whole `chunk_size` handles, under "pytorch" one handle of PyTorch's segment size, for the small pool one
        `small_segment_size` handle; under "expandable", where a new range is reserved for a stream and pool and
        then grows page by page, (the range's bytes, its page bytes). The segment must hold `size` bytes and be
        whole handles, each a multiple of the driver's granularity."""
        return default

    def evict_victim(self, cached: list, reason: str, state: AllocatorState) -> int | None:
        """Eviction: which cached sBlock (`CachedSBlock`, least recently used first) to unmap now.

        Asked when a new stitch would take the cache past `max_cached_sblocks` (`reason` "bound") and, one victim
        at a time, when memory is short and the cache is being emptied to release chunks (`reason` "pressure";
        not when empty_cache() is called, which evicts all). The default evicts the least recently used (index
        0). Return an index into `cached`, or None to evict nothing more now: over the bound the cache then grows
        past it; under pressure the chunks that the kept sBlocks map stay reserved."""
        return 0

    def relieve_pressure(self, size: int, stream: int, pool: str, attempt: int, default: str | None,
                         state: AllocatorState) -> str | None:
        """Release under pressure: what to do when a `size`-byte request found no memory, before it fails with
        out-of-memory. Asked for `attempt` 0, 1, ... (at most 4), each time the request still fails; after each
        action the request is retried. Return one of `PRESSURE_ACTIONS` ("sync", "release_other_pool",
        "release_all", "reback"), or None to give up (the request fails with OutOfMemoryError, or, with
        `device_reserve`, takes the device reserve). `default` is the built-in answer: with `cross_stream`,
        "release_other_pool" then "release_all"; without (PyTorch's rule), "release_all" twice; then "reback" where
        `reback_slot` is set; then None."""
        return default

    def cython_seams(self) -> object | None:
        """Seams decided in Cython: a `gmlake.core._allocator.Seams` subclass instance, compiled against gmlake's .pxd
        files, whose nogil methods decide the seams its `overridden` bits name, at C speed (docs/policies.md, "The
        Cython path"). None (the default): overridden seams are asked through the Python hooks above."""
        return None

    def cython_growth(self) -> object | None:
        """How new memory is laid out, decided in Cython: a `gmlake.core._allocator.Growth` subclass instance (subclass
        ChunkGrowth, PyTorchGrowth or ExpandableGrowth and override what changes), compiled against gmlake's .pxd
        files. None (the default): the built-in growth `segment_rule` names. Asked once, when the Allocator is
        made."""
        return None

    def cython_planner(self) -> object | None:
        """What the run has shown decides, in Cython: a `gmlake.core._allocator.Planner` subclass instance (subclass
        Planner or RunPlanner and override what changes), compiled against gmlake's .pxd files. None (the default):
        RunPlanner where the `plan` knob is set, else the base Planner, which plans nothing. Asked once, when the
        Allocator is made (Note [A plan learned from the run], gmlake/core/_planner.pxi)."""
        return None

    def growth(self) -> object:
        """A Growth as the Allocator makes one for this policy (its `cython_growth()`, else its `growth_class()`),
        for asking what the growth says of itself (Growth.page, Growth.oom_pages) without an allocator."""
        growth = self.cython_growth()
        return self.growth_class()() if growth is None else growth

    @classmethod
    def brings_own_growth(cls) -> bool:
        """Whether this class overrides cython_growth: then it may read any knob (Knobs.check_knobs)."""
        return cls.cython_growth is not Policy.cython_growth

    def overrides(self, hook: str) -> bool:
        """Whether this policy's class overrides `hook` (the core calls Python only then)."""
        return getattr(type(self), hook) is not getattr(Policy, hook)


__all__ = ["PRESSURE_ACTIONS", "SEGMENT_RULES", "AllocatorState", "CachedSBlock", "FreeBlock", "Knobs", "MiB", "Policy",
           "knob", "knob_specs"]
