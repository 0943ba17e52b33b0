"""gmlake's policies: the default (an expandable base that stitches only where it saves memory) and the paper's
design (2 MiB chunks, stitch whenever it saves a chunk), kept so the two stay comparable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.policies.base import MiB, Policy


@dataclass(frozen=True)
class GMLakePolicy(Policy):
    """The default. Memory grows as PyTorch's expandable segments grow it (one VA range per stream and pool, 20 MiB
    pages mapped at the lowest address with room, one cuMemSetAccess per growth), so a step that fits in what is
    mapped makes no driver call. When a request fits in no free run, gmlake stitches free pages from anywhere in
    the ranges (plus new pages for the shortfall) instead, but only where that maps at least `min_saved_chunks`
    fewer new pages than growing would.

    Note [Why an expandable base]: the paper's design maps 2 MiB handles, and the driver charges cuMemSetAccess per
    handle whatever its size, so every new segment and every stitch costs in proportion to its bytes; on dynamic
    shapes that never reaches a steady state. An expandable base grows by large pages and stitches only where that
    saves pages, so it makes a small fraction of the paper's stitches and driver time at nearly its utilization
    (docs/benchmarks.md: `gmlake compare`, and the replay figures beside it).

    It never moves or unmaps memory a live block uses: re-backing partly used pages at the edge of memory
    (`reback_slot`, Note [Taking slots back at the edge], gmlake/core/_rebacking.pxi) is off (`reback_slot=0`), since a
    kernel another thread launches while a page is re-backed faults on its unmapped live bytes and the CUDA context
    is lost. A policy may turn it on where no other thread launches work at the limit. At the edge it stitches
    wherever that saves new memory, mapping a stitch's shortfall in 2 MiB pages where 20 MiB ones would not fit
    under the limit (`edge_page`, Note [Stitching at the edge]). A cap that never binds costs nothing (Note [Finer
    pages under a cap]). What it still cannot reach at the edge are the free bytes inside 20 MiB pages that live
    blocks share; `expandable_page_large=2MiB` maps pages fine enough from the start, at many more driver calls
    (docs/benchmarks.md, "Fine pages from the start"), and the out-of-memory message suggests it where it could help.

    Cached sBlocks serve only requests no free block fits (`sblock_first=False`): checking an sBlock's pieces costs
    a lookup per piece, and an expandable range's long free tail would otherwise send every request through it.

    Note [Blocks shared by streams]: a block freed on one stream serves another once an event says the first
    stream's work is done (`cross_stream=True`). The fence is recorded only on a miss, for each other stream that
    holds free blocks, so a step that fits in what is free costs no event call. Keeping blocks on their stream as
    PyTorch does strands FSDP's gradients and unsharded parameters, freed on one stream, where the next layer's
    stream cannot use them: over FSDP, blocks kept per stream reserve markedly more a rank than blocks shared, at a
    slower step (docs/benchmarks.md, the training suite). Single-stream traces replay identically either way.
    Handing blocks over only once an event is done costs memory while the GPU trails the CPU, so on a miss the
    requesting stream takes another stream's free block at once after a wait on the GPU (`cross_stream_wait`, Note
    [Waiting for another stream's free block], gmlake/core/_streams.pxi), which over FSDP reserves less again at no
    cost to tokens/s that the runs resolve (docs/benchmarks.md, training suite).
    """

    name: ClassVar[str] = "gmlake"

    segment_rule: str = "expandable"
    stitch: bool = True
    min_saved_chunks: int = 3
    cross_stream: bool = True
    cross_stream_wait: bool = True
    sblock_first: bool = False
    reback_slot: int = 0                    # off: Note [Taking slots back at the edge] (gmlake/core/_rebacking.pxi)
    restitch_limit: int = 2                 # Note [Stitching a size again] (gmlake/core/_sblocks.pxi)
    restitch_room: int = 50                 # the limit lifted where the room under the limit is less than this percent
    restitch_share: int = 20                # ... and for a request of at least this percent of reserved
    device_reserve: int = 8 * MiB           # Note [Leaving the libraries room] (gmlake/core/_vmm.pxi)
    libraries_half_life: int = 16           # the reserve follows the libraries' rises, halving after 16 quiet asks
    edge_page: int = 2 * MiB                # Note [Stitching at the edge] (gmlake/core/_growth_expandable.pxi)


@dataclass(frozen=True)
class PaperPolicy(Policy):
    """GMLake as the paper describes it: 2 MiB chunks, best fit then split, stitch free chunks (plus new chunks for
    the shortfall) whenever that saves a chunk, stitched blocks cached; freed blocks serve other streams once an
    event says their work is done. The most memory-frugal, and the most driver calls (the defaults of Policy)."""

    name: ClassVar[str] = "gmlake-paper"
