"""The table of growths: each built-in way new memory is laid out (a policy's `segment_rule`), described once.

A row holds the growth's class in the core, whether it stitches, the knobs that name its page sizes and the knobs
that size its new memory. The knob module's rules (which knobs only a stitching growth reads, what a user who set a
size knob another growth reads meant, which names `segment_rule` takes) are derived from this table; the Allocator
makes the class a policy's row names (Knobs.growth_class). Nothing outside this file compares a growth's name:
what differs between growths is asked of the growth itself (gmlake.core._allocator.Growth.page and friends).

Adding a growth: its strategy in its own file (gmlake/core/_growth_NAME.pxi, with its `include` line in
_allocator.pyx), its declaration in gmlake/core/_allocator.pxd, and one row here (docs/design.md, "Adding a
growth").
"""
from __future__ import annotations

from dataclasses import dataclass

from gmlake.core._allocator import ChunkGrowth, ExpandableGrowth, PyTorchGrowth


@dataclass(frozen=True)
class GrowthRow:
    """One growth: its class in the core, whether it stitches, the knobs naming its page sizes (the large page
    first) and the knobs that size its new memory."""

    cls: type
    stitches: bool
    pages: tuple[str, ...]
    sizing: tuple[str, ...]


GROWTHS: dict[str, GrowthRow] = {
    "chunks": GrowthRow(ChunkGrowth, stitches=True, pages=("chunk_size",),
                        sizing=("chunk_size", "small_segment_size")),
    "pytorch": GrowthRow(PyTorchGrowth, stitches=False, pages=(),
                         sizing=("large_segment_size", "min_large_alloc", "round_large", "small_segment_size")),
    "expandable": GrowthRow(ExpandableGrowth, stitches=True,
                            pages=("expandable_page_large", "capped_page_large", "expandable_page_small", "edge_page",
                                   "tail_page"),
                            sizing=("expandable_page_large", "capped_page_large", "expandable_page_small",
                                    "expandable_reserve", "edge_page")),
}

SEGMENT_RULES = tuple(GROWTHS)                                                  # the names segment_rule takes
STITCHING = tuple(name for name, row in GROWTHS.items() if row.stitches)        # the growths that stitch
# What sizes new memory under each growth: what a user who set a size knob another growth reads meant.
SIZING = {name: row.sizing for name, row in GROWTHS.items()}

__all__ = ["GROWTHS", "SEGMENT_RULES", "SIZING", "STITCHING", "GrowthRow"]
