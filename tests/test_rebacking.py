"""Re-backing at the edge (Note [Taking slots back at the edge], gmlake/core/_rebacking.pxi): partly used pages re-backed
in 2 MiB slots when nothing else is left to give back, on real bytes (host driver) and in the model (sim)."""
from __future__ import annotations

import ctypes

import pytest
from conftest import one_line_exit_2

import gmlake
from gmlake import Allocator, DriverError, HostDriver, OutOfMemoryError, SimDriver

MiB = 1 << 20


def gapped_pages(alloc: Allocator, pages: int = 10, live_mib: int = 6) -> list[int]:
    """`pages` 20 MiB pages, each holding a live block of `live_mib` MiB (filled with its index + 1 where the
    driver has bytes) beside a freed gap. Returns the live blocks."""
    live, gaps = [], []
    for i in range(pages):
        live.append(alloc.malloc(live_mib * MiB))
        gaps.append(alloc.malloc((20 - live_mib) * MiB))
        if isinstance(alloc.driver, HostDriver):
            ctypes.memset(live[-1], i + 1, live_mib * MiB)
    for g in gaps:
        alloc.free(g)
    assert alloc.stats()["reserved_bytes"] == pages * 20 * MiB
    return live


def check_bytes(live: list[int], live_mib: int = 6) -> None:
    for i, p in enumerate(live):
        assert ctypes.string_at(p, live_mib * MiB) == bytes([i + 1]) * (live_mib * MiB), f"block {i} lost its bytes"


def make(driver_name: str, capacity: int = 0, limit: int | None = None, **knobs) -> Allocator:
    """The default policy with re-backing turned on (reback_slot=2MiB; it is off by default) unless `knobs` say."""
    knobs.setdefault("reback_slot", 2 * MiB)
    driver = HostDriver(capacity=capacity) if driver_name == "host" else SimDriver(capacity=capacity)
    alloc = Allocator(driver, gmlake.policies.get("gmlake", **knobs), limit=limit)
    alloc.debug_checks = True
    return alloc


@pytest.mark.parametrize("driver_name", ["sim", "host"])
@pytest.mark.parametrize("where", ["cap", "device"])
def test_the_gaps_go_back_and_the_live_bytes_stay(driver_name, where):
    """Under a cap the new slots are made before the page goes (room under the cap); on a full device after (the
    driver has no room for both). Either way the request fits, the live bytes are where they were, reserved drops
    by the gaps, and one copy out and one in per page."""
    alloc = make(driver_name, capacity=200 * MiB if where == "device" else 0, limit=200 * MiB if where == "cap" else None)
    live = gapped_pages(alloc)
    big = alloc.malloc(100 * MiB)
    s = alloc.stats()
    assert s["rebacked_chunks"] == 10 and s["copied_bytes"] == 60 * MiB
    assert s["calls"]["copy_out"] == s["calls"]["copy_in"] == 10
    # the live slots, and the request's 100 MiB: from the last page's gap on (7 slots, then 5 pages) under a cap; in
    # a second range on the device, where the first reserved only 9/8 of its 200 MiB
    assert s["reserved_bytes"] == 60 * MiB + 100 * MiB + (14 * MiB if where == "cap" else 0)
    assert alloc.driver.live_chunks == 30 + (7 if where == "cap" else 0) + 5
    if driver_name == "host":
        check_bytes(live)
    alloc.free(big)
    for p in live:
        alloc.free(p)
    alloc.close()
    assert alloc.driver.live_chunks == 0


def test_the_holes_are_mapped_again_slot_by_slot():
    """A re-backed page stays in slots: growth maps its holes 2 MiB at a time, not 20 MiB pages."""
    alloc = make("host", limit=200 * MiB)
    live = gapped_pages(alloc)
    big = alloc.malloc(100 * MiB)
    small = [alloc.malloc(2 * MiB) for _ in range(7)]       # the 14 MiB free after the request
    reserved = alloc.stats()["reserved_bytes"]
    for n in range(1, 8):                                   # then the first page's gap, slot by slot
        small.append(alloc.malloc(2 * MiB))
        assert alloc.stats()["reserved_bytes"] == reserved + n * 2 * MiB
    assert small[7] == live[0] + 6 * MiB
    for p in small:
        ctypes.memset(p, 0xAB, 2 * MiB)
    check_bytes(live)
    for p in small + [big] + live:
        alloc.free(p)
    alloc.empty_cache()
    assert alloc.stats()["reserved_bytes"] == 0 and alloc.driver.live_chunks == 0


def test_no_reback_slot_no_rebacking():
    """reback_slot=0 (and every other built-in policy): the same request runs out of memory, nothing copied."""
    alloc = make("sim", limit=200 * MiB, reback_slot=0)
    gapped_pages(alloc)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(100 * MiB)
    s = alloc.stats()
    assert s["rebacked_chunks"] == 0 and s["calls"]["copy_out"] == 0
    assert gmlake.policies.get("gmlake").reback_slot == 0
    assert gmlake.policies.get("gmlake-paper").reback_slot == 0
    assert gmlake.policies.get("expandable").reback_slot == 0


def test_a_run_that_never_reaches_its_limit_copies_nothing():
    alloc = make("sim", limit=400 * MiB)
    gapped_pages(alloc)
    alloc.malloc(100 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 0 and alloc.stats()["calls"]["copy_out"] == 0


def test_pages_with_no_whole_free_slot_are_left_alone():
    """A page whose gap is smaller than a slot gives nothing back; the request fails cleanly, nothing is copied."""
    alloc = make("sim", limit=200 * MiB)
    gaps = []
    for _ in range(10):
        alloc.malloc(18 * MiB + MiB // 2)
        gaps.append(alloc.malloc(MiB + MiB // 2))           # 1.5 MiB gaps: no whole 2 MiB slot free
    for g in gaps:
        alloc.free(g)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(20 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 0


@pytest.mark.parametrize("call", ["copy", "create_chunk", "unmap"])
def test_a_failed_driver_call_leaves_the_page_as_it_was(call):
    """Before the page is unmapped any failure leaves it whole, its bytes in place, and the request fails with the
    driver's error (the invariants hold throughout). The cap leaves room for a page's new slots before it goes."""
    alloc = make("host", limit=210 * MiB)
    live = gapped_pages(alloc)
    alloc.driver.inject_fault(call, 1)
    with pytest.raises(DriverError):
        alloc.malloc(100 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 0 or call != "copy"
    check_bytes(live)
    alloc.check()
    for p in live:
        alloc.free(p)
    alloc.empty_cache()
    assert alloc.driver.live_chunks == 0


def test_relieve_pressure_may_ask_for_it():
    """A policy's relieve_pressure may name "reback" first; the built-in reaches it last."""
    calls = []

    class RebackFirst(gmlake.policies.GMLakePolicy):
        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            calls.append(default)
            return "reback" if attempt == 0 else None

    alloc = Allocator(SimDriver(), RebackFirst(reback_slot=2 * MiB), limit=200 * MiB)
    gapped_pages(alloc)
    alloc.malloc(100 * MiB)
    assert calls == ["release_other_pool"] and alloc.stats()["rebacked_chunks"] == 10


def test_the_replay_prices_the_copies():
    """replay's driver time counts the copied bytes at the table's price per MiB."""
    from gmlake.sim.replay import driver_costs, driver_seconds
    costs = driver_costs()
    stats = {"calls": {}, "handles": {}, "copied_bytes": 3 * MiB}
    assert driver_seconds(stats, costs) == pytest.approx(3 * costs["per_mib"]["copied_bytes"] * 1e-6)


@pytest.mark.parametrize("call, nth", [("create_chunk", 1), ("map", 1), ("copy", 2)])
def test_a_failure_after_the_page_went_restores_it(call, nth):
    """With no room for the new slots first (the cap is full), the page is released before they are made; a
    driver failure after that (making, mapping or filling the slots) maps one new whole page and copies the live
    bytes back, so the page is as it was, and the request fails with the driver's error naming the call."""
    alloc = make("host", limit=200 * MiB)
    live = gapped_pages(alloc)
    alloc.driver.inject_fault(call, nth)
    with pytest.raises(DriverError, match=call):
        alloc.malloc(100 * MiB)
    check_bytes(live)
    alloc.check()
    assert alloc.stats()["reserved_bytes"] == alloc.driver.live_chunk_bytes == 200 * MiB
    for p in live:
        alloc.free(p)
    alloc.empty_cache()
    assert alloc.driver.live_chunks == 0


@pytest.mark.parametrize("knobs", ["reback_slot=6MiB", "reback_slot=40MiB", "capped_page_large=6MiB,reback_slot=4MiB"])
def test_a_slot_that_does_not_divide_the_pages_is_refused(knobs):
    """A slot that does not tile the pages it would re-back would make the knob do nothing: one line, exit 2. (A
    slot as large as the page is allowed: its pages are then never re-backed, as 2 MiB pages need none.)"""
    line = one_line_exit_2(["-m", "gmlake", "replay", "tests/data/tiny-gpt2-native.pickle.gz", "--policy",
                            f"gmlake[{knobs}]"])
    assert "reback_slot" in line and "must divide" in line


def test_never_during_a_graph_capture():
    """A capture forbids the synchronize re-backing needs: a request under capture that finds no memory fails as a
    capture's out-of-memory, nothing re-backed; once the capture ends the same request re-backs and fits."""
    from gmlake.core.errors import CaptureOutOfMemoryError
    alloc = make("host", limit=200 * MiB)
    live = gapped_pages(alloc)
    alloc.begin_allocate_to_pool(1, [0], capturing=True)
    with pytest.raises(CaptureOutOfMemoryError):
        alloc.malloc(100 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 0
    alloc.end_allocate_to_pool(1)
    alloc.release_pool(1)
    big = alloc.malloc(100 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 10
    check_bytes(live)
    alloc.free(big)
