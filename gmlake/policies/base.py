"""The policy interface: the knobs the allocator core reads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

MiB = 1 << 20


@dataclass(frozen=True)
class Policy:
    """Knobs of the allocator core. Sizes are in bytes.

    round_to: requests are rounded up to this many bytes (PyTorch uses 512).
    small_size: requests up to this size go to the small pool, packed into `small_segment_size` segments and never
        stitched, so small tensors do not fragment the chunks that large ones stitch.
    chunk_size: size of one physical handle in the large pool. Smaller handles stitch more finely; every handle a
        stitch maps costs about 40 µs of driver time (cuMemSetAccess), so larger handles stitch cheaper.
    stitch: whether to stitch free blocks at all (False gives a plain caching allocator over VMM chunks).
    min_stitch_size: requests below this size never stitch; they get new chunks instead.
    max_cached_sblocks: stitched blocks kept mapped after their allocation is freed, least recently used evicted
        first (0: unbounded).
    sblock_search_depth: how many cached stitched blocks a request examines before it gives up on reuse.
    """

    name: ClassVar[str] = "base"

    round_to: int = 512
    small_size: int = 1 * MiB
    small_segment_size: int = 2 * MiB
    chunk_size: int = 2 * MiB
    stitch: bool = True
    min_stitch_size: int = 0
    max_cached_sblocks: int = 4096
    sblock_search_depth: int = 8

    def validate(self, granularity: int) -> None:
        """Raise ValueError if the knobs do not suit a driver of this allocation granularity."""
        def positive(field: str) -> None:
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"gmlake: policy {self.name}: {field} must be a positive int, got {value!r}")

        for field in ("round_to", "small_size", "small_segment_size", "chunk_size", "sblock_search_depth"):
            positive(field)
        if self.round_to & (self.round_to - 1):
            raise ValueError(f"gmlake: policy {self.name}: round_to must be a power of two, got {self.round_to}")
        if self.chunk_size % granularity:
            raise ValueError(
                f"gmlake: policy {self.name}: chunk_size {self.chunk_size} is not a multiple of the driver's "
                f"granularity {granularity}")
        if self.small_segment_size % granularity or self.small_segment_size < self.small_size:
            raise ValueError(
                f"gmlake: policy {self.name}: small_segment_size must be a multiple of {granularity} "
                f"and at least small_size")
        if self.min_stitch_size < 0 or self.max_cached_sblocks < 0:
            raise ValueError(f"gmlake: policy {self.name}: min_stitch_size and max_cached_sblocks must be >= 0")
