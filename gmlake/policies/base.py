"""The policy interface: the knobs the allocator core reads, and the hooks a Python subclass may override."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

MiB = 1 << 20
SEGMENT_RULES = ("chunks", "pytorch", "expandable")


@dataclass(frozen=True)
class Policy:
    """How the allocator places requests, splits blocks and keeps stitched blocks. Sizes are in bytes.

    Placement:
      segment_rule: how new memory is laid out when no free block fits.
        "chunks": the shortfall of a request in whole `chunk_size` handles, stitched with free blocks (gmlake).
        "pytorch": PyTorch's native rule, one handle per segment: 2 MiB for the small pool, `large_segment_size`
          for requests under `min_large_alloc`, else the request rounded up to `round_large`.
        "expandable": PyTorch's expandable segments: one VA range per stream and pool that grows by mapping pages of
          `expandable_page_small` / `expandable_page_large` bytes.
      stitch: whether to stitch free blocks at all (only with "chunks").
      min_stitch_size: requests below this size never stitch; they get new chunks instead.
      min_saved_chunks: a stitch that also needs new chunks must save at least this many of them (1: stitch only
        to save memory now). 0 also stitches a free chunk tail in front of new chunks, which saves nothing at once
        but leaves one tail instead of two: on runs that grow by many tensors of a few chunks (optimizer states),
        tails add up to several percent of reserved memory otherwise. Costs a stitch per growth.
      cross_stream: whether a block freed on one stream may serve another once the first stream's work is done
        (PyTorch keeps every block on its stream).
      round_to: requests are rounded up to this many bytes (PyTorch: 512).
      small_size / small_segment_size: requests up to small_size use a small pool of small_segment_size segments,
        never stitched, so small tensors do not fragment the chunks that large ones stitch.
      chunk_size: one physical handle of the large pool under "chunks". Smaller handles stitch more finely; each
        handle a stitch maps costs about 30 µs of cuMemSetAccess on an H200, so larger handles stitch cheaper.
    Splitting:
      large_split_min: a large block is split only if more than this would remain (PyTorch native: 1 MiB).
      max_split_size / max_non_split_rounding: PyTorch's oversize-block rules (0: no limit).
    Stitched blocks:
      max_cached_sblocks: sBlocks kept mapped after their allocation is freed, least recently used evicted first.
      sblock_search_depth: how many cached sBlocks a request examines before it gives up on reuse.
      sblock_first: a cached sBlock that fits more tightly than the best free block serves the request (the
        paper's order). Off, cached sBlocks serve only requests no free block fits: each check costs a lookup per
        piece, so this keeps the search off the common path.

    Hooks: override `should_split`, `allow_stitch` or `evict_victim` in a subclass to decide from Python. They run
    with the GIL and only where the decision is made, so the built-in policies keep the nogil path.
    """

    name: ClassVar[str] = "base"

    round_to: int = 512
    small_size: int = 1 * MiB
    small_segment_size: int = 2 * MiB
    chunk_size: int = 2 * MiB
    segment_rule: str = "chunks"
    stitch: bool = True
    min_stitch_size: int = 0
    min_saved_chunks: int = 1
    cross_stream: bool = True
    large_split_min: int = 0
    max_split_size: int = 0
    max_non_split_rounding: int = 20 * MiB
    large_segment_size: int = 20 * MiB
    min_large_alloc: int = 10 * MiB
    round_large: int = 2 * MiB
    expandable_page_small: int = 2 * MiB
    expandable_page_large: int = 20 * MiB
    expandable_reserve: int = 0
    max_cached_sblocks: int = 4096
    sblock_search_depth: int = 8
    sblock_first: bool = True

    # ------------------------------------------------------------------ hooks

    def should_split(self, block_size: int, size: int, pool: str, default: bool) -> bool:
        """Split a free block of `block_size` bytes to serve `size` bytes? `default` is the built-in answer."""
        return default

    def allow_stitch(self, size: int, stream: int, pieces: list[int], new_bytes: int) -> bool:
        """Stitch `pieces` (free bytes, largest first) plus `new_bytes` of new memory for a `size`-byte request?
        False allocates the whole request as new memory instead."""
        return True

    def evict_victim(self, cached: list[dict]) -> int:
        """Which cached sBlock to evict when the cache is over `max_cached_sblocks` or memory is short: an index into
        `cached`, oldest first, each a dict of capacity, va_bytes, handles, pieces and age (in frees since last use).
        The default evicts the least recently used."""
        return 0

    def overrides(self, hook: str) -> bool:
        """Whether this policy's class overrides `hook` (the core calls Python only then)."""
        return getattr(type(self), hook) is not getattr(Policy, hook)

    # ------------------------------------------------------------------ checks

    def validate(self, granularity: int) -> None:
        """Raise ValueError if the knobs do not suit a driver of this allocation granularity."""
        def positive(field: str) -> None:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"gmlake: policy {self.name}: {field} must be a positive int, got {value!r}")

        for field in ("round_to", "small_size", "small_segment_size", "chunk_size", "sblock_search_depth",
                      "large_segment_size", "min_large_alloc", "round_large", "expandable_page_small",
                      "expandable_page_large"):
            positive(field)
        for field in ("min_stitch_size", "min_saved_chunks", "max_cached_sblocks", "large_split_min",
                      "max_split_size", "max_non_split_rounding", "expandable_reserve"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"gmlake: policy {self.name}: {field} must be an int >= 0, got {value!r}")
        if self.segment_rule not in SEGMENT_RULES:
            raise ValueError(
                f"gmlake: policy {self.name}: segment_rule must be one of {', '.join(SEGMENT_RULES)}, "
                f"got {self.segment_rule!r}")
        if self.round_to & (self.round_to - 1):
            raise ValueError(f"gmlake: policy {self.name}: round_to must be a power of two, got {self.round_to}")
        for field in ("chunk_size", "small_segment_size", "large_segment_size", "round_large",
                      "expandable_page_small", "expandable_page_large"):
            if getattr(self, field) % granularity:
                raise ValueError(
                    f"gmlake: policy {self.name}: {field} {getattr(self, field)} is not a multiple of the driver's "
                    f"granularity {granularity}")
        if self.small_segment_size < self.small_size:
            raise ValueError(f"gmlake: policy {self.name}: small_segment_size must be at least small_size")

    # ------------------------------------------------------------------ identity (results, labels)

    def knob_values(self) -> dict[str, object]:
        """Every knob of this policy (its dataclass fields) with its value: the full setting a result records."""
        from dataclasses import fields

        return {f.name: getattr(self, f.name) for f in fields(self)}

    def label(self) -> str:
        """A short name for tables and plots: the class's own `name` (else its class name) and, in parentheses,
        the knobs that differ from the class's defaults, e.g. `MaxPieces(max_pieces=2)`, sizes with a binary unit
        (`chunk_size=8MiB`). Two policies of one class with different knobs get different labels."""
        from dataclasses import MISSING, fields

        def short(value: object) -> str:
            if isinstance(value, bool):
                return "true" if value else "false"
            if isinstance(value, int) and value >= 1024:
                for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                    if value % scale == 0:
                        return f"{value // scale}{unit}"
            return str(value)

        cls = type(self)
        base = cls.__dict__.get("name") or cls.__name__    # an inherited `name` would hide the subclass
        changed = [f"{f.name}={short(getattr(self, f.name))}" for f in fields(self)
                   if f.default is MISSING or getattr(self, f.name) != f.default
                   or type(getattr(self, f.name)) is not type(f.default)]
        return f"{base}({', '.join(changed)})" if changed else base
