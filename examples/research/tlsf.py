"""TLSF's good-fit placement as a gmlake policy: a worked example of putting a published idea on gmlake's seams.

TLSF (M. Masmano, I. Ripoll, A. Crespo, J. Real: "TLSF: a New Dynamic Memory Allocator for Real-Time Systems",
ECRTS 2004) keeps free blocks in segregated lists: a first level per power of two, and a second level that cuts each
power of two into 2**sl_bits equal classes. A request is rounded *up* to the start of the next class, so that every
block in that class or above fits it with no search, and takes a block of the smallest non-empty class there: a
"good fit" found in constant time, where best fit searches. The question for a GPU allocator: what does that
guarantee cost in memory against best fit, and does it change what stitching has to do?

Only placement changes, through the `choose_block` seam; growth, stitching and the sBlock cache stay gmlake's.

    gmlake compare --policy gmlake --policy examples/research/tlsf.py:TLSFPlacement
    gmlake compare --policy gmlake --policy 'examples/research/tlsf.py:TLSFPlacement[sl_bits=2]'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.core.view import FreeBlock
from gmlake.policies import GMLakePolicy


@dataclass(frozen=True)
class TLSFPlacement(GMLakePolicy):
    """gmlake with TLSF's good-fit placement: a request takes a free block of the smallest size class at or above
    its own size rounded up to a class boundary, never a block of its own class that might be too small."""

    name: ClassVar[str] = "tlsf"
    sl_bits: int = 4            # 16 second-level classes per power of two, the paper's usual setting

    def size_class(self, size: int) -> tuple[int, int]:
        """(first level, second level): the power of two below `size`, and which of its 2**sl_bits slices."""
        first = size.bit_length() - 1
        if first < self.sl_bits:
            return first, 0
        return first, (size >> (first - self.sl_bits)) & ((1 << self.sl_bits) - 1)

    def round_up_to_class(self, size: int) -> int:
        """TLSF's mapping_search: the start of the next class, so that every block of that class holds `size`."""
        first = size.bit_length() - 1
        if first < self.sl_bits:
            return size
        step = 1 << (first - self.sl_bits)
        return (size + step - 1) & ~(step - 1)

    def choose_block(self, size, stream, pool, candidates, default, state):
        wanted = self.size_class(self.round_up_to_class(size))
        chosen = None
        for i, block in enumerate(candidates):
            if not isinstance(block, FreeBlock):
                continue
            found = self.size_class(block.size)
            # The smallest class at or above the wanted one; within a class TLSF takes its list's head (the block
            # freed last). Candidates carry no free order, so the lowest address stands in for it.
            if found >= wanted and (chosen is None or (found, block.addr) < chosen[0]):
                chosen = ((found, block.addr), i)
        if chosen is not None:
            return chosen[1]
        # No free block in those classes: TLSF would take new memory. Keep gmlake's cached sBlocks, which TLSF
        # has no notion of, where the built-in would use one; otherwise grow (or stitch) as gmlake does.
        if default is not None and not isinstance(candidates[default], FreeBlock):
            return default
        return None
