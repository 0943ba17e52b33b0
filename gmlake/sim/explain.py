"""Where a policy's memory goes at its peak.

Replay a trace to the moment of peak growth, stop there, and account for every reserved byte. The moment of peak
growth is the first request after which reserved memory is within `within` (1 %) of its peak: the growth that took
reserved memory to (nearly) its peak, which is the one a policy should have avoided. It is not always the request
that reached the peak exactly: on gpt2l-lora-ckpt-native under gmlake-paper, request #46937 (a 2994 MiB tensor)
takes reserved memory to 99.98 % of its peak, and the exact peak comes 17,182 requests later (#64119), when a 0.08
MiB request adds a 2 MiB small-pool segment; by then the activations are freed and 85.6 % of reserved memory is free
whole chunks, which says nothing about why it was reserved. Growth after the chosen moment adds under `within` of
the peak; the output says how much, and where the exact peak was.

What the account holds: what live tensors asked for, what rounding added, and where the free bytes lie. Free bytes in
the large pool are split by what stitching can still do with them: whole free chunks (any stitch can map them), and
pieces of chunks that also hold live blocks (a handle maps only whole, so such a piece can be only the first or the
last piece of a stitch, or serve a request on its own). The live blocks that share chunks with free pieces are
counted too, smaller than a chunk or not: they say whether the free pieces sit between small live blocks (a finer
page for such requests would free whole pages) or at the ends of large ones (where placement, not page size, would
help).

    gmlake explain run.gmtrace [--policy gmlake] [--cap SIZE] [--event-lag N]
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gmlake.policies import Policy, PolicyChoice, choice_of, get
from gmlake.policies.settings import format_size
from gmlake.sim.replay import PEAK_GROWTH_WITHIN, modelled_device_memory, peak_growth_moment, run_requests
from gmlake.sim.trace import Trace

MiB = 1 << 20
WITHIN = PEAK_GROWTH_WITHIN   # the moment explained: the first request that brings reserved within 1 % of its peak
FRAGMENT_CLASSES = ((2 * MiB, "< 2 MiB"), (20 * MiB, "2-20 MiB"), (None, ">= 20 MiB"))
PINNING_CLASSES = ("smaller than a chunk", "a chunk or more")


@dataclass
class PeakBreakdown:
    """The allocator's reserved bytes at the moment of peak growth (see the module docstring), by use. Sizes in
    bytes."""

    trace: str
    policy: str
    request_index: int          # among the trace's requests: the moment explained (the growth to the peak)
    request_size: int           # the size that request asked for
    reserved: int               # reserved bytes right after that request
    requested: int              # what live allocations asked for
    rounding: int               # allocated - requested: rounding and unsplit remainders inside live blocks
    free_small: int             # free bytes in the small pool's segments
    free_whole_chunks: int      # large pool: free chunks with no live block in them
    free_in_shared_chunks: int  # large pool: free bytes in chunks that also hold live blocks
    fragments: dict = field(default_factory=dict)  # free large blocks by size class: {class: (count, bytes)}
    # live large blocks in the chunks that hold free_in_shared_chunks, by size against their chunk: {class: (count,
    # bytes)}
    pinning: dict = field(default_factory=dict)
    ooms: int = 0               # requests of the whole replay that ran out of memory (the peak covers the rest)
    peak_reserved: int = 0      # the most bytes the replay ever reserved
    peak_request_index: int = 0  # the request that first reached peak_reserved
    growth: int = 0             # reserved bytes the explained request added
    later_growth: int = 0       # reserved bytes added by requests after it (together under `within` of the peak)
    within: float = WITHIN
    cap: int = 0                # the memory cap replayed (set_per_process_memory_fraction's, in bytes; 0: none)
    event_lag: int = 0          # requests between an event's recording and its completion (Note [Event lag in replay])
    policy_spec: str = ""
    knobs: dict = field(default_factory=dict)
    # Just before the explained request: the large pool's free blocks its stream may use
    free_before: int = 0
    free_pieces_before: int = 0
    largest_free_before: int = 0
    page: int = 0               # the page (chunk) its large-pool memory grew by
    # The same request under other policies, each replayed on its own up to it: {policy label: (what it is,
    # bytes it grew reserved by, its page)}
    elsewhere: dict = field(default_factory=dict)
    # The whole replay's plan (Allocator.stats()["plan"], Note [A plan learned from the run]); None: no plan
    plan: dict | None = None

    @property
    def words(self) -> str:
        """Why it grew, in words first: what was asked, what was free and in what pieces, how it was served, and
        what the other policies did with the same request."""
        text = (f"{_size(self.request_size)} asked (request #{self.request_index}); "
                f"{_size(self.free_before)} free in {self.free_pieces_before} "
                f"piece{'' if self.free_pieces_before == 1 else 's'}")
        if self.free_pieces_before:
            text += f", the largest {_size(self.largest_free_before)}"
            text += " (it fits)" if self.largest_free_before >= self.request_size else " (too small)"
        text += f"; {self.policy} grew reserved by {self._grown(self.growth, self.page)}"
        others = []
        for label, (what, grew, page) in self.elsewhere.items():
            if grew <= 0:
                others.append(f"{what} ({label}) would have served it with 0 new pages")
            else:
                others.append(f"{what} ({label}) would have grown {self._grown(grew, page)}")
        return text + ("; " + "; ".join(others) if others else "")

    def _grown(self, grew: int, page: int) -> str:
        text = _size(grew)
        if page and grew > 0:
            text += f" ({_pages(grew, page)}"
            text += ", the rest from free memory)" if grew < self.request_size else ")"
        elif 0 < grew < self.request_size:
            text += " (the rest from free memory)"
        return text

    @property
    def why(self) -> str:
        """Which moment this is and why, in a sentence."""
        share = 100 * self.reserved / self.peak_reserved if self.peak_reserved else 100.0
        text = (f"request #{self.request_index} ({self.request_size / MiB:.2f} MiB) grew reserved memory by "
                f"{self.growth / MiB:.1f} MiB to {self.reserved / 2**30:.3f} GiB, {share:.2f} % of the peak: the first "
                f"request within {100 * self.within:g} % of it")
        if self.peak_request_index != self.request_index:
            text += (f"; later growth adds {self.later_growth / MiB:.1f} MiB, the exact peak "
                     f"{self.peak_reserved / 2**30:.3f} GiB is reached at request #{self.peak_request_index}")
        return text

    @property
    def plan_words(self) -> str | None:
        """What the plan did over the whole replay, in a sentence (None: no plan)."""
        p = self.plan
        if not p:
            return None
        state = "settled" if p["settled"] else "not settled"
        return (f"plan ({p['planner']}): {p['hits']} hits, {p['misses']} misses over {p['sizes_seen']} sizes, "
                f"{p['replans']} re-plans, {state} at the end; {p['calls_after_settled']} driver calls and "
                f"{p['new_highs_after_settled']} new highs of reserved memory while settled")

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


def _chunks_of(offset: int, size: int, chunk: int) -> range:
    """The indices of the chunks a block at `offset` of `size` bytes overlaps."""
    return range(offset // chunk, -(-(offset + size) // chunk))


def _free_bytes(segments: list[dict]) -> tuple[int, int, int, dict, dict]:
    """(small-pool free, whole free chunks, free bytes in shared chunks, large fragments by class, live large
    blocks in the chunks that hold those shared free bytes by class)."""
    small = whole = shared = 0
    fragments = {label: [0, 0] for _, label in FRAGMENT_CLASSES}
    pinning = {label: [0, 0] for label in PINNING_CLASSES}
    for seg in segments:
        chunk = seg["chunk_size"]
        partly_free = set()                             # chunks of this segment holding a shared free piece
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
            if offset % chunk:
                partly_free.add(offset // chunk)
            if (offset + size) % chunk:
                partly_free.add((offset + size) // chunk)
            for limit, label in FRAGMENT_CLASSES:
                if limit is None or size < limit:
                    fragments[label][0] += 1
                    fragments[label][1] += size
                    break
        if seg["pool"] == "small" or not partly_free:
            continue
        for offset, size, state, _stream, _requested in seg["blocks"]:
            # Only live bytes pin a chunk: an unmapped hole (an expandable range's unreserved tail) holds none.
            if state in ("allocated", "claimed") and not partly_free.isdisjoint(_chunks_of(offset, size, chunk)):
                label = PINNING_CLASSES[size >= chunk]
                pinning[label][0] += 1
                pinning[label][1] += size
    return (small, whole, shared, {k: tuple(v) for k, v in fragments.items()},
            {k: tuple(v) for k, v in pinning.items()})


def _size(n: int) -> str:
    return format_size(n) if n else "0 B"


def _pages(n: int, page: int) -> str:
    count = -(-n // page)
    return f"{count} new page{'' if count == 1 else 's'} of {format_size(page)}"


def _free_for_stream(segments: list[dict], stream: int) -> tuple[int, int, int]:
    """(bytes, pieces, largest) of the large pool's free blocks that `stream` may use (its own and those of no
    stream), in the default pool."""
    sizes = [size for seg in segments if seg["pool"] == "large" and not seg.get("private_pool")
             for _offset, size, state, owner, _requested in seg["blocks"] if state == "free" and owner in (stream, -1)]
    return sum(sizes), len(sizes), max(sizes, default=0)


# What `explain` compares a policy's growth with: the same request under stitching and under expandable segments.
ELSEWHERE = (("gmlake-paper", "stitching"), ("expandable", "expandable segments"))


def _growth_at(trace: Trace, policy: Policy, moment: int, device_memory: int | None, cap: int,
               event_lag: int) -> int:
    """Bytes request #`moment` grew reserved memory by under `policy`, replayed on its own up to it."""
    _, out = run_requests(trace, policy, device_memory, upto=moment + 1, samples=moment + 1, cap=cap,
                          event_lag=event_lag)
    reserved = out["timeline"]["reserved"]
    return int(reserved[moment]) - (int(reserved[moment - 1]) if moment else 0)


class NothingToExplain(ValueError):
    """The replay never reserved memory: the trace has no allocations, or none fit the modelled device."""


def explain(trace: Trace, policy: Policy | str | PolicyChoice = "gmlake", device_memory: int | None = None,
            within: float = WITHIN, cap: int = 0, event_lag: int = 0) -> PeakBreakdown:
    """Account for `policy`'s reserved bytes at its moment of peak growth on `trace` (replayed on the sim driver,
    under a memory cap of `cap` bytes, 0: none, and with events completing `event_lag` requests after they are
    recorded, as gmlake.sim.replay.replay takes both): the first request after which
    reserved memory is within `within` of its peak. Raises NothingToExplain if the replay never reserved any
    memory."""
    if not 0 <= within < 1:
        raise ValueError(f"within must be in [0, 1), got {within!r}")
    choice = choice_of(policy)
    policy = choice.policy
    n = len(trace.requests())
    # One timeline sample per request: the replay samples each window's maximum, and a window of one request is
    # the reserved bytes right after it.
    replayed, full = run_requests(trace, policy, device_memory, samples=max(1, n), cap=cap, event_lag=event_lag)
    plan = replayed.stats().get("plan")
    if full["peak_reserved"] == 0:
        if not (trace.requests()["action"] == 0).any():
            raise NothingToExplain(f"{trace.name}: the trace has no allocations to explain")
        where = f"under a {format_size(cap)} memory cap" if cap else "on the modelled device"
        raise NothingToExplain(f"{trace.name}: policy {choice.label} served no request ({full['ooms']} out of memory "
                               f"{where}), so no memory was reserved to explain")
    timeline = full["timeline"]
    if len(timeline["event"]) != n + 1 or not np.array_equal(timeline["event"][:n], np.arange(n)):
        raise RuntimeError("explain: the replay did not sample every request")
    reserved_after = timeline["reserved"][:n]
    moment = peak_growth_moment(reserved_after, within)
    growths = np.diff(reserved_after, prepend=0)
    # The same cap again: replaying up to the moment without it could reserve differently (Note [Releasing before
    # the cap binds]) and would not be the state the full replay had.
    alloc, _ = run_requests(trace, policy, device_memory, upto=moment + 1, samples=1, cap=cap, event_lag=event_lag)
    stats = alloc.stats()
    if stats["reserved_bytes"] != reserved_after[moment]:   # the replay is deterministic; this guards the bookkeeping
        raise RuntimeError(f"explain: replaying {moment + 1} requests reached {stats['reserved_bytes']} reserved "
                           f"bytes, not the {reserved_after[moment]} of the full replay")
    small, whole, shared, fragments, pinning = _free_bytes(alloc.segments_info())
    request = trace.requests()[moment]
    before, _ = run_requests(trace, policy, device_memory, upto=moment, samples=1, cap=cap, event_lag=event_lag)
    free_before, pieces, largest = _free_for_stream(before.segments_info(), int(request["stream"]))
    # the page a request maps, as the growth says it (a cap below the modelled device's memory binds)
    page = alloc.growth.page(policy, bool(cap) and cap < modelled_device_memory(trace, device_memory))
    elsewhere = {}
    for name, what in ELSEWHERE:
        other = get(name)
        if other.label() != choice.label:
            page_there = other.growth().page(other)
            elsewhere[name] = (what, _growth_at(trace, other, moment, device_memory, cap, event_lag), page_there)
    return PeakBreakdown(
        trace=trace.name, policy=choice.label, request_index=moment, request_size=int(request["size"]),
        reserved=stats["reserved_bytes"], requested=stats["requested_bytes"],
        rounding=stats["allocated_bytes"] - stats["requested_bytes"], free_small=small, free_whole_chunks=whole,
        free_in_shared_chunks=shared, fragments=fragments, pinning=pinning, ooms=full["ooms"],
        peak_reserved=full["peak_reserved"], peak_request_index=full["peak_event"], growth=int(growths[moment]),
        later_growth=int(growths[moment + 1:].clip(min=0).sum()), within=within, cap=cap, event_lag=event_lag,
        policy_spec=choice.spec, knobs=choice.policy.knob_values(), free_before=free_before,
        free_pieces_before=pieces, largest_free_before=largest, page=page, elsewhere=elsewhere, plan=plan)
