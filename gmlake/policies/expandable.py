"""A faithful model of PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.policies.base import Policy


@dataclass(frozen=True)
class ExpandablePolicy(Policy):
    """One VA range per stream and pool, 9/8 of the device's memory, grown by mapping 2 MiB (small pool) or 20 MiB
    (large pool) pages at the lowest address with room; blocks packed at 512 B and split whenever 512 B remain; best
    fit that counts a block's growable room; free pages unmapped under memory pressure and by empty_cache."""

    name: ClassVar[str] = "expandable"

    segment_rule: str = "expandable"
    stitch: bool = False
    cross_stream: bool = False
    cap_counts_request: bool = True     # PyTorch's alloc_block: Note [Releasing before the cap binds]
    large_split_min: int = 0
    max_cached_sblocks: int = 0
