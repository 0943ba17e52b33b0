"""A research policy written in Python: the kind of experiment the hooks are for.

    from gmlake.policies.examples import NoSmallStitches
    alloc = Allocator(SimDriver(), NoSmallStitches(threshold=64 << 20))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.policies.gmlake import PaperPolicy


@dataclass(frozen=True)
class NoSmallStitches(PaperPolicy):
    """GMLake, except that requests under `threshold` bytes never stitch, and neither do stitches that would map
    more than `max_pieces` pieces: each piece costs driver time, and small requests gain little from stitching."""

    name: ClassVar[str] = "no-small-stitches"

    threshold: int = 64 << 20
    max_pieces: int = 16

    def allow_stitch(self, size: int, stream: int, pieces: list[int], new_bytes: int) -> bool:
        return size >= self.threshold and len(pieces) <= self.max_pieces
