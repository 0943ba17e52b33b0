"""Where a policy's memory goes at its peak.

Replay a trace to the request that first takes reserved memory to its peak, stop there, and account for every
reserved byte: what live tensors asked for, what rounding added, and where the free bytes lie. Free bytes in the
large pool are split by what stitching can still do with them: whole free chunks (any stitch can map them), and
pieces of chunks that also hold live blocks (a handle maps only whole, so such a piece can be only the first or the
last piece of a stitch, or serve a request on its own).

    gmlake explain run.gmtrace [--policy gmlake]
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gmlake.policies import Policy, get
from gmlake.replay import replay, run_requests
from gmlake.trace import Trace

MiB = 1 << 20
FRAGMENT_CLASSES = ((2 * MiB, "< 2 MiB"), (20 * MiB, "2-20 MiB"), (None, ">= 20 MiB"))


@dataclass
class PeakBreakdown:
    """The allocator's reserved bytes at the moment they first reached their peak, by use. Sizes in bytes."""

    trace: str
    policy: str
    request_index: int          # among the trace's requests: the one that grew reserved to its peak
    request_size: int           # the size that request asked for
    reserved: int
    requested: int              # what live allocations asked for
    rounding: int               # allocated - requested: rounding and unsplit remainders inside live blocks
    free_small: int             # free bytes in the small pool's segments
    free_whole_chunks: int      # large pool: free chunks with no live block in them
    free_in_shared_chunks: int  # large pool: free bytes in chunks that also hold live blocks
    fragments: dict = field(default_factory=dict)  # free large blocks by size class: {class: (count, bytes)}
    ooms: int = 0               # requests of the whole replay that ran out of memory (the peak covers the rest)

    @property
    def lost(self) -> int:
        """Reserved bytes no live allocation asked for."""
        return self.reserved - self.requested

    def rows(self) -> list[tuple[str, int]]:
        """(what, bytes) for each use, summing to `reserved`."""
        return [
            ("requested by live allocations", self.requested),
            ("rounding inside live blocks", self.rounding),
            ("free in the small pool", self.free_small),
            ("free whole chunks (large pool)", self.free_whole_chunks),
            ("free in chunks shared with live blocks", self.free_in_shared_chunks),
        ]


def _free_bytes(segments: list[dict]) -> tuple[int, int, int, dict]:
    """(small-pool free, whole free chunks, free bytes in shared chunks, large fragments by class)."""
    small = whole = shared = 0
    fragments = {label: [0, 0] for _, label in FRAGMENT_CLASSES}
    for seg in segments:
        chunk = seg["chunk_size"]
        for offset, size, state, _stream, _requested in seg["blocks"]:
            if state != "free":
                continue
            if seg["pool"] == "small":
                small += size
                continue
            first = -(-offset // chunk)                 # the first chunk boundary at or after the block's start
            last = (offset + size) // chunk
            full = max(0, last - first) * chunk
            whole += full
            shared += size - full
            for limit, label in FRAGMENT_CLASSES:
                if limit is None or size < limit:
                    fragments[label][0] += 1
                    fragments[label][1] += size
                    break
    return small, whole, shared, {k: tuple(v) for k, v in fragments.items()}


class NothingToExplain(ValueError):
    """The replay never reserved memory: the trace has no allocations, or none fit the modelled device."""


def explain(trace: Trace, policy: Policy | str = "gmlake", device_memory: int | None = None) -> PeakBreakdown:
    """Account for `policy`'s reserved bytes at its peak on `trace` (replayed on the sim driver). Raises
    NothingToExplain if the replay never reserved any memory."""
    policy = get(policy) if isinstance(policy, str) else policy
    full = replay(trace, policy, device_memory, samples=1)
    if full.peak_reserved == 0:
        if not (trace.requests()["action"] == 0).any():
            raise NothingToExplain(f"{trace.name}: the trace has no allocations to explain")
        raise NothingToExplain(f"{trace.name}: policy {policy.name} served no request ({full.ooms} out of memory "
                               f"on the modelled device), so no memory was reserved to explain")
    upto = full.peak_event + 1
    alloc, _ = run_requests(trace, policy, device_memory, upto=upto, samples=1)
    stats = alloc.stats()
    if stats["reserved_bytes"] != full.peak_reserved:      # the replay is deterministic; this guards the bookkeeping
        raise RuntimeError(f"explain: replaying {upto} requests reached {stats['reserved_bytes']} reserved bytes, "
                           f"not the peak {full.peak_reserved}")
    small, whole, shared, fragments = _free_bytes(alloc.segments_info())
    request = trace.requests()[full.peak_event]
    return PeakBreakdown(
        trace=trace.name, policy=policy.name, request_index=full.peak_event, request_size=int(request["size"]),
        reserved=stats["reserved_bytes"], requested=stats["requested_bytes"],
        rounding=stats["allocated_bytes"] - stats["requested_bytes"], free_small=small, free_whole_chunks=whole,
        free_in_shared_chunks=shared, fragments=fragments, ooms=full.ooms)
