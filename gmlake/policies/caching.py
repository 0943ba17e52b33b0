"""A faithful model of PyTorch's native CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.policies.base import MiB, Policy


@dataclass(frozen=True)
class CachingPolicy(Policy):
    """PyTorch's default allocator: per-stream best fit by (stream, size, segment, address); 512 B rounding; a small
    pool of 2 MiB segments for requests up to 1 MiB; 20 MiB segments for requests under 10 MiB, larger requests
    rounded up to 2 MiB, one cudaMalloc (here one handle) per segment; large blocks split only if more than 1 MiB
    remains; the max_split_size rules; under memory pressure every free segment is released and the request
    retried. No stitching, no cross-stream reuse."""

    name: ClassVar[str] = "caching"

    segment_rule: str = "pytorch"
    stitch: bool = False
    cross_stream: bool = False
    large_split_min: int = 1 * MiB
    max_cached_sblocks: int = 0
