"""Private memory pools (CUDA graphs): isolation from the default pool, reuse within a pool, shared pools, release,
and the rules of graph capture (docs/graphs.md, Note [Private pools] and Note [Pools and graph capture])."""
from __future__ import annotations

import pytest
from streams import StreamHarness

import gmlake
from gmlake import (
    Allocator,
    CaptureOutOfMemoryError,
    GraphCaptureError,
    HostDriver,
    OutOfMemoryError,
    SimDriver,
)

KiB = 1 << 10
MiB = 1 << 20
POLICIES = ["gmlake", "gmlake-paper", "caching", "expandable"]


def _pool_of(alloc: Allocator, ptr: int) -> int:
    """The private pool id of the segment holding ptr (0: the default pool)."""
    for seg in alloc.segments_info():
        if seg["va"] <= ptr < seg["va"] + seg["size"]:
            return seg["private_pool"]
    raise AssertionError(f"0x{ptr:x} is in no segment")


def _events_and_syncs(alloc: Allocator) -> tuple:
    calls = alloc.stats()["calls"]
    return calls["synchronize"], calls["event_record"], calls["event_query"]


@pytest.fixture(params=POLICIES)
def alloc(request, driver):
    a = Allocator(driver, gmlake.policies.get(request.param))
    a.debug_checks = True
    yield a
    a.check()


@pytest.mark.parametrize("size", [4 * KiB, 3 * MiB, 30 * MiB])
def test_a_pool_never_takes_the_default_pools_free_blocks(alloc, size):
    free_default = alloc.malloc(size, 0)
    alloc.free(free_default)
    alloc.begin_allocate_to_pool(1, [0])
    inside = alloc.malloc(size, 0)
    assert inside != free_default and _pool_of(alloc, inside) == 1
    alloc.end_allocate_to_pool(1)
    alloc.free(inside)
    assert alloc.malloc(size, 0) == free_default      # the default pool's block is still its own


@pytest.mark.parametrize("size", [4 * KiB, 3 * MiB, 30 * MiB])
def test_the_default_pool_never_takes_a_pools_free_blocks(alloc, size):
    alloc.begin_allocate_to_pool(1, [0])
    inside = alloc.malloc(size, 0)
    alloc.free(inside)
    alloc.end_allocate_to_pool(1)
    outside = alloc.malloc(size, 0)
    assert outside != inside and _pool_of(alloc, outside) == 0
    pool_bytes = alloc.pools_info()[0]["reserved_bytes"]
    assert pool_bytes == sum(s["size"] for s in alloc.segments_info() if s["private_pool"] == 1) > 0
    alloc.empty_cache()                                # nor does empty_cache return a live pool's memory
    assert alloc.pools_info()[0]["reserved_bytes"] == pool_bytes
    alloc.begin_allocate_to_pool(1, [0])              # begun again: one more use, and its block is reused
    assert alloc.malloc(size, 0) == inside
    assert alloc.pools_info()[0]["use_count"] == 2


def test_only_the_filtered_streams_go_to_the_pool(alloc):
    alloc.begin_allocate_to_pool(3, [1])
    a = alloc.malloc(MiB, 1)
    b = alloc.malloc(MiB, 0)
    assert (_pool_of(alloc, a), _pool_of(alloc, b)) == (3, 0)
    alloc.end_allocate_to_pool(3)
    alloc.begin_allocate_to_pool(4)                    # None: every stream
    c, d = alloc.malloc(MiB, 0), alloc.malloc(MiB, 5)
    assert (_pool_of(alloc, c), _pool_of(alloc, d)) == (4, 4)


def test_reuse_within_a_pool_and_no_stitching(driver):
    alloc = Allocator(driver, gmlake.policies.get("gmlake-paper", min_saved_chunks=0))
    alloc.debug_checks = True
    alloc.begin_allocate_to_pool(1, [0])
    a, b, c = (alloc.malloc(40 * MiB, 0) for _ in range(3))
    alloc.free(a)
    alloc.free(c)
    reserved = alloc.stats()["reserved_bytes"]
    assert alloc.malloc(40 * MiB, 0) in (a, c)         # reuse of the pool's own free block
    d = alloc.malloc(70 * MiB, 0)                      # a 40 MiB block is free, but a pool grows rather than stitch
    assert alloc.stats()["stitches"] == 0 and alloc.stats()["reserved_bytes"] > reserved
    assert _pool_of(alloc, d) == 1
    alloc.free(d)
    alloc.free(b)
    alloc.end_allocate_to_pool(1)
    # The default pool stitches its own free blocks, never a pool's.
    x, y = alloc.malloc(40 * MiB, 0), alloc.malloc(40 * MiB, 0)
    alloc.malloc(4 * KiB, 0)
    alloc.free(x)
    alloc.free(y)
    before = {s["serial"] for s in alloc.segments_info() if s["private_pool"] == 1}
    alloc.malloc(80 * MiB, 0)
    assert alloc.stats()["stitches"] == 1              # x and y, stitched; the pool's free 70 and 40 MiB untouched
    assert alloc.pools_info()[0]["allocated_bytes"] == 40 * MiB
    assert {s["serial"] for s in alloc.segments_info() if s["private_pool"] == 1} == before
    alloc.check()


def test_several_begins_share_a_pool_and_the_last_release_returns_its_memory(driver):
    alloc = Allocator(driver, gmlake.policies.get("gmlake"))
    alloc.debug_checks = True
    held = driver.live_chunk_bytes
    for graph in range(3):                             # three graphs captured into one pool
        alloc.begin_allocate_to_pool(9, [0])
        ptrs = [alloc.malloc(s, 0) for s in (4 * KiB, 6 * MiB, 33 * MiB)]
        for p in ptrs:
            alloc.free(p)
        alloc.end_allocate_to_pool(9)
    info = alloc.pools_info()[0]
    assert info["use_count"] == 3 and info["allocated_bytes"] == 0
    assert alloc.pools_ids() == [9]
    pool_bytes = info["reserved_bytes"]
    assert driver.live_chunk_bytes == held + pool_bytes    # reused by graphs 2 and 3: no growth after the first
    assert alloc.release_pool(9) == 0 and alloc.release_pool(9) == 0
    assert driver.live_chunk_bytes == held + pool_bytes
    syncs = _events_and_syncs(alloc)[0]
    assert alloc.release_pool(9) == pool_bytes         # the last user: back to the driver, after a synchronize
    assert _events_and_syncs(alloc)[0] == syncs + 1
    assert driver.live_chunk_bytes == held and alloc.pools_info() == [] and alloc.pools_ids() == []
    assert alloc.stats()["reserved_bytes"] == held
    with pytest.raises(ValueError, match="no use to release"):
        alloc.release_pool(9)
    alloc.close()
    assert driver.leaks() == {k: 0 for k in driver.leaks()}


def test_release_with_live_blocks_keeps_them_valid_until_freed(driver):
    alloc = Allocator(driver, gmlake.policies.get("gmlake"))
    alloc.debug_checks = True
    alloc.begin_allocate_to_pool(2, [0])
    live = alloc.malloc(30 * MiB, 0)
    dead = alloc.malloc(50 * MiB, 0)
    alloc.free(dead)
    alloc.end_allocate_to_pool(2)
    dead_segment = [s["size"] for s in alloc.segments_info() if s["va"] == dead]
    held = driver.live_chunk_bytes
    returned = alloc.release_pool(2)
    assert [returned] == dead_segment and dead_segment[0] >= 50 * MiB    # the wholly free segment, back at once
    assert driver.live_chunk_bytes == held - returned
    assert alloc.pools_info()[0]["use_count"] == 0 and alloc.pools_info()[0]["allocated_bytes"] == 30 * MiB
    with pytest.raises(ValueError, match="released and still holds memory"):
        alloc.begin_allocate_to_pool(2, [0])
    other = alloc.malloc(30 * MiB, 0)                  # the default pool never gets the released pool's memory
    assert _pool_of(alloc, other) == 0
    alloc.free(other)
    alloc.free(live)                                   # back to the released pool, then to the driver
    assert alloc.pools_info()[0]["allocated_bytes"] == 0
    alloc.empty_cache()
    assert alloc.pools_info() == []
    alloc.begin_allocate_to_pool(2, [0])               # forgotten: the id names a fresh pool
    assert alloc.pools_info()[0]["use_count"] == 1
    alloc.end_allocate_to_pool(2)
    alloc.release_pool(2)
    alloc.close()
    assert driver.leaks() == {k: 0 for k in driver.leaks()}


def test_a_released_pool_returns_memory_under_pressure(driver):
    alloc = Allocator(driver, gmlake.policies.get("gmlake"), limit=128 * MiB)
    alloc.debug_checks = True
    alloc.begin_allocate_to_pool(1, [0])
    live = alloc.malloc(80 * MiB, 0)
    alloc.end_allocate_to_pool(1)
    alloc.release_pool(1)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(80 * MiB, 0)                      # the released pool still holds 80 MiB
    alloc.free(live)
    assert _pool_of(alloc, alloc.malloc(80 * MiB, 0)) == 0    # pressure returned the pool's segment first
    assert alloc.pools_info() == []


def test_api_errors_are_clear(alloc):
    with pytest.raises(ValueError, match="int >= 1"):
        alloc.begin_allocate_to_pool(0)
    with pytest.raises(ValueError, match="not active"):
        alloc.end_allocate_to_pool(5)
    with pytest.raises(ValueError, match="no use to release"):
        alloc.release_pool(5)
    alloc.begin_allocate_to_pool(5, [0])
    with pytest.raises(ValueError, match="already active"):
        alloc.begin_allocate_to_pool(5, [1])
    with pytest.raises(ValueError, match="is active"):
        alloc.release_pool(5)
    with pytest.raises(ValueError, match="pool 6 is not active"):
        alloc.malloc(MiB, 0, pool=6)
    alloc.end_allocate_to_pool(5)
    alloc.release_pool(5)
    with pytest.raises(RuntimeError, match="private pools \\[7\\]"):
        alloc.begin_allocate_to_pool(7)
        alloc.close()


def test_stats_and_snapshot_count_pool_memory(driver):
    alloc = Allocator(driver, gmlake.policies.get("gmlake"))
    alloc.begin_allocate_to_pool(4, [0])
    p = alloc.malloc(10 * MiB, 0)
    s = alloc.stats()
    info = alloc.pools_info()[0]
    assert s["allocated_bytes"] == 10 * MiB and s["reserved_bytes"] == info["reserved_bytes"] > 0
    assert info == {"id": 4, "use_count": 1, "active": True, "capturing": False, "streams": [0], "segments": 1,
                    "reserved_bytes": info["reserved_bytes"], "allocated_bytes": 10 * MiB}
    assert [seg["private_pool"] for seg in alloc.segments_info()] == [4]
    alloc.free(p)


def test_policy_seams_see_the_pool(driver):
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Watching(gmlake.policies.GMLakePolicy):
        seen: list = field(default_factory=list, compare=False)

        def segment_layout(self, size, stream, pool, default, state):
            self.seen.append(state.private_pool)
            return default

    policy = Watching()
    alloc = Allocator(driver, policy)
    alloc.malloc(3 * MiB, 0)
    alloc.begin_allocate_to_pool(8, [0])
    alloc.malloc(3 * MiB, 0)
    assert policy.seen == [0, 8]


# ---------------------------------------------------------------- graph capture


def test_no_event_or_synchronize_while_capturing(driver):
    """Frees with other streams' uses wait until the capture ends; pending frees are not polled; fences are not
    taken; blocks freed during capture are reused at once within it."""
    driver.auto_complete = False
    alloc = Allocator(driver, gmlake.policies.get("gmlake-paper"))    # cross-stream fences on
    alloc.debug_checks = True
    shared = alloc.malloc(8 * MiB, 0)
    alloc.record_stream(shared, 1)
    alloc.free(shared)                                 # a pending free: normally polled by every malloc
    other = alloc.malloc(6 * MiB, 2)
    alloc.free(other)                                  # stream 2's free block: normally fenced for stream 0
    assert alloc.stats()["pending_frees"] == 1
    alloc.begin_allocate_to_pool(1, [0], capturing=True)
    before = _events_and_syncs(alloc)
    a = alloc.malloc(6 * MiB, 0)
    alloc.record_stream(a, 1)
    alloc.free(a)                                      # deferred: no event may be recorded during capture
    b = alloc.malloc(5 * MiB, 0)
    alloc.free(b)
    assert alloc.malloc(5 * MiB, 0) == b               # freed in capture, reused in capture
    assert alloc.malloc(6 * MiB, 3) not in (a, b)      # a stream outside the capture, default pool: no fences
    with pytest.raises(GraphCaptureError, match="synchronize"):
        alloc.empty_cache()
    assert _events_and_syncs(alloc) == before
    assert alloc.stats()["pending_frees"] == 1
    alloc.end_allocate_to_pool(1)
    assert _events_and_syncs(alloc)[1] == before[1] + 1    # the deferred free records its event now
    assert alloc.stats()["pending_frees"] == 2
    driver.complete_all()
    alloc.malloc(4 * KiB, 0)                           # polls again
    assert alloc.stats()["pending_frees"] == 0
    alloc.check()


@pytest.mark.parametrize("policy", POLICIES)
def test_capture_growth_beyond_memory_fails_clearly_and_the_allocator_stays_usable(driver, policy):
    alloc = Allocator(driver, gmlake.policies.get(policy), limit=96 * MiB)
    alloc.debug_checks = True
    cached = alloc.malloc(60 * MiB, 0)
    alloc.free(cached)                                 # free in the default pool: relief would release it
    alloc.begin_allocate_to_pool(1, [0], capturing=True)
    small = alloc.malloc(20 * MiB, 0)                  # growth itself is allowed during capture
    before = (_events_and_syncs(alloc), alloc.segments_info())
    with pytest.raises(CaptureOutOfMemoryError, match="during CUDA graph capture") as err:
        alloc.malloc(60 * MiB, 0)
    assert isinstance(err.value, OutOfMemoryError) and err.value.requested == 60 * MiB
    assert (_events_and_syncs(alloc), alloc.segments_info()) == before   # nothing changed, nothing synchronized
    alloc.free(small)
    alloc.end_allocate_to_pool(1)
    alloc.begin_allocate_to_pool(1, [0])               # not capturing: relief may synchronize and release
    big = alloc.malloc(60 * MiB, 0)
    assert _pool_of(alloc, big) == 1
    alloc.free(big)
    alloc.end_allocate_to_pool(1)
    alloc.release_pool(1)
    alloc.release_pool(1)
    alloc.close()


def test_harness_capture_has_no_hazard():
    """Through the hazard-tracking harness: pool blocks reused during capture, a deferred cross-stream free."""
    h = StreamHarness(HostDriver(), "gmlake")
    h.alloc.begin_allocate_to_pool(1, [0], capturing=True)
    a = h.malloc(3 * MiB, 0)
    h.use_on(a, 1)
    h.free(a)
    b = h.malloc(3 * MiB, 0)
    assert b != a                                      # a waits for stream 1, after the capture
    h.free(b)
    assert h.malloc(3 * MiB, 0) == b
    h.alloc.end_allocate_to_pool(1)
    h.complete(1)
    h.complete(0)
    h.alloc.release_pool(1)
    h.close()


def test_sim_and_host_agree_on_pools():
    def run(driver):
        alloc = Allocator(driver, gmlake.policies.get("gmlake"))
        out = []
        alloc.begin_allocate_to_pool(1, [0], capturing=True)
        ptrs = [alloc.malloc(s, s % 2) for s in (5 * MiB, 3 * KiB, 17 * MiB, 1 * MiB + 1)]
        alloc.free(ptrs[0])
        ptrs[0] = alloc.malloc(4 * MiB, 0)
        alloc.end_allocate_to_pool(1)
        out.append((alloc.stats(), [{k: v for k, v in s.items() if k != "va"} for s in alloc.segments_info()]))
        for p in ptrs:
            alloc.free(p)
        alloc.release_pool(1)
        out.append(alloc.stats())
        alloc.close()
        return out
    assert run(SimDriver(capacity=1 << 40)) == run(HostDriver(capacity=1 << 40))


def test_the_torch_snapshot_names_each_segments_pool():
    import gmlake.torch as gt
    alloc = Allocator(SimDriver(), gmlake.policies.get("gmlake"))
    alloc.malloc(MiB, 0)
    alloc.begin_allocate_to_pool(6, [0])
    alloc.malloc(MiB, 0)
    assert sorted(seg["segment_pool_id"] for seg in gt._segments(0, alloc)) == [(0, 0), (0, 6)]


def test_a_caller_may_route_requests_itself(alloc):
    """As the torch bridge will, with PyTorch's stream filters: a pool begun for no stream serves only the requests
    that name it."""
    alloc.begin_allocate_to_pool(3, [])
    routed = alloc.malloc(MiB, 4, pool=3)
    plain = alloc.malloc(MiB, 4)
    assert (_pool_of(alloc, routed), _pool_of(alloc, plain)) == (3, 0)
    alloc.begin_allocate_to_pool(5, [4])
    assert _pool_of(alloc, alloc.malloc(MiB, 4, pool=0)) == 0     # 0: the default pool, whatever the routing
    assert _pool_of(alloc, alloc.malloc(MiB, 4)) == 5
    alloc.end_allocate_to_pool(3)
    with pytest.raises(ValueError, match="pool 3 is not active"):
        alloc.malloc(MiB, 4, pool=3)


def _driver_calls(alloc: Allocator) -> int:
    return sum(alloc.stats()["calls"].values())


def test_an_unannounced_capture_refuses_requests_that_need_the_driver_before_calling_it(alloc, driver):
    """Note [Unannounced capture]: an extension's own cudaStreamBeginCapture; a request that would grow, stitch,
    fence or synchronize fails naming the cause, with no driver call; one served from mapped memory goes on."""
    cached = alloc.malloc(3 * MiB, 5)
    alloc.free(cached)
    driver.begin_raw_capture(5)
    calls = _driver_calls(alloc)
    with pytest.raises(GraphCaptureError, match="not told of"):
        alloc.malloc(300 * MiB, 5)
    assert _driver_calls(alloc) == calls
    reused = alloc.malloc(3 * MiB, 5)               # mapped memory of the same stream: no driver call, served
    assert _driver_calls(alloc) == calls
    alloc.free(reused)
    other = alloc.malloc(64 * MiB, 6)               # a stream not capturing is served as ever
    driver.end_raw_capture(5)
    grown = alloc.malloc(300 * MiB, 5)              # the capture ended: the same request grows memory
    alloc.free(grown)
    alloc.free(other)


def test_an_unannounced_capture_leaves_pending_frees_unpolled(driver):
    driver.auto_complete = False
    alloc = Allocator(driver, gmlake.policies.get("gmlake"))
    alloc.free(alloc.malloc(1 * KiB, 1))            # a small segment mapped for stream 1
    block = alloc.malloc(4 * MiB, 1)
    alloc.record_stream(block, 2)
    alloc.free(block)                               # pending: stream 2's event is recorded
    driver.begin_raw_capture(1)
    queries = alloc.stats()["calls"]["event_query"]
    alloc.free(alloc.malloc(1 * KiB, 1))            # served from mapped memory, without polling the event
    assert alloc.stats()["calls"]["event_query"] == queries
    assert alloc.stats()["pending_frees"] == 1
    driver.end_raw_capture(1)
    driver.complete_all()
    alloc.free(alloc.malloc(1 * KiB, 1))            # the capture ended: the pending free is polled and retired
    assert alloc.stats()["pending_frees"] == 0


def test_retain_pool_adds_a_use_each_release_drops(alloc):
    alloc.begin_allocate_to_pool(7, [], capturing=True)
    alloc.retain_pool(7)
    ptr = alloc.malloc(2 * MiB, 0, pool=7)
    assert _pool_of(alloc, ptr) == 7
    alloc.end_allocate_to_pool(7)
    alloc.free(ptr)
    assert alloc.pools_info()[0]["use_count"] == 2
    alloc.release_pool(7)
    assert alloc.pools_info()[0]["use_count"] == 1
    alloc.release_pool(7)
    assert not alloc.pools_info()
    with pytest.raises(ValueError, match="not active"):
        alloc.retain_pool(7)


@pytest.mark.parametrize("policy", ["gmlake", "caching", "expandable"])
def test_pool_segments_are_sized_as_pytorch_sizes_its_pools(policy):
    """A pool's segments are fixed, so under every rule but the paper's chunks they are sized as PyTorch's pools'
    are: 20 MiB for requests under 10 MiB (later ones split it), else the request rounded to 2 MiB, one handle each.
    (Sized as expandable pages, a 22 MiB request took a 40 MiB segment.)"""
    alloc = Allocator(SimDriver(), gmlake.policies.get(policy))
    alloc.begin_allocate_to_pool(9, [], capturing=True)
    sizes = [22 * MiB + 1, 11 * MiB, 3 * MiB, 5 * MiB]
    ptrs = [alloc.malloc(n, 0, pool=9) for n in sizes]
    info = alloc.pools_info()[0]
    assert info["reserved_bytes"] == 24 * MiB + 12 * MiB + 20 * MiB, info
    assert info["segments"] == 3
    for p in ptrs:
        alloc.free(p)
    alloc.end_allocate_to_pool(9)
    alloc.release_pool(9)
    assert alloc.pools_info() == []
