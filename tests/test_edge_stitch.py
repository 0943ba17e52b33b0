"""Stitching at the edge of memory (Note [Stitching at the edge], gmlake/core/_growth_expandable.pxi): a request that
relief is retrying stitches wherever that maps fewer new bytes than growing would, and maps its shortfall in 2 MiB
pages where whole 20 MiB pages would not fit under the limit. Off the edge nothing changes, and nothing live moves."""
from __future__ import annotations

import ctypes

import pytest

import gmlake
from gmlake import Allocator, HostDriver, OutOfMemoryError, SimDriver

MiB = 1 << 20


def make(driver_name: str = "sim", limit: int | None = None, capacity: int = 0, **knobs) -> Allocator:
    driver = HostDriver(capacity=capacity) if driver_name == "host" else SimDriver(capacity=capacity)
    alloc = Allocator(driver, gmlake.policies.get("gmlake", **knobs), limit=limit)
    alloc.debug_checks = True
    return alloc


def two_free_pages(alloc: Allocator) -> list[int]:
    """Four 20 MiB blocks in four 20 MiB pages; the first and third freed: two free whole pages with a live one
    between, so no run of 40 MiB is free anywhere. Returns the live blocks, filled with 1 and 2 where the driver
    has bytes."""
    blocks = [alloc.malloc(20 * MiB) for _ in range(4)]
    alloc.free(blocks[0])
    alloc.free(blocks[2])
    live = [blocks[1], blocks[3]]
    if isinstance(alloc.driver, HostDriver):
        for i, p in enumerate(live):
            ctypes.memset(p, i + 1, 20 * MiB)
    assert alloc.stats()["reserved_bytes"] == 80 * MiB
    return live


def page_sizes(alloc: Allocator) -> list[int]:
    return sorted(s["chunk_size"] for s in alloc.segments_info() if s["pool"] == "large")


def test_the_default_stitches_at_the_edge_and_maps_the_shortfall_in_2mib_pages():
    """A cap of 90 MiB leaves 10 MiB: growing a 50 MiB request needs three new pages, stitching the two free pages
    needs 10 MiB more, which one 20 MiB page would pass the cap with and five 2 MiB pages do not. The default saves
    three pages before it stitches (min_saved_chunks) and this stitch saves one, so only the edge's rule serves it."""
    alloc = make(limit=90 * MiB)
    two_free_pages(alloc)
    p = alloc.malloc(50 * MiB)
    s = alloc.stats()
    assert p and s["stitches"] == 1 and s["reserved_bytes"] == 90 * MiB
    assert page_sizes(alloc) == [2 * MiB, 20 * MiB]      # the shortfall's range of 2 MiB pages
    assert s["ooms"] == 0


def test_without_edge_page_the_same_request_runs_out_of_memory():
    """The rule is what serves it: the edge stitching by the same rules as elsewhere, relief releases the two free
    pages, and growth then needs three new pages under a cap with room for two and a half."""
    alloc = make(limit=90 * MiB, edge_page=0)
    two_free_pages(alloc)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(50 * MiB)
    assert alloc.stats()["stitches"] == 0


def test_whole_pages_of_the_range_where_they_fit():
    """With room for a whole 20 MiB page under the cap, the shortfall maps one, as a stitch off the edge does: 2 MiB
    pages only where the limit has no room for the range's own."""
    alloc = make(limit=100 * MiB)
    two_free_pages(alloc)
    # two free pages and one new one, where growing maps three new pages, past the cap
    assert alloc.malloc(50 * MiB)
    assert alloc.stats()["stitches"] == 1 and page_sizes(alloc) == [20 * MiB]


def test_the_device_as_the_limit():
    """Without a cap the room is the device's free memory less the device reserve: the same request on a device of
    98 MiB (8 MiB reserve, 10 MiB of room) stitches with 2 MiB pages too."""
    alloc = make(capacity=98 * MiB)
    two_free_pages(alloc)
    assert alloc.malloc(50 * MiB)
    assert alloc.stats()["stitches"] == 1 and page_sizes(alloc) == [2 * MiB, 20 * MiB]


def test_off_the_edge_nothing_changes():
    """Where the limit does not bind, the request grows as it always did (a stitch saving one page is not made), with
    or without edge_page, under a cap or none: the same calls and bytes."""
    runs = []
    for knobs in ({}, {"edge_page": 0}):
        for limit in (None, 400 * MiB):
            alloc = make(limit=limit, **knobs)
            two_free_pages(alloc)
            assert alloc.malloc(50 * MiB)
            s = alloc.stats()
            assert s["stitches"] == 0 and page_sizes(alloc) == [20 * MiB]
            runs.append((s["calls"], s["reserved_bytes"], s["peak_reserved_bytes"]))
    assert all(r == runs[0] for r in runs)


def test_the_edge_ends_with_the_request():
    """The edge is the request's that relief retries, not the allocator's from then on: a later request that growth
    can serve grows, as min_saved_chunks asks, though a stitch would map fewer new bytes."""
    alloc = make(limit=200 * MiB)
    blocks = [alloc.malloc(20 * MiB) for _ in range(9)]        # 180 MiB of 200
    alloc.free(blocks[0])
    alloc.free(blocks[2])
    assert alloc.malloc(30 * MiB)          # 40 MiB free in two pages, growth needs 40 MiB new: stitched at the edge
    assert alloc.stats()["stitches"] == 1
    for i in (4, 6, 8):
        alloc.free(blocks[i])
    # two free pages apart (a stitch mapping nothing new), or the last free page and one new page: growth
    assert alloc.malloc(30 * MiB)
    s = alloc.stats()
    assert s["stitches"] == 1 and s["reserved_bytes"] == 200 * MiB


def test_the_live_bytes_stay_where_they_are():
    """On real bytes: the stitch maps the free pages' handles at a new address; the live blocks keep their addresses
    and bytes, and the stitched block holds what is written to it."""
    alloc = make("host", limit=90 * MiB)
    live = two_free_pages(alloc)
    p = alloc.malloc(50 * MiB)
    assert alloc.stats()["stitches"] == 1
    ctypes.memset(p, 7, 50 * MiB)
    for i, q in enumerate(live):
        assert ctypes.string_at(q, 20 * MiB) == bytes([i + 1]) * (20 * MiB)
    assert ctypes.string_at(p, 50 * MiB) == bytes([7]) * (50 * MiB)
    alloc.check()


def test_edge_page_is_a_granular_size_of_the_expandable_growth():
    with pytest.raises(ValueError, match="edge_page"):
        gmlake.policies.get("gmlake", edge_page=3 * MiB + 1).validate(2 * MiB)
    with pytest.raises(ValueError, match="edge_page"):
        gmlake.policies.get("gmlake-paper", edge_page=2 * MiB).check_knobs()
