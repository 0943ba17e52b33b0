"""Research policies written in Python: one small example per seam (see docs/policies.md).

    from gmlake.policies.examples import WorstFit
    alloc = Allocator(SimDriver(), WorstFit())

Each overrides one hook of `Policy`; the core asks Python at that decision only, so everything else stays on the
nogil path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.policies.base import AllocatorState, CachedSBlock, FreeBlock
from gmlake.policies.gmlake import PaperPolicy
from gmlake.policies.knobs import knob


@dataclass(frozen=True)
class WorstFit(PaperPolicy):
    """Placement: serve each request from the largest free block that fits (worst fit), so the remainders stay
    large enough to serve later requests; cached sBlocks only where the built-in would use one."""

    name: ClassVar[str] = "worst-fit"

    def choose_block(self, size: int, stream: int, pool: str, candidates: list, default: int | None,
                     state: AllocatorState) -> int | None:
        blocks = [i for i, c in enumerate(candidates) if isinstance(c, FreeBlock)]
        if default is not None and isinstance(candidates[default], CachedSBlock) or not blocks:
            return default
        return max(blocks, key=lambda i: candidates[i].size)


@dataclass(frozen=True)
class WorstFitInCython(PaperPolicy):
    """Placement: `WorstFit`'s choices, made in Cython without the GIL (gmlake/policies/_seams_example.pyx)."""

    name: ClassVar[str] = "worst-fit-cython"

    def cython_seams(self) -> object:
        # compiled research seams: loaded only for the policy that brings them
        from gmlake.policies._seams_example import WorstFitSeams
        return WorstFitSeams()


@dataclass(frozen=True)
class StitchOnlyFreeMemory(PaperPolicy):
    """Growth: stitch only where free pieces cover the whole request, else grow it whole; decided in Cython by its
    own Growth (gmlake/policies/_seams_example.pyx), as `NoSmallStitches` decides a veto in Python."""

    name: ClassVar[str] = "stitch-only-free-memory"

    def cython_growth(self) -> object:
        # compiled research seams: loaded only for the policy that brings them
        from gmlake.policies._seams_example import StitchOnlyFreeMemory as Growth
        return Growth()


@dataclass(frozen=True)
class KeepLargeBlocksWhole(PaperPolicy):
    """Splitting: never split a large-pool block when less than `min_remainder` bytes would be left over (the
    sliver would only fragment the pool); round the request up into the whole block instead."""

    name: ClassVar[str] = "keep-large-blocks-whole"

    min_remainder: int = knob(4 << 20, unit="bytes")

    def should_split(self, block_size: int, size: int, pool: str, default: bool) -> bool:
        return default and (pool == "small" or block_size - size >= self.min_remainder)


@dataclass(frozen=True)
class SmallestPiecesFirst(PaperPolicy):
    """Stitching: where the built-in stitches, stitch the smallest free blocks first instead of the largest, so
    large free blocks stay whole for requests that fit them (more handles mapped per stitch)."""

    name: ClassVar[str] = "smallest-pieces-first"

    def choose_stitch(self, size: int, stream: int, blocks: list, default: list[int],
                      state: AllocatorState) -> list[int]:
        if not default:
            return []               # the built-in grows here: so does this policy
        return sorted(range(len(blocks)), key=lambda i: (blocks[i].size, blocks[i].segment, blocks[i].offset))


@dataclass(frozen=True)
class NoSmallStitches(PaperPolicy):
    """Stitching (veto): requests under `threshold` bytes never stitch, and neither do stitches that would map
    more than `max_pieces` pieces: each piece costs driver time, and small requests gain little from stitching."""

    name: ClassVar[str] = "no-small-stitches"

    threshold: int = knob(64 << 20, unit="bytes")
    max_pieces: int = 16

    def allow_stitch(self, size: int, stream: int, pieces: list[int], new_bytes: int) -> bool:
        return size >= self.threshold and len(pieces) <= self.max_pieces


@dataclass(frozen=True)
class LargeSegments(PaperPolicy):
    """Growth: new memory comes in segments of at least `min_segment` bytes (in the usual chunk handles), so a run
    of small growths maps fewer, larger segments."""

    name: ClassVar[str] = "large-segments"

    min_segment: int = knob(64 << 20, unit="bytes")

    def segment_layout(self, size: int, stream: int, pool: str, default: tuple[int, int],
                       state: AllocatorState) -> tuple[int, int]:
        segment, handle = default
        if pool == "small":
            return default
        wanted = max(segment, self.min_segment)
        return (wanted + handle - 1) // handle * handle, handle


@dataclass(frozen=True)
class EvictOnlyWhatFrees(PaperPolicy):
    """Eviction: under memory pressure, evict only cached sBlocks whose pieces are all free (unmapping one whose
    pieces are in use releases no memory now, and the stitch would have to be redone); over the cache's bound,
    least recently used first as usual."""

    name: ClassVar[str] = "evict-only-what-frees"

    def evict_victim(self, cached: list, reason: str, state: AllocatorState) -> int | None:
        if reason != "pressure":
            return 0
        return next((i for i, sblock in enumerate(cached) if sblock.free), None)


@dataclass(frozen=True)
class SyncBeforeReleasing(PaperPolicy):
    """Release under pressure: first only wait for the streams (blocks freed on other streams may be enough), then
    release everything free; never give back the other pool alone."""

    name: ClassVar[str] = "sync-before-releasing"

    def relieve_pressure(self, size: int, stream: int, pool: str, attempt: int, default: str | None,
                         state: AllocatorState) -> str | None:
        return ("sync", "release_all")[attempt] if attempt < 2 else None


EXAMPLES = (WorstFit, WorstFitInCython, KeepLargeBlocksWhole, SmallestPiecesFirst, NoSmallStitches, LargeSegments,
            EvictOnlyWhatFrees, SyncBeforeReleasing)
