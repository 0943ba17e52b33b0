"""The PyTorch models checked block by block: exact sizes from PyTorch's own rules, and the bundled traces' segment
creations and allocated bytes event by event, not only their peak reserved.

The rules, from c10/cuda/CUDACachingAllocator.cpp: requests are rounded up to kMinBlockSize (512 B); requests up to
kSmallSize (1 MiB) use the small pool of kSmallBuffer (2 MiB) segments; requests under kMinLargeAlloc (10 MiB) get a
kLargeBuffer (20 MiB) segment, larger ones a segment rounded up to kRoundLarge (2 MiB). should_split: a small-pool
block (or any block under expandable segments) splits when remaining >= kMinBlockSize; a large-pool block when
remaining > kSmallSize.
"""
from __future__ import annotations

import functools

import pytest

import gmlake
from gmlake import Allocator, SimDriver
from gmlake.sim.replay import GRANULARITY, bundled_traces
from gmlake.sim.trace import (
    ALLOC,
    FREE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    load,
)

KiB, MiB = 1 << 10, 1 << 20
MODEL = {"native": "caching", "expandable": "expandable"}


def _segments(alloc: Allocator) -> list[tuple[str, int, int]]:
    return [(s["pool"], s["size"], s["mapped_chunks"]) for s in alloc.segments_info()]


def _blocks(alloc: Allocator) -> list[list[tuple[int, int, str]]]:
    return [[(off, size, state) for off, size, state, _, _ in s["blocks"]] for s in alloc.segments_info()]


# ---------------------------------------------------------------- PyTorch's size rules, exactly


@pytest.mark.parametrize("request_size, segment", [
    (1, 2 * MiB), (MiB, 2 * MiB),                                  # small pool: kSmallBuffer
    (MiB + 1, 20 * MiB), (10 * MiB - 512, 20 * MiB),              # under kMinLargeAlloc: kLargeBuffer
    (10 * MiB, 10 * MiB), (10 * MiB + 1, 12 * MiB), (13 * MiB, 14 * MiB), (15 * MiB + 3, 16 * MiB),
    (99 * MiB + 1, 100 * MiB),                                     # kMinLargeAlloc and up: rounded to kRoundLarge
])
def test_caching_segment_sizes(request_size, segment):
    alloc = Allocator(SimDriver(), gmlake.policies.get("caching"))
    alloc.malloc(request_size)
    assert [s[1] for s in _segments(alloc)] == [segment]


@pytest.mark.parametrize("policy", ["caching", "expandable", "gmlake"])
@pytest.mark.parametrize("left, splits", [(0, False), (512, True), (1024, True)])
def test_small_pool_splits_with_512_bytes_left(policy, left, splits):
    """A small-pool block splits when at least kMinBlockSize (512 B) would remain: after 1 MiB, a request of
    1 MiB - `left` leaves `left` bytes of the 2 MiB segment."""
    alloc = Allocator(SimDriver(), gmlake.policies.get(policy))
    first = alloc.malloc(MiB)
    second = alloc.malloc(MiB - left)
    assert alloc.block_size(second) == MiB - left
    free_tail = [b for b in _blocks(alloc)[0] if b[2] == "free"]
    assert free_tail == ([(2 * MiB - left, left, "free")] if splits else [])
    if splits:
        tail = alloc.malloc(left)      # the tail serves a request of its size: no new segment
        assert tail == first + 2 * MiB - left and len(alloc.segments_info()) == 1
        alloc.free(tail)
    for p in (first, second):
        alloc.free(p)
    alloc.check()


@pytest.mark.parametrize("left, splits", [(MiB - 512, False), (MiB, False), (MiB + 512, True), (12 * MiB, True)])
def test_caching_large_pool_splits_only_with_more_than_1mib_left(left, splits):
    """From a free kLargeBuffer block, a request leaving `left` bytes splits it only if left > kSmallSize."""
    alloc = Allocator(SimDriver(), gmlake.policies.get("caching"))
    alloc.free(alloc.malloc(2 * MiB))                  # a free 20 MiB segment
    p = alloc.malloc(20 * MiB - left)
    assert alloc.block_size(p) == (20 * MiB - left if splits else 20 * MiB)
    assert len(_blocks(alloc)[0]) == (2 if splits else 1) and len(alloc.segments_info()) == 1


def test_caching_unsplit_block_counts_whole_in_allocated():
    """PyTorch counts the whole unsplit block as allocated (memory_allocated), not the request."""
    alloc = Allocator(SimDriver(), gmlake.policies.get("caching"))
    alloc.malloc(19 * MiB)
    assert alloc.stats()["allocated_bytes"] == 20 * MiB and alloc.stats()["requested_bytes"] == 19 * MiB


def test_expandable_large_pool_splits_with_512_bytes_left():
    alloc = Allocator(SimDriver(), gmlake.policies.get("expandable"))
    p = alloc.malloc(20 * MiB - 512)
    assert alloc.block_size(p) == 20 * MiB - 512


# ---------------------------------------------------------------- the bundled traces, event by event


@functools.cache
def _replay_events(name: str) -> dict:
    """Replay a bundled trace request by request through the policy modelling its allocator; per request, the
    reserved bytes our model grew and shrank by against the trace's own segment events since the previous request."""
    path = next(p for p in bundled_traces() if p.name == name)
    trace = load(path)
    alloc = Allocator(SimDriver(capacity=int(trace.meta.get("device_total", 0) or 0), granularity=GRANULARITY),
                      gmlake.policies.get(MODEL[trace.meta["allocator"]]))
    alloc.record_history(True)
    ev = trace.events
    ptrs: dict[int, int] = {}
    requested = 0
    reserved = 0
    grown = 0
    first_timing_mismatch = None
    requested_mismatches = 0
    for i, (action, stream, size, ident) in enumerate(zip(ev["action"].tolist(), ev["stream"].tolist(),
                                                          ev["size"].tolist(), ev["id"].tolist())):
        if action in (SEGMENT_ALLOC, SEGMENT_MAP):
            grown += size
            continue
        if action in (SEGMENT_FREE, SEGMENT_UNMAP):
            grown -= size
            continue
        if action == ALLOC:
            ptrs[ident] = alloc.malloc(size, stream)
            requested += size
        elif action == FREE:
            alloc.free(ptrs.pop(ident))
            requested -= size
        stats = alloc.stats()
        if stats["reserved_bytes"] - reserved != grown and first_timing_mismatch is None:
            first_timing_mismatch = (i, stats["reserved_bytes"] - reserved, grown)
        requested_mismatches += stats["requested_bytes"] != requested
        reserved, grown = stats["reserved_bytes"], 0
    ours = [(e["action"], e["size"]) for e in alloc.history() if e["action"] in ("segment_alloc", "segment_map")]
    created = (ev["action"] == SEGMENT_ALLOC) | (ev["action"] == SEGMENT_MAP)
    theirs = [("segment_alloc" if a == SEGMENT_ALLOC else "segment_map", s)
              for a, s in zip(ev["action"][created].tolist(), ev["size"][created].tolist())]
    return {"trace": trace, "ours": ours, "theirs": theirs, "first_timing_mismatch": first_timing_mismatch,
            "requested_mismatches": requested_mismatches, "peak_allocated": alloc.stats()["peak_allocated_bytes"]}


# PyTorch breaks best-fit ties between equal free blocks by device address, which a .gmtrace does not record (the
# model orders by segment creation); on these two native runs that choice changes the layout, so they are expected
# to diverge (strict: an exact match would fail the test, to be promoted).
_ADDRESS_ORDER = "best-fit ties broken by device address, which .gmtrace does not record"
DIVERGES_IN_ORDER = {"opt1.3b-lora-native.gmtrace", "opt350m-full-ckpt-native.gmtrace"}
DIVERGES_IN_TIMING = {"gpt2l-lora-ckpt-native.gmtrace"} | DIVERGES_IN_ORDER
DIVERGES_IN_PEAK = {"opt350m-full-ckpt-native.gmtrace"}


def _traces(diverging: set) -> list:
    return [pytest.param(p.name, marks=pytest.mark.xfail(strict=True, reason=_ADDRESS_ORDER))
            if p.name in diverging else p.name for p in bundled_traces()]


@pytest.mark.parametrize("name", _traces(DIVERGES_IN_ORDER))
def test_replay_creates_the_captured_segments_in_order(name):
    """The model creates (or maps) segments of the same sizes in the same order as the captured run did."""
    got = _replay_events(name)
    assert got["ours"] == got["theirs"]


@pytest.mark.parametrize("name", _traces(DIVERGES_IN_TIMING))
def test_replay_creates_each_segment_at_the_captured_request(name):
    """Each request grows reserved memory by exactly the segment events the captured run logged before it."""
    assert _replay_events(name)["first_timing_mismatch"] is None


@pytest.mark.parametrize("name", [p.name for p in bundled_traces()])
def test_replay_requested_bytes_match_at_every_event(name):
    assert _replay_events(name)["requested_mismatches"] == 0


@pytest.mark.parametrize("name", _traces(DIVERGES_IN_PEAK))
def test_replay_reaches_the_captured_peak_allocated(name):
    """Allocated counts whole unsplit blocks, as torch.cuda.max_memory_allocated does: the peak matches the run's."""
    got = _replay_events(name)
    assert got["peak_allocated"] == got["trace"].meta["max_memory_allocated"]


def test_native_traces_create_the_same_segments_as_their_runs_at_least_as_a_multiset():
    """Where the order diverges, the set of segment sizes still matches on opt1.3b (only their order differs)."""
    got = _replay_events("opt1.3b-lora-native.gmtrace")
    assert sorted(got["ours"]) == sorted(got["theirs"]) and got["ours"] != got["theirs"]
