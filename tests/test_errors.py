"""Errors travel with the call that raised them: policy hooks, out-of-memory, oversized requests (issue 12, 2-3)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

import gmlake
from gmlake import Allocator, OutOfMemoryError, PolicyError, SimDriver
from gmlake.sim.replay import replay
from gmlake.sim.trace import load

MiB = 1 << 20
TINY = "tests/data/tiny-gpt2-native.pickle.gz"


@dataclass(frozen=True)
class RaisingStitch(gmlake.policies.PaperPolicy):
    def allow_stitch(self, size, stream, pieces, new_bytes):
        if size >= 12 * MiB:
            raise KeyError("no stitching today")
        return True


@dataclass(frozen=True)
class OutOfRangeVictim(gmlake.policies.PaperPolicy):
    max_cached_sblocks: int = 2

    def evict_victim(self, cached, reason, state):
        return len(cached)          # one past the end


def stitch_setup(alloc: Allocator) -> None:
    """Leave three free 4 MiB blocks, so a 12 MiB request must stitch."""
    blocks = [alloc.malloc(4 * MiB) for _ in range(3)]
    guards = [alloc.malloc(2 * MiB + 512) for _ in range(3)]
    for p in blocks:
        alloc.free(p)
    return guards


def test_a_raising_hook_fails_the_request_and_leaves_no_stale_error(driver):
    alloc = Allocator(driver, RaisingStitch())
    stitch_setup(alloc)
    before = alloc.stats()["allocated_bytes"]
    with pytest.raises(PolicyError, match="KeyError.*no stitching today"):
        alloc.malloc(12 * MiB)
    assert alloc.stats()["allocated_bytes"] == before
    p = alloc.malloc(1 * MiB)                       # an unrelated request: no hook runs, so it must succeed
    alloc.free(p)
    alloc.check()


def test_each_failed_call_reports_the_first_exception_of_its_own_call(driver):
    """Note [A call's failure]: a hook's failure is marked in the call's own Failure, so two failing calls in a row
    each report the first exception their own hooks raised, never the other call's."""
    raised = []

    @dataclass(frozen=True)
    class Counting(gmlake.policies.PaperPolicy):
        def should_split(self, block_size, size, pool, default):
            if size != 3 * MiB:
                return default
            raised.append(len(raised) + 1)
            raise RuntimeError(f"raise number {raised[-1]}")

    alloc = Allocator(driver, Counting())
    alloc.free(alloc.malloc(8 * MiB))
    for _ in range(3):
        first_of_this_call = len(raised) + 1
        with pytest.raises(PolicyError, match=f"raise number {first_of_this_call}$"):
            alloc.malloc(3 * MiB)
    assert len(raised) >= 3
    alloc.check()


def test_replay_stops_with_the_hooks_error():
    with pytest.raises(PolicyError, match="no stitching today"):
        replay(load(TINY), RaisingStitch())


def test_an_eviction_answer_out_of_range_is_rejected(driver):
    alloc = Allocator(driver, OutOfRangeVictim())
    with pytest.raises(PolicyError, match="evict_victim returned"):
        for size in (9, 11, 13):                    # each stitches a new sBlock; the third evicts
            parts = [alloc.malloc(4 * MiB) for _ in range(4)]
            for p in parts:
                alloc.free(p)
            alloc.free(alloc.malloc(size * MiB))
    alloc.check()


def test_hook_errors_stay_with_their_thread():
    """Two threads, one policy that raises for one of them only: each sees its own outcome."""

    @dataclass(frozen=True)
    class RaiseOnStream1(gmlake.policies.PaperPolicy):
        def should_split(self, block_size, size, pool, default):
            if threading.current_thread().name == "bad":
                time.sleep(0.001)
                raise RuntimeError("only the bad thread")
            return default

    alloc = Allocator(SimDriver(), RaiseOnStream1())
    outcomes: dict[str, list] = {"bad": [], "good": []}

    def work(name: str) -> None:
        for _ in range(200):
            try:
                alloc.free(alloc.malloc(3 * MiB + 512 * (len(outcomes[name]) % 7)))
                outcomes[name].append("ok")
            except PolicyError as exc:
                outcomes[name].append(str(exc))

    threads = [threading.Thread(target=work, args=(n,), name=n) for n in ("bad", "good")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o == "ok" for o in outcomes["good"]), "another thread's hook error leaked into this one"
    assert any("only the bad thread" in o for o in outcomes["bad"])
    alloc.check()


@pytest.mark.parametrize("policy", gmlake.policies.names())
def test_a_request_larger_than_the_device_fails_at_once(policy):
    alloc = Allocator(SimDriver(capacity=80 << 30), gmlake.policies.get(policy))
    start = time.monotonic()
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(1 << 61)
    assert time.monotonic() - start < 1.0
    assert alloc.stats()["calls"]["create_chunk"] == 0
    unbounded = Allocator(SimDriver(), gmlake.policies.get(policy))
    with pytest.raises(OutOfMemoryError):
        unbounded.malloc((1 << 61) + 1)
    assert time.monotonic() - start < 2.0


def test_out_of_memory_reports_the_figures_of_its_own_call(driver):
    alloc = Allocator(driver, limit=64 * MiB)
    keep = alloc.malloc(40 * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        alloc.malloc(50 * MiB)
    assert info.value.allocated >= 40 * MiB and info.value.limit == 64 * MiB
    alloc.free(keep)


def test_limits_are_validated(driver):
    alloc = Allocator(driver)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError):
            alloc.set_limit(bad)


def test_a_driver_error_is_reported_by_its_own_call_and_by_no_later_one(driver):
    """Note [A call's failure]: a request whose map fails raises DriverError naming map; the next request, and a
    free whose event record fails (its memory then waits for the device instead), report nothing of it."""
    alloc = Allocator(driver)
    driver.inject_fault("map")
    with pytest.raises(gmlake.DriverError, match="map") as info:
        alloc.malloc(64 * MiB)
    assert info.value.call == "map"
    p = alloc.malloc(64 * MiB)                      # the fault fired once: this call has nothing to report
    alloc.record_stream(p, 7)
    driver.inject_fault("event_record")
    alloc.free(p)                                   # no event: the free waits for the device, and fails nothing
    q = alloc.malloc(64 * MiB)
    alloc.free(q)
    alloc.empty_cache()
    alloc.check()
