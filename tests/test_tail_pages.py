"""Fine pages at a block's tail (Note [Fine pages at a block's tail], gmlake/core/_growth_expandable.pxi): with
`tail_page`, growth maps the bulk of a large block in whole pages and only the page its tail partly covers in
slots, as many as it needs; a stitch maps such slots one handle each; a page whose slots all went back is a whole
page again. On real bytes (host driver) and in the model (sim)."""
from __future__ import annotations

import ctypes

import pytest

import gmlake
from gmlake import Allocator, HostDriver, SimDriver

MiB = 1 << 20


def make(driver_name: str, **knobs) -> Allocator:
    driver = HostDriver() if driver_name == "host" else SimDriver()
    alloc = Allocator(driver, gmlake.policies.get("gmlake", **knobs))
    alloc.debug_checks = True
    return alloc


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_a_block_maps_whole_pages_and_only_the_slots_its_tail_needs(driver_name):
    alloc = make(driver_name, tail_page=2 * MiB)
    a = alloc.malloc(21 * MiB)
    assert alloc.stats()["reserved_bytes"] == 22 * MiB and alloc.driver.live_chunks == 2    # a page and a slot
    # the next block starts where the first ends and maps the tail page's next slots, one by one
    b = alloc.malloc(10 * MiB)
    assert b == a + 21 * MiB
    assert alloc.stats()["reserved_bytes"] == 32 * MiB and alloc.driver.live_chunks == 7
    whole = make(driver_name)
    whole.malloc(21 * MiB)
    assert whole.stats()["reserved_bytes"] == 40 * MiB      # without it: two whole pages
    for x in (alloc, whole):
        x.empty_cache()


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_a_page_whose_slots_all_went_back_maps_whole_again(driver_name):
    alloc = make(driver_name, tail_page=2 * MiB)
    blocks = [alloc.malloc(6 * MiB), alloc.malloc(6 * MiB)]
    assert alloc.driver.live_chunks == 6
    for p in blocks:
        alloc.free(p)
    alloc.empty_cache()
    assert alloc.stats()["reserved_bytes"] == 0 and alloc.driver.live_chunks == 0
    p = alloc.malloc(20 * MiB)              # the range's first page again: one handle, not ten slots
    assert alloc.driver.live_chunks == 1 and alloc.stats()["reserved_bytes"] == 20 * MiB
    alloc.free(p)
    alloc.close()


def test_a_stitch_maps_free_slots_and_writes_land_in_them():
    """Two free 6 MiB runs in a page mapped in slots, a live block between and after: a 12 MiB request stitches
    the two runs' slots (six handles), and bytes written through it land in the freed runs, nowhere else."""
    alloc = make("host", tail_page=2 * MiB, min_saved_chunks=0)
    a, k1, b, k2 = (alloc.malloc(n * MiB) for n in (6, 4, 6, 4))
    rest = alloc.malloc(20 * MiB)
    for i, (p, n) in enumerate([(k1, 4), (k2, 4), (rest, 20)]):
        ctypes.memset(p, i + 1, n * MiB)
    alloc.free(a)
    alloc.free(b)
    reserved = alloc.stats()["reserved_bytes"]
    p = alloc.malloc(12 * MiB)
    s = alloc.stats()
    assert s["stitches"] == 1 and s["stitched_handles"] == 6 and s["reserved_bytes"] == reserved
    ctypes.memset(p, 0xAB, 12 * MiB)
    assert ctypes.string_at(a, 6 * MiB) == b"\xab" * (6 * MiB)
    assert ctypes.string_at(b, 6 * MiB) == b"\xab" * (6 * MiB)
    for i, (q, n) in enumerate([(k1, 4), (k2, 4), (rest, 20)]):
        assert ctypes.string_at(q, n * MiB) == bytes([i + 1]) * (n * MiB), "a live block's bytes changed"
    for q in (p, k1, k2, rest):
        alloc.free(q)
    alloc.close()
    assert alloc.driver.live_chunks == 0


def test_tail_page_must_divide_the_pages_and_agree_with_reback_slot():
    """The messages write sizes as the knobs are written (6MiB), not as byte counts."""
    with pytest.raises(ValueError, match=r"tail_page 6MiB must divide .*expandable_page_large 20MiB\)"):
        gmlake.policies.get("gmlake", tail_page=6 * MiB).validate(2 * MiB)
    with pytest.raises(ValueError, match="reback_slot 4MiB and tail_page 2MiB .* must be equal"):
        gmlake.policies.get("gmlake", tail_page=2 * MiB, reback_slot=4 * MiB).validate(2 * MiB)


def test_growth_in_runs_of_two_unit_sizes_is_not_read_as_the_libraries_taking_memory():
    """A block of a page and a slot maps two runs, and growth asks the device before each: the first run's bytes
    count as reserved by then, so the libraries' measure (Note [Leaving the libraries room]) sees no rise."""
    alloc = Allocator(SimDriver(capacity=1000 * MiB), gmlake.policies.get("gmlake", tail_page=2 * MiB))
    for _ in range(5):
        alloc.malloc(21 * MiB)
    s = alloc.stats()
    assert s["device_asks"] >= 5 and s["libraries_rises"] == 0, s
    assert s["libraries_reserve_bytes"] == 8 * MiB


def test_reuse_cuts_the_free_page_a_block_would_end_in_and_keeps_the_run_whole():
    """Note [Fine pages at reuse]: a 25 MiB block taken from a free run of two whole pages would end inside the
    second; with cut_at_reuse that page, free as a whole, is mapped again in slots (after a synchronize), all of
    them, so the rest of the run stays one free run; a live block's bytes never change."""
    alloc = make("host", tail_page=2 * MiB, cut_at_reuse=100)
    a = alloc.malloc(40 * MiB)
    keep = alloc.malloc(20 * MiB)
    ctypes.memset(keep, 7, 20 * MiB)
    alloc.free(a)
    b = alloc.malloc(25 * MiB)
    s = alloc.stats()
    assert b == a and s["tails_cut_at_reuse"] == 1 and s["calls"]["synchronize"] == 1
    assert s["reserved_bytes"] == 60 * MiB and alloc.driver.live_chunks == 1 + 10 + 1    # page, slots, keep's page
    ctypes.memset(b, 0xAB, 25 * MiB)
    c = alloc.malloc(15 * MiB)                       # the rest of the cut page's run, with no growth
    assert c == b + 25 * MiB and alloc.stats()["reserved_bytes"] == 60 * MiB
    ctypes.memset(c, 0xCD, 15 * MiB)
    assert ctypes.string_at(keep, 20 * MiB) == b"\x07" * (20 * MiB), "a live block's bytes changed"
    assert ctypes.string_at(b, 25 * MiB) == b"\xab" * (25 * MiB)
    for p in (b, c, keep):
        alloc.free(p)
    alloc.close()
    assert alloc.driver.live_chunks == 0


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_reuse_cuts_nothing_once_memory_stopped_growing(driver_name):
    """The same reuse after many requests served from memory already reserved: the run no longer lays out its
    memory (cut_at_reuse percent of the requests before reserved last grew), so no cut and no synchronize."""
    alloc = make(driver_name, tail_page=2 * MiB, cut_at_reuse=25)
    a = alloc.malloc(40 * MiB)
    keep = alloc.malloc(20 * MiB)
    alloc.free(a)
    for _ in range(8):
        alloc.free(alloc.malloc(40 * MiB))
    b = alloc.malloc(25 * MiB)
    s = alloc.stats()
    assert b == a and s["tails_cut_at_reuse"] == 0 and s["calls"]["synchronize"] == 0
    assert alloc.driver.live_chunks == 3
    for p in (b, keep):
        alloc.free(p)
    alloc.close()


def test_cut_at_reuse_needs_tail_page():
    with pytest.raises(ValueError, match="cut_at_reuse cuts pages into tail_page slots"):
        gmlake.policies.get("gmlake", cut_at_reuse=25).validate(2 * MiB)
