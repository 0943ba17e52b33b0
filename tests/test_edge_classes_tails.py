"""Tests written for classes of bugs in the code of fine pages (Note [Fine pages at a block's tail], Note [Fine pages
at reuse]), on real bytes (host driver), in the model (sim) and with the invariant checks on: a tail page whose
growth is refused (under a cap, under an unannounced capture, or by a failing driver call) and later grown into; cuts
at reuse once reserved memory comes back to an earlier high, but not above it; cuts at reuse under a policy that
places blocks itself (choose_block)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gmlake
from gmlake import Allocator, DriverError, GraphCaptureError, HostDriver, OutOfMemoryError, SimDriver

MiB = 1 << 20
SLOT = 2 * MiB
PAGE = 20 * MiB
STREAM = 0


def make(driver_name: str, policy: gmlake.policies.Policy | None = None, **knobs) -> Allocator:
    driver = HostDriver() if driver_name == "host" else SimDriver()
    alloc = Allocator(driver, policy if policy is not None else gmlake.policies.get("gmlake", **knobs))
    alloc.debug_checks = True
    return alloc


def _fill(alloc: Allocator, p: int, n: int, value: int) -> None:
    if isinstance(alloc.driver, HostDriver):
        ctypes.memset(p, value, n)


def _intact(alloc: Allocator, p: int, n: int, value: int) -> bool:
    """Whether the block's bytes are still `value`: 4 KiB at each end of every slot it spans, where a page
    remapped, cut or rolled back would show (a whole check of each block at every step would be slow)."""
    if not isinstance(alloc.driver, HostDriver):
        return True
    probe = 4096
    for at in sorted({*range(0, n, SLOT), *range(SLOT - probe, n, SLOT), max(n - probe, 0)}):
        k = min(probe, n - at)
        if ctypes.string_at(p + at, k) != bytes([value]) * k:
            return False
    return True


# ------------------------------------------------------------------ tail pages: growth refused, then grown into

REFUSALS = ("cap", "capture", "create_chunk", "map", "set_access")


def _layout(alloc: Allocator, base: int, blocks: list[int]) -> dict:
    """What a refused growth must leave as it was: the memory mapped, its handles, where blocks land."""
    s = alloc.stats()
    return {"reserved": s["reserved_bytes"], "handles": alloc.driver.live_chunks,
            "offsets": [p - base for p in blocks], "segments": [(x["size"], x["pool"]) for x in alloc.segments_info()]}


def _refuse(alloc: Allocator, refusal: str, size: int, nth: int) -> None:
    """Ask for `size` bytes where growth is refused by `refusal`; the request fails, and the refusal is lifted."""
    driver = alloc.driver
    if refusal == "cap":
        alloc.set_limit(alloc.stats()["reserved_bytes"] + size - SLOT)     # one slot short of what it needs
        with pytest.raises(OutOfMemoryError):
            alloc.malloc(size, STREAM)
        alloc.set_limit(None)
    elif refusal == "capture":
        driver.begin_raw_capture(STREAM)
        with pytest.raises(GraphCaptureError):
            alloc.malloc(size, STREAM)
        driver.end_raw_capture(STREAM)
    else:                                   # the nth call of that kind fails: a run mapped before it is rolled back
        driver.inject_fault(refusal, 1 if refusal == "set_access" else nth)     # a request may map one run only
        with pytest.raises(DriverError):
            alloc.malloc(size, STREAM)
        driver.clear_faults()


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@given(first=st.integers(1, 30), refused=st.integers(2, 70), later=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       refusal=st.sampled_from(REFUSALS), nth=st.integers(1, 2))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_refused_growth_leaves_no_trace_on_the_pages_grown_into_later(driver_name, first, refused, later, refusal,
                                                                        nth):
    """A live block ends anywhere in a page; a request whose growth would cut the tail page it ends in is refused (a
    cap one slot short, an unannounced capture of its stream, a driver call failing in any run of units); later
    requests grow over the same pages. The memory mapped, its handles and where each block lands are those of a
    twin that was never refused, and no live byte changes."""
    sizes = [first * SLOT, *(n * MiB + MiB // 2 for n in later)]     # later sizes round up to whole MiB and more
    refused_alloc, twin = make(driver_name, tail_page=SLOT), make(driver_name, tail_page=SLOT)
    layouts = []
    for alloc in (refused_alloc, twin):
        base = alloc.malloc(sizes[0], STREAM)
        _fill(alloc, base, sizes[0], 0x5A)
        if alloc is refused_alloc:
            _refuse(alloc, refusal, refused * MiB + MiB // 2, nth)
            alloc.check()
        blocks = [alloc.malloc(n, STREAM) for n in sizes[1:]]
        for i, (p, n) in enumerate(zip(blocks, sizes[1:])):
            _fill(alloc, p, n, i + 1)
        assert _intact(alloc, base, sizes[0], 0x5A), "a live block's bytes changed"
        assert all(_intact(alloc, p, n, i + 1) for i, (p, n) in enumerate(zip(blocks, sizes[1:])))
        layouts.append(_layout(alloc, base, blocks))
        alloc.check()
        for p in (base, *blocks):
            alloc.free(p)
        alloc.empty_cache()
        assert alloc.driver.live_chunks == 0 and alloc.stats()["reserved_bytes"] == 0
        alloc.close()
    assert layouts[0] == layouts[1], f"after a refused growth ({refusal}): {layouts[0]} != never refused {layouts[1]}"


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@pytest.mark.parametrize("refusal", REFUSALS)
@pytest.mark.parametrize("tail_slots", [1, 4, 9])
def test_the_tail_page_a_refused_request_would_cut_maps_whole_for_a_block_that_fills_it(driver_name, refusal,
                                                                                         tail_slots):
    """The request would map a whole page and `tail_slots` slots of the next; refused, then a block that fills both
    pages maps two whole pages: two handles, not one and ten slots."""
    alloc = make(driver_name, tail_page=SLOT)
    base = alloc.malloc(PAGE, STREAM)
    _refuse(alloc, refusal, PAGE + tail_slots * SLOT, 2)
    p = alloc.malloc(2 * PAGE, STREAM)
    assert alloc.driver.live_chunks == 3 and alloc.stats()["reserved_bytes"] == 3 * PAGE
    q = alloc.malloc(PAGE + tail_slots * SLOT, STREAM)        # the same request now grows, cutting its tail page
    assert alloc.driver.live_chunks == 3 + 1 + tail_slots
    for x in (base, p, q):
        alloc.free(x)
    alloc.close()


# ------------------------------------------------------------------ cuts at reuse: reserved memory back at an earlier high


def _laying_out(allocs: int, high_at: int, percent: int) -> bool:
    """The rule of Note [Fine pages at reuse], written out."""
    return allocs - high_at <= high_at * percent // 100


@dataclass
class HighModel:
    """Reserved memory's highs, counted as the Note counts them: a new high is one above every earlier one."""

    percent: int
    allocs: int = 0
    high: int = 0
    high_at: int = 0
    seen: list = field(default_factory=list)

    def laying_out(self) -> bool:
        """Whether the next request may cut: the requests served so far count, the one asking does not."""
        return _laying_out(self.allocs, self.high_at, self.percent)

    def malloc(self, alloc: Allocator, size: int) -> int:
        p = alloc.malloc(size, STREAM)
        if alloc.stats()["reserved_bytes"] > self.high:
            self.high, self.high_at = alloc.stats()["reserved_bytes"], self.allocs
        self.allocs += 1
        return p


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@pytest.mark.parametrize("percent", [10, 25, 100])
@pytest.mark.parametrize("back", [-2, -1, 0, 1])      # pages the regrown memory ends below the earlier high (or above)
@pytest.mark.parametrize("steady", [0, 12])
def test_reserved_memory_back_at_an_earlier_high_is_no_new_high(driver_name, percent, back, steady):
    """A run lays out its memory, settles (requests served from memory already reserved), gives its free pages back
    (empty_cache), grows again to below, exactly at, or above its earlier high, then
    reuses a free run so that a block ends inside a whole page: the page is cut exactly where the rule, counted from
    the last new high (one above every earlier one), says the run still lays out its memory."""
    alloc = make(driver_name, tail_page=SLOT, cut_at_reuse=percent)
    m = HighModel(percent)
    keep = m.malloc(alloc, PAGE)                                       # stays: the range is never given back whole
    big = m.malloc(alloc, 6 * PAGE)
    high = alloc.stats()["reserved_bytes"]
    alloc.free(big)
    for _ in range(steady + 4):                                        # served from the free run: no growth
        alloc.free(m.malloc(alloc, 6 * PAGE))
    alloc.empty_cache()
    assert alloc.stats()["reserved_bytes"] < high
    regrow = high - alloc.stats()["reserved_bytes"] - back * PAGE     # grows reserved to high - back pages
    grown = m.malloc(alloc, regrow)
    assert alloc.stats()["reserved_bytes"] == high - back * PAGE
    alloc.free(grown)
    cuts, syncs = alloc.stats()["tails_cut_at_reuse"], alloc.stats()["calls"]["synchronize"]
    expected = m.laying_out()
    b = m.malloc(alloc, PAGE + 5 * MiB)                               # ends inside the free run's second page
    _fill(alloc, b, PAGE + 5 * MiB, 0xB)
    s = alloc.stats()
    assert s["tails_cut_at_reuse"] - cuts == int(expected), (back, m)
    assert s["calls"]["synchronize"] - syncs == int(expected)
    assert _intact(alloc, b, PAGE + 5 * MiB, 0xB)
    for p in (b, keep):
        alloc.free(p)
    alloc.close()


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@given(script=st.lists(st.tuples(st.sampled_from(["malloc", "free", "empty_cache"]), st.integers(1, 60)),
                       min_size=4, max_size=40), percent=st.sampled_from([5, 25, 50, 100]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_cut_at_reuse_falls_while_the_run_lays_out_its_memory(driver_name, script, percent):
    """Any run of requests, frees and empty_cache: a request that cut a page came while the rule, counted from the
    last time reserved memory rose above every earlier high, said the run lays out its memory; no live byte moved."""
    alloc = make(driver_name, tail_page=SLOT, cut_at_reuse=percent)
    m = HighModel(percent)
    live: list[tuple[int, int, int]] = []
    for i, (op, n) in enumerate(script):
        if op == "malloc":
            cuts = alloc.stats()["tails_cut_at_reuse"]
            laying_out = m.laying_out()
            p = m.malloc(alloc, n * MiB)
            if alloc.stats()["tails_cut_at_reuse"] != cuts:
                assert laying_out, f"step {i}: a cut {m.allocs - m.high_at} requests after the last high at {m.high_at}"
            _fill(alloc, p, n * MiB, i % 250 + 1)
            live.append((p, n * MiB, i % 250 + 1))
        elif op == "free" and live:
            alloc.free(live.pop(n % len(live))[0])
        elif op == "empty_cache":
            alloc.empty_cache()
        assert all(_intact(alloc, p, size, v) for p, size, v in live), f"step {i}: a live block's bytes changed"
    for p, *_ in live:
        alloc.free(p)
    alloc.close()


# ------------------------------------------------------------------ cuts at reuse under a policy that places blocks


@dataclass(frozen=True)
class Placing(gmlake.policies.gmlake.GMLakePolicy):
    """Places each large request itself: the built-in choice, the largest candidate, the last, or new memory, in
    turn from `rule`; records each choice."""

    name = "placing"
    rule: str = "default"
    chosen: list = field(default_factory=list, compare=False, hash=False)

    def choose_block(self, size, stream, pool, candidates, default, state):
        if pool != "large":
            return default
        pick = default
        if self.rule == "largest" and candidates:
            pick = max(range(len(candidates)), key=lambda i: candidates[i].size)
        elif self.rule == "last" and candidates:
            pick = len(candidates) - 1
        elif self.rule == "none":
            pick = None
        self.chosen.append(candidates[pick].addr if pick is not None and hasattr(candidates[pick], "addr") else None)
        return pick


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@given(rule=st.sampled_from(["default", "largest", "last", "none"]),
       script=st.lists(st.tuples(st.booleans(), st.integers(1, 60)), min_size=3, max_size=30))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_policy_that_places_blocks_gets_its_choice_and_no_cut(driver_name, rule, script):
    """With cut_at_reuse (at 100 %: every reuse while laying out would cut) and a policy that places large
    requests itself: each request lands at the free block the policy chose, no page is cut and nothing
    synchronizes (Note [Fine pages at reuse]: not where the policy places), and no live byte changes."""
    policy = Placing(rule=rule, tail_page=SLOT, cut_at_reuse=100)
    alloc = make(driver_name, policy=policy)
    live: list[tuple[int, int, int]] = []
    for i, (is_malloc, n) in enumerate(script):
        if is_malloc or not live:
            asked = len(policy.chosen)
            p = alloc.malloc(n * MiB + MiB // 2, STREAM)
            if len(policy.chosen) > asked and policy.chosen[-1] is not None:
                assert p == policy.chosen[-1], f"step {i}: served at {p:#x}, the policy chose {policy.chosen[-1]:#x}"
            _fill(alloc, p, n * MiB + MiB // 2, i % 250 + 1)
            live.append((p, n * MiB + MiB // 2, i % 250 + 1))
        else:
            alloc.free(live.pop(n % len(live))[0])
        assert all(_intact(alloc, q, size, v) for q, size, v in live), f"step {i}: a live block's bytes changed"
    s = alloc.stats()
    assert s["tails_cut_at_reuse"] == 0 and s["calls"]["synchronize"] == 0, s
    for q, *_ in live:
        alloc.free(q)
    alloc.close()


@pytest.mark.parametrize("driver_name", ["host", "sim"])
@pytest.mark.parametrize("rule", ["default", "largest", "last"])
def test_the_reuse_that_cuts_under_the_built_in_placement_does_not_under_a_placing_policy(driver_name, rule):
    """The same requests that make the built-in placement cut (the test above could pass by never reaching a cut):
    under a placing policy, the block the policy chose, uncut."""
    runs = {}
    for placing in (False, True):
        policy = Placing(rule=rule, tail_page=SLOT, cut_at_reuse=100) if placing else \
            gmlake.policies.get("gmlake", tail_page=SLOT, cut_at_reuse=100)
        alloc = make(driver_name, policy=policy)
        a = alloc.malloc(2 * PAGE, STREAM)
        keep = alloc.malloc(PAGE, STREAM)
        c = alloc.malloc(3 * PAGE, STREAM)
        keep2 = alloc.malloc(PAGE, STREAM)
        alloc.free(a)
        alloc.free(c)
        b = alloc.malloc(PAGE + 5 * MiB, STREAM)
        runs[placing] = alloc.stats()["tails_cut_at_reuse"]
        if placing:
            assert b == policy.chosen[-1]
        for p in (b, keep, keep2):
            alloc.free(p)
        alloc.close()
    assert runs == {False: 1, True: 0}
