"""Tests written for classes of bugs in the allocator's code at the edge of memory, on real bytes (host driver), in
the model (sim) and with the invariant checks on: re-backing pages whose live slots form several runs of any length,
pressure relief's order when a policy asks for re-backing first, the libraries' rise against the measured reserve.
Tail pages whose growth is refused and later grown into, and cuts at reuse (back at an earlier high, under a policy
that places blocks itself) are in tests/test_edge_classes_tails.py.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import gmlake
from gmlake import Allocator, HostDriver, OutOfMemoryError, SimDriver

MiB = 1 << 20
SLOT = 2 * MiB
PAGE = 20 * MiB
SLOTS = PAGE // SLOT


def make(driver_name: str, limit: int | None = None, policy: str | gmlake.policies.Policy = "gmlake", capacity: int = 0,
         **knobs) -> Allocator:
    driver = HostDriver(capacity=capacity) if driver_name == "host" else SimDriver(capacity=capacity)
    chosen = gmlake.policies.get(policy, **knobs) if isinstance(policy, str) else policy
    alloc = Allocator(driver, chosen, limit=limit)
    alloc.debug_checks = True
    return alloc


def _runs(pattern: list[bool]) -> list[tuple[bool, int]]:
    out: list[tuple[bool, int]] = []
    for live in pattern:
        if out and out[-1][0] == live:
            out[-1] = (live, out[-1][1] + 1)
        else:
            out.append((live, 1))
    return out


def _fill(p: int, page: int, slot: int, n: int) -> None:
    for j in range(n):
        ctypes.memset(p + j * SLOT, (page * SLOTS + slot + j) % 250 + 1, SLOT)


def _check(p: int, page: int, slot: int, n: int) -> None:
    for j in range(n):
        want = (page * SLOTS + slot + j) % 250 + 1
        got = ctypes.string_at(p + j * SLOT, SLOT)
        assert got == bytes([want]) * SLOT, f"page {page} slot {slot + j}: bytes moved or lost"


# ------------------------------------------------------------------ re-backing: several runs of live slots

patterns = st.lists(st.lists(st.booleans(), min_size=SLOTS, max_size=SLOTS), min_size=1, max_size=3)


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@given(pages=patterns)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_rebacking_keeps_every_live_slot_at_its_offset_whatever_the_runs(driver_name, pages):
    """Pages whose live slots form any runs (several, the first longer than a slot, ending at the page's end):
    re-backed under a cap, each live slot's bytes are where they were, one copy out and one in per run of live
    slots, and the free slots go back."""
    live_pages = [p for p in pages if any(p) and not all(p)]
    assume(live_pages)
    free_slots = sum(SLOTS - sum(p) for p in live_pages)
    longest_free = max(n for live, n in _runs([s for p in live_pages for s in p]) if not live)   # pages adjoin
    assume(free_slots > longest_free)               # a request no free run fits, but the freed slots do
    alloc = make(driver_name, reback_slot=SLOT, stitch=False)     # no stitch serves the request instead
    _reback_runs(alloc, driver_name, live_pages, longest_free)
    alloc.close()               # left open where the test failed: its error, not close's, is the one shown


def _reback_runs(alloc: Allocator, driver_name: str, live_pages: list[list[bool]], longest_free: int) -> None:
    blocks, gaps = [], []
    for i, pattern in enumerate(live_pages):
        slot = 0
        for live, n in _runs(pattern):
            p = alloc.malloc(n * SLOT)
            (blocks if live else gaps).append((p, i, slot, n))
            slot += n
    # laid out in order: each page's runs back to back
    firsts = sorted(blocks + gaps)
    assert all(a[0] + a[3] * SLOT == b[0] for a, b in pairwise(firsts) if a[1] == b[1])
    if driver_name == "host":
        for p, i, slot, n in blocks:
            _fill(p, i, slot, n)
    for p, *_ in gaps:
        alloc.free(p)
    assert alloc.stats()["reserved_bytes"] == len(live_pages) * PAGE
    alloc.set_limit(len(live_pages) * PAGE)         # at the edge: nothing more to grow
    request = (longest_free + 1) * SLOT
    try:            # whether the freed slots then hold it depends on where the holes are; re-backing ran either way
        big = alloc.malloc(request)
    except OutOfMemoryError:
        big = None
    s = alloc.stats()
    live_runs = sum(1 for p in live_pages for live, _ in _runs(p) if live)
    assert s["rebacked_chunks"] == len(live_pages)
    assert s["calls"]["copy_out"] == s["calls"]["copy_in"] == live_runs
    assert s["copied_bytes"] == sum(sum(p) for p in live_pages) * SLOT
    if driver_name == "host":
        for p, i, slot, n in blocks:
            _check(p, i, slot, n)
        if big is not None:
            ctypes.memset(big, 0xEE, request)
            for p, i, slot, n in blocks:
                _check(p, i, slot, n)
    if big is not None:
        alloc.free(big)
    for p, *_ in blocks:
        alloc.free(p)
    alloc.empty_cache()
    assert alloc.stats()["reserved_bytes"] == 0


# ------------------------------------------------------------------ pressure relief: re-backing asked for first


@dataclass(frozen=True)
class RebackFirst(gmlake.policies.gmlake.GMLakePolicy):
    """Asks for the re-backing stage at the first attempt (the built-in asks for it last)."""

    name = "reback-first"

    def relieve_pressure(self, size, stream, pool, attempt, default, state):
        return "reback" if attempt == 0 else default


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@pytest.mark.parametrize("small_pages", [1, 3])
@pytest.mark.parametrize("policy_kind", ["reback-first", "built-in order"])
@pytest.mark.parametrize("large_pages, live_mib", [(1, 6), (2, 6), (3, 2)])
def test_relief_returns_the_small_pools_free_pages_before_it_rebacks(driver_name, small_pages, policy_kind,
                                                                     large_pages, live_mib):
    """At the edge with the small pool holding wholly free pages and large pages partly used: whichever attempt
    asks for re-backing, the small pool's free pages go back to the driver first, then the large pages' free slots
    (the history's segment_unmap records say in what order), and no live byte moves."""
    knobs = {"reback_slot": SLOT, "stitch": False}
    policy = RebackFirst(**knobs) if policy_kind == "reback-first" else gmlake.policies.get("gmlake", **knobs)
    alloc = make(driver_name, policy=policy)
    alloc.record_history(True)
    small = [alloc.malloc(MiB // 2) for _ in range(4 * small_pages)]      # 2 MiB small pages, four blocks each
    live, gaps = [], []
    for i in range(large_pages):
        live.append(alloc.malloc(live_mib * MiB))
        gaps.append(alloc.malloc(PAGE - live_mib * MiB))
        if driver_name == "host":
            _fill(live[-1], i, 0, live_mib * MiB // SLOT)
    for p in gaps + small:
        alloc.free(p)
    segments = alloc.segments_info()
    small_ranges = [(s["va"], s["va"] + s["size"]) for s in segments if s["pool"] == "small"]
    assert small_ranges and alloc.stats()["reserved_bytes"] == large_pages * PAGE + small_pages * SLOT
    alloc.set_limit(alloc.stats()["reserved_bytes"])
    before = len(alloc.history())
    try:
        big = alloc.malloc(PAGE - live_mib * MiB + SLOT)      # no gap holds it; new memory needs what relief frees
    except OutOfMemoryError:
        big = None
    unmaps = [e for e in alloc.history()[before:] if e["action"] == "segment_unmap"]
    in_small = [any(lo <= e["addr"] < hi for lo, hi in small_ranges) for e in unmaps]
    assert sum(e["size"] for e, s in zip(unmaps, in_small) if s) == small_pages * SLOT, unmaps
    assert in_small == sorted(in_small, reverse=True), "a large page was re-backed before the small pool's free " \
                                                      f"pages went back: {unmaps}"
    s = alloc.stats()
    assert s["rebacked_chunks"] == large_pages
    if driver_name == "host":
        for i, p in enumerate(live):
            _check(p, i, 0, live_mib * MiB // SLOT)
    for p in live + ([big] if big else []):
        alloc.free(p)
    alloc.close()


# ------------------------------------------------------------------ the libraries' rise against the measured reserve


def _reserve_model(rises: list[int], half_life: int, floor: int) -> list[int]:
    """The rule of Note [Leaving the libraries room], written out: after each ask of the device, the reserve."""
    measured = quiet = 0
    out = []
    for rise in rises:
        quiet += 1
        if rise and rise >= measured:
            measured, quiet = rise, 0
        if quiet >= half_life:
            measured, quiet = measured // 2, 0
        out.append(max(measured, floor))
    return out


@pytest.mark.parametrize("half_life", [2, 3, 5])
@pytest.mark.parametrize("offset_mib", [0, -1, 1])        # the second rise: equal to the measured reserve, or not
@pytest.mark.parametrize("after_halving", [False, True])
def test_a_rise_equal_to_the_measured_reserve_sets_it_again(half_life, offset_mib, after_halving):
    """A rise exactly as large as the reserve measured so far counts as a new measure: the half-life starts over
    (one MiB less does not restart it). Checked ask by ask against the rule written out."""
    rises = [64 * MiB] + [0] * (half_life if after_halving else half_life - 1)
    measured = _reserve_model(rises, half_life, 0)[-1]
    rises += [measured + offset_mib * MiB] + [0] * (2 * half_life)
    model = _reserve_model(rises, half_life, 8 * MiB)
    alloc = make("sim", capacity=8 << 30, device_reserve=8 * MiB, libraries_half_life=half_life)

    def ask(outside: int) -> None:              # each large request a new page: growth asks the device once
        alloc.driver.set_outside_bytes(outside)
        n = alloc.stats()["device_asks"]
        while alloc.stats()["device_asks"] < n + 1:
            alloc.malloc(21 * MiB)

    ask(0)
    seen, total = [], 0
    for rise in rises:
        total += rise
        ask(total)
        seen.append(alloc.stats()["libraries_reserve_bytes"])
    assert seen == model, ([s // MiB for s in seen], [m // MiB for m in model])
