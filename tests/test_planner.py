"""The plan (Note [A plan learned from the run], gmlake/core/_planner.pxi): a planner chosen once per allocator decides
which tails growth maps in slots, and counts the run's large misses as plan hits and misses, when it settles and
re-plans, and the driver calls made after it settled. On the model (sim) and on real bytes (host)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

import gmlake
from gmlake import Allocator, HostDriver, SimDriver
from gmlake.core._allocator import Planner, RunPlanner
from gmlake.policies.gmlake import GMLakePolicy

MiB = 1 << 20


def make(driver_name: str = "sim", policy=None, **knobs) -> Allocator:
    driver = HostDriver() if driver_name == "host" else SimDriver()
    alloc = Allocator(driver, policy or gmlake.policies.get("gmlake", **knobs))
    alloc.debug_checks = True
    return alloc


def close(alloc: Allocator, ptrs) -> None:
    """Free `ptrs`, then give everything back."""
    for p in ptrs:
        alloc.free(p)
    alloc.close()


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_the_plan_cuts_only_a_short_tail_of_a_block_of_a_page_or_more(driver_name):
    cases = [(42, 42, {"plan": True}),      # two pages and a 2 MiB tail (10 % of a page): cut, one slot
             (30, 40, {"plan": True}),      # a page and a 10 MiB tail (50 % of a page): whole pages
             (4, 20, {"plan": True}),       # smaller than a page: whole pages
             (4, 4, {})]                    # no plan: tail_page alone cuts it, two slots
    for size, reserved, knobs in cases:
        alloc = make(driver_name, tail_page=2 * MiB, plan_tail_share=30, **knobs)
        p = alloc.malloc(size * MiB)
        assert alloc.stats()["reserved_bytes"] == reserved * MiB, (size, knobs)
        assert type(alloc.planner) is (RunPlanner if knobs else Planner)
        close(alloc, [p])


def test_the_plan_counts_hits_misses_settles_and_replans():
    alloc = make(tail_page=2 * MiB, plan=True, plan_settle=4)
    assert alloc.stats()["plan"]["hits"] == 0
    # one size, grown six times: a miss, then hits; it settles at the fifth, which and the sixth grow after
    ptrs = [alloc.malloc(50 * MiB) for _ in range(6)]
    plan = alloc.stats()["plan"]
    assert (plan["misses"], plan["hits"], plan["settled"], plan["settles"]) == (1, 5, True, 1)
    assert plan["calls_after_settled"] > 0 and plan["new_highs_after_settled"] == 2
    ptrs.append(alloc.malloc(60 * MiB))         # a size larger than any before: the plan looks again
    plan = alloc.stats()["plan"]
    assert (plan["replans"], plan["settled"], plan["misses"], plan["largest_request"]) == (1, False, 2, 60 * MiB)
    close(alloc, ptrs)


def test_a_warm_step_makes_no_driver_call_once_the_plan_settled():
    alloc = make(tail_page=2 * MiB, plan=True, plan_settle=2)
    sizes = [50 * MiB, 90 * MiB, 50 * MiB]
    for _ in range(4):                          # four steps of the same requests: only the first grows
        ptrs = [alloc.malloc(n) for n in sizes]
        for p in ptrs:
            alloc.free(p)
    calls = sum(alloc.stats()["calls"].values())
    for _ in range(3):
        ptrs = [alloc.malloc(n) for n in sizes]
        for p in ptrs:
            alloc.free(p)
    assert sum(alloc.stats()["calls"].values()) == calls
    alloc.close()


def test_no_plan_reports_none_and_a_policy_may_bring_its_own_planner():
    assert make(tail_page=2 * MiB).stats()["plan"] is None

    @dataclass(frozen=True)
    class Counted(GMLakePolicy):
        def cython_planner(self):
            return RunPlanner()

    alloc = make(policy=Counted(tail_page=2 * MiB))
    p = alloc.malloc(42 * MiB)
    assert alloc.stats()["plan"]["misses"] == 1 and alloc.stats()["reserved_bytes"] == 42 * MiB
    close(alloc, [p])

    @dataclass(frozen=True)
    class Wrong(GMLakePolicy):
        def cython_planner(self):
            return object()

    with pytest.raises(TypeError, match="cython_planner\\(\\) must return a gmlake.core._allocator.Planner"):
        make(policy=Wrong())


def test_plan_needs_tail_page():
    with pytest.raises(ValueError, match="plan decides which tails growth cuts"):
        gmlake.policies.get("gmlake", plan=True, tail_page=0).validate(2 * MiB)


def test_a_cap_that_never_binds_changes_nothing_the_plan_decides():
    def run(limit):
        alloc = make(tail_page=2 * MiB, plan=True)
        if limit:
            alloc.set_limit(limit)
        ptrs = [alloc.malloc(n * MiB) for n in (42, 30, 4, 62, 42)]
        alloc.free(ptrs[1])
        ptrs[1] = alloc.malloc(26 * MiB)
        s = alloc.stats()
        close(alloc, ptrs)
        return s["reserved_bytes"], s["calls"], s["plan"]

    assert run(None) == run(64 << 30)
