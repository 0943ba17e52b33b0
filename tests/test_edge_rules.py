"""What the code at the edge of memory must do and must never do, each rule stated positively: re-backing (off by
default, and never outside the default pool), a failed re-back under the device reserve, the reserve opened for one
request only, the order of relief when a policy asks for re-backing first, the retry after every relief stage, the
sBlock cache's search and a policy's declined placement, and growth once a cap is set mid-run."""
from __future__ import annotations

import ctypes

import pytest

import gmlake
from gmlake import Allocator, DriverError, HostDriver, OutOfMemoryError, SimDriver
from gmlake.policies import GMLakePolicy

MiB = 1 << 20


def gapped_pages(alloc: Allocator, pages: int = 10, live_mib: int = 6) -> list[int]:
    """`pages` 20 MiB pages, each holding a live block of `live_mib` MiB (filled with its index + 1 on the host)
    beside a freed gap. Returns the live blocks."""
    live, gaps = [], []
    for i in range(pages):
        live.append(alloc.malloc(live_mib * MiB))
        gaps.append(alloc.malloc((20 - live_mib) * MiB))
        if isinstance(alloc.driver, HostDriver):
            ctypes.memset(live[-1], i + 1, live_mib * MiB)
    for g in gaps:
        alloc.free(g)
    return live


def intact(live: list[int], live_mib: int = 6, first: int = 1) -> bool:
    return all(ctypes.string_at(p, live_mib * MiB) == bytes([i + first]) * (live_mib * MiB) for i, p in enumerate(live))


def unmapped_ranges(alloc: Allocator) -> list[tuple[int, int]]:
    return [(e["addr"], e["addr"] + e["size"]) for e in alloc.history() if e["action"] == "segment_unmap"]


def overlaps(ranges: list[tuple[int, int]], blocks: list[int], size: int) -> bool:
    return any(lo < p + size and p < hi for lo, hi in ranges for p in blocks)


# ---------------------------------------------------------------- re-backing: off by default, opt-in, default pool only

@pytest.mark.parametrize("where", ["cap", "device"])
def test_the_default_never_unmaps_a_range_a_live_block_uses(where):
    """The default policy at its limit: the request that only re-backing could fit fails with out-of-memory, and no
    unmap, copy or remap ever touched the live blocks' bytes (Note [Taking slots back at the edge])."""
    assert GMLakePolicy().reback_slot == 0
    alloc = Allocator(HostDriver(capacity=200 * MiB if where == "device" else 0), GMLakePolicy(),
                      limit=200 * MiB if where == "cap" else None)
    alloc.debug_checks = True
    alloc.record_history(True)
    live = gapped_pages(alloc)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(100 * MiB)
    s = alloc.stats()
    assert s["rebacked_chunks"] == 0 and s["calls"]["copy_out"] == s["calls"]["copy_in"] == 0
    assert not overlaps(unmapped_ranges(alloc), live, 6 * MiB)
    assert intact(live)
    alloc.check()


def test_rebacking_stays_an_opt_in_knob():
    """Turned on, the same request re-backs the pages and fits, the live bytes copied back where they were."""
    alloc = Allocator(HostDriver(), GMLakePolicy(reback_slot=2 * MiB), limit=200 * MiB)
    live = gapped_pages(alloc)
    alloc.malloc(100 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 10
    assert intact(live)


def test_rebacking_never_touches_a_private_pool():
    """A private pool's memory (a CUDA graph's, a MemPool's) may be used by a replayed graph at any time: re-backing
    takes slots back from the default pool's pages only. Five gapped pages in each; the request fits from the
    default pool's five gaps, and the pool's pages, handles and bytes stay as they were."""
    alloc = Allocator(HostDriver(), GMLakePolicy(reback_slot=2 * MiB), limit=210 * MiB)
    alloc.debug_checks = True
    alloc.record_history(True)
    alloc.begin_allocate_to_pool(7, [0])
    pooled = gapped_pages(alloc, pages=5)
    alloc.end_allocate_to_pool(7)
    ours = gapped_pages(alloc, pages=5)
    for i, p in enumerate(ours):
        ctypes.memset(p, 101 + i, 6 * MiB)
    pool_before = alloc.pools_info()[0]
    pool_segments = {s["serial"]: s["mapped_chunks"] for s in alloc.segments_info() if s["private_pool"] == 7}
    alloc.malloc(60 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 5
    assert alloc.pools_info()[0]["reserved_bytes"] == pool_before["reserved_bytes"]
    assert {s["serial"]: s["mapped_chunks"] for s in alloc.segments_info() if s["private_pool"] == 7} == pool_segments
    pool_ranges = [(s["va"], s["va"] + s["size"]) for s in alloc.segments_info() if s["private_pool"] == 7]
    assert not any(lo < b and a < hi for a, b in unmapped_ranges(alloc) for lo, hi in pool_ranges)
    assert intact(pooled) and intact(ours, first=101)
    alloc.check()


def test_rebacking_never_touches_a_private_pool_even_when_only_the_pool_has_gaps():
    """With gaps only in the pool's pages, nothing may be re-backed: the request fails with out-of-memory."""
    alloc = Allocator(HostDriver(), GMLakePolicy(reback_slot=2 * MiB), limit=100 * MiB)
    alloc.begin_allocate_to_pool(7, [0])
    pooled = gapped_pages(alloc, pages=5)
    alloc.end_allocate_to_pool(7)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(40 * MiB)
    assert alloc.stats()["rebacked_chunks"] == 0 and alloc.stats()["calls"]["copy_out"] == 0
    assert intact(pooled)


def test_a_failed_reback_keeps_the_pages_live_bytes_under_the_device_reserve():
    """A re-back whose new slots fail to map restores the page whole: the replacement page replaces memory the
    allocator held a moment ago, which the device reserve never refuses (else the page's live bytes are lost and the
    driver's error becomes an out-of-memory). The driver's error names the call; the page is as it was."""
    alloc = Allocator(HostDriver(capacity=200 * MiB),
                      GMLakePolicy(reback_slot=2 * MiB, device_reserve=8 * MiB))
    live = gapped_pages(alloc)
    alloc.driver.inject_fault("map", 1)
    with pytest.raises(DriverError, match="map"):
        alloc.malloc(100 * MiB)
    alloc.check()
    assert alloc.stats()["reserved_bytes"] == alloc.driver.live_chunk_bytes == 200 * MiB
    assert intact(live)
    for p in live:
        alloc.free(p)
    alloc.empty_cache()
    assert alloc.driver.live_chunks == 0


# ---------------------------------------------------------------- the device reserve: one request's, then closed

def test_the_device_reserve_is_opened_for_one_request_only():
    """A request that relief cannot help takes the device reserve; the next request whose growth would dip into the
    reserve goes through relief first (here: the large pool's free pages go back), and the reserve is left free."""
    alloc = Allocator(SimDriver(capacity=104 * MiB), GMLakePolicy(device_reserve=8 * MiB))
    alloc.debug_checks = True
    x = alloc.malloc(60 * MiB)
    a = alloc.malloc(30 * MiB)         # 40 MiB of pages: 4 MiB left, the reserve taken, nothing to release
    assert alloc.driver.live_chunk_bytes == 100 * MiB
    alloc.free(x)                      # 60 MiB free in mapped pages
    alloc.malloc(512 << 10)            # a 2 MiB small page: 2 MiB of the reserve, or relief first
    assert alloc.driver.capacity - alloc.driver.live_chunk_bytes >= 8 * MiB
    assert alloc.stats()["reserved_bytes"] == 40 * MiB + 2 * MiB
    alloc.free(a)


# ---------------------------------------------------------------- relief: its order, and a retry after every stage

def test_a_policy_that_asks_for_rebacking_first_gets_release_then_reback():
    """relieve_pressure answering "reback" at the first attempt: that stage gives back every wholly free page
    before it re-backs any partly used one (so new slots are made while the cap leaves room for them), and the
    request is retried right after it, served, with no other stage asked."""
    asked = []

    class RebackFirst(GMLakePolicy):
        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            asked.append((attempt, default))
            return "reback" if attempt == 0 else None

    alloc = Allocator(SimDriver(), RebackFirst(reback_slot=2 * MiB), limit=240 * MiB)
    alloc.debug_checks = True
    alloc.record_history(True)
    live = gapped_pages(alloc)
    whole = alloc.malloc(20 * MiB)      # the last page's gap and 6 MiB of a new page
    spare = alloc.malloc(20 * MiB)      # the rest of that page and all of the next
    alloc.free(spare)                   # one wholly free page at the range's end, one gapped page before it
    alloc.malloc(100 * MiB)
    assert asked == [(0, "release_other_pool")]
    unmaps = unmapped_ranges(alloc)
    assert unmaps[0] == (whole + 34 * MiB, whole + 54 * MiB), "the wholly free page goes back first"
    assert [hi - lo for lo, hi in unmaps[1:]] == [14 * MiB] * 10 and alloc.stats()["rebacked_chunks"] == 10
    assert not overlaps(unmaps, live, 6 * MiB) and not overlaps(unmaps, [whole], 20 * MiB)


def test_the_builtin_stages_run_in_order_and_each_is_followed_by_a_retry():
    """The built-in stages, as a policy that keeps the default sees them: release the other pool, release all,
    re-back (only where reback_slot is set), then give up; the request is retried after each."""
    seen: dict[int, list] = {0: [], 2 * MiB: []}

    class Recording(GMLakePolicy):
        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            seen[self.reback_slot].append(default)
            return default

    for slot in seen:
        alloc = Allocator(SimDriver(), Recording(reback_slot=slot), limit=200 * MiB)
        gapped_pages(alloc)
        try:
            alloc.malloc(100 * MiB)
        except OutOfMemoryError:
            pass
    assert seen[0] == ["release_other_pool", "release_all", None]
    assert seen[2 * MiB] == ["release_other_pool", "release_all", "reback"]


def test_growth_joins_a_free_block_of_no_stream_that_it_counted_as_room():
    """A range's run of room may start at a free block that a fence (or a pressure stage) made every stream's: the
    request takes it with the pages mapped after it, as one block, and never maps new pages past it while it
    stands free. (Left out of the run, the new pages did not join it: the request mapped twice the pages it needed,
    or, under a cap, ran out of memory through every relief stage, and a later try would have fit.)"""
    alloc = Allocator(SimDriver(), GMLakePolicy())
    alloc.debug_checks = True
    alloc.malloc(20 * MiB)
    alloc.malloc(10 * MiB)
    w = alloc.malloc(10 * MiB)              # [30, 40) MiB of the range: page 1's second half
    alloc.free(w)
    alloc.malloc(4096, stream=1)            # a miss on stream 1 fences stream 0: w becomes every stream's
    assert any(b[2] == "free" and b[3] == -1 for s in alloc.segments_info() for b in s["blocks"])
    large = alloc.stats()["reserved_bytes"]
    r = alloc.malloc(30 * MiB)
    assert r == w and alloc.stats()["reserved_bytes"] == large + 20 * MiB


def test_the_pressure_loop_fits_what_a_retry_would_fit_without_the_reserve():
    """The run that showed a relief stage ending one retry short: opt1.3b-ckpt replayed under a cap of 1.02x its
    peak with re-backing on fits with no device reserve as with one (the reserve's extra try had hidden it)."""
    from gmlake.sim.replay import run_requests
    from gmlake.sim.trace import load
    trace = load("tests/data/results/traces/opt1.3b-ckpt-20steps-gmlake-nocap.gmtrace")
    for reserve in (0, 8 * MiB):
        _, out = run_requests(trace, GMLakePolicy(device_reserve=reserve, reback_slot=2 * MiB), cap=13491378954,
                              samples=1)
        assert out["ooms"] == 0, reserve


# ---------------------------------------------------------------- the sBlock cache

def stitched_of(alloc: Allocator, size: int) -> int:
    """A stitched allocation of `size` bytes, from free pages left between live ones (min_saved_chunks=0)."""
    before = alloc.stats()["stitches"]
    p = alloc.malloc(size)
    assert alloc.stats()["stitches"] == before + 1
    return p


def cached_sblocks(alloc: Allocator, n: int) -> tuple[list[int], list[int]]:
    """`n` cached 4 MiB sBlocks, each stitched from two 2 MiB blocks of their own segments (gmlake-paper's 2 MiB
    chunks), all pieces free. Returns the stitched addresses and the pieces, two per sBlock, in order."""
    pieces = [alloc.malloc(2 * MiB) for _ in range(2 * n)]
    stitched = []
    for i in range(n):
        alloc.free(pieces[2 * i])
        alloc.free(pieces[2 * i + 1])
        stitched.append(stitched_of(alloc, 4 * MiB))
    for p in stitched:
        alloc.free(p)
    assert alloc.stats()["cached_sblocks"] == n
    return stitched, pieces


def test_a_fitting_cached_sblock_is_found_behind_any_number_that_do_not_fit():
    """Nine cached sBlocks of one size, a piece of each of the first eight held by another block: the request that
    no free block fits is served by the ninth, not by a new stitch (Note [Searching the sBlock cache])."""
    alloc = Allocator(SimDriver(), gmlake.policies.get("gmlake-paper"))
    alloc.debug_checks = True
    stitched, pieces = cached_sblocks(alloc, 9)
    held = [alloc.malloc(2 * MiB) for _ in range(16)]       # best fit: the lowest serials, pieces[0:16]
    assert sorted(held) == sorted(pieces[:16])
    for p in held[1::2]:
        alloc.free(p)
    held = held[0::2]
    assert sorted(held) == sorted(pieces[0:16:2])           # one piece of each of the first eight sBlocks
    before = alloc.stats()
    got = alloc.malloc(4 * MiB)
    after = alloc.stats()
    assert got == stitched[8]
    assert after["sblock_reuses"] == before["sblock_reuses"] + 1 and after["stitches"] == before["stitches"]


def test_a_bounded_search_is_still_a_knob():
    """A policy may bound the search (sblock_search_depth): then the ninth is not examined and the request stitches."""
    alloc = Allocator(SimDriver(), gmlake.policies.get("gmlake-paper", sblock_search_depth=8))
    stitched, _ = cached_sblocks(alloc, 9)
    held = [alloc.malloc(2 * MiB) for _ in range(16)]
    for p in held[1::2]:
        alloc.free(p)
    before = alloc.stats()["stitches"]
    assert alloc.malloc(4 * MiB) != stitched[8]
    assert alloc.stats()["stitches"] == before + 1


def test_a_declined_placement_is_never_served_from_the_sblock_cache():
    """choose_block answering None means "new memory or a stitch instead": the request is never handed a cached
    sBlock behind the policy's back, also not by the same-size search that decides whether to stitch again
    (restitch_limit); while the policy answers the built-in choice, the cached sBlock serves it."""

    class Declining(gmlake.policies.PaperPolicy):
        declining = False

        def choose_block(self, size, stream, pool, candidates, default, state):
            return None if Declining.declining else default

    alloc = Allocator(SimDriver(), Declining(restitch_limit=2))
    alloc.debug_checks = True
    stitched, _ = cached_sblocks(alloc, 1)
    Declining.declining = True
    before = alloc.stats()
    got = alloc.malloc(4 * MiB)
    assert got != stitched[0] and alloc.stats()["sblock_reuses"] == before["sblock_reuses"]
    alloc.free(got)
    Declining.declining = False
    reused = alloc.stats()["sblock_reuses"]
    alloc.malloc(4 * MiB)
    assert alloc.stats()["sblock_reuses"] == reused + 1


# ---------------------------------------------------------------- growth once a cap is set mid-run

def test_a_cap_set_mid_run_bounds_the_growth_of_the_range_that_exists():
    """The default (one page size, capped or not): a cap set after the first range was made lets that range grow
    while the cap has room, in the same range (no second one), never past the cap; a request past it fails with
    out-of-memory and maps nothing."""
    alloc = Allocator(SimDriver(capacity=1 << 30), GMLakePolicy())
    alloc.debug_checks = True
    alloc.malloc(30 * MiB)                                  # two 20 MiB pages
    alloc.set_limit(100 * MiB)
    alloc.malloc(40 * MiB)                                  # the tail's 10 MiB and two more pages: 80 MiB
    large = [s for s in alloc.segments_info() if s["pool"] == "large"]
    assert len(large) == 1 and large[0]["mapped_chunks"] == 4
    assert alloc.stats()["reserved_bytes"] == 80 * MiB
    chunks = alloc.driver.live_chunks
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(35 * MiB)                              # the 10 MiB tail and 40 MiB of pages: past the cap
    assert alloc.stats()["reserved_bytes"] <= 100 * MiB and alloc.driver.live_chunks <= chunks
    alloc.malloc(20 * MiB)                                  # the tail and one page: what the cap has room for
    assert alloc.stats()["reserved_bytes"] == 100 * MiB
    alloc.check()
