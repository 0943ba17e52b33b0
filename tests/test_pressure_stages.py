"""Memory pressure, stage by stage: what each stage of relief gives back (which pool, which cached sBlocks, which
chunks), in which order, and that relief stops as soon as the request fits. The end state alone (the request served,
reserved under the cap) would pass a stage that released the wrong pool first."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from conftest import fragment

from gmlake import Allocator, SimDriver
from gmlake.policies import PaperPolicy

MiB = 1 << 20
GiB = 1 << 30


def pools(alloc: Allocator) -> dict[str, list[tuple[int, int, int]]]:
    """(serial, bytes, free bytes) of each segment, by pool, oldest first."""
    out: dict[str, list] = {"small": [], "large": []}
    for s in alloc.segments_info():
        out[s["pool"]].append((s["serial"], s["size"], sum(b[1] for b in s["blocks"] if b[2] == "free")))
    return out


def free_small_segments(alloc: Allocator, n: int) -> None:
    """`n` free small-pool segments of 2 MiB (two 1 MiB requests each)."""
    for p in [alloc.malloc(1 * MiB) for _ in range(2 * n)]:
        alloc.free(p)


@dataclass(frozen=True)
class Watched(PaperPolicy):
    """Records each eviction it is asked for (reason, cached ids oldest first, reserved at that moment) and takes
    the default (the least recently used); never stitches a request of `no_stitch_for` bytes."""

    no_stitch_for: int = 0
    evictions: ClassVar[list] = []

    def evict_victim(self, cached, reason, state):
        self.evictions.append((reason, [c.id for c in cached], state.reserved))
        return 0

    def allow_stitch(self, size, stream, pieces, new_bytes):
        return size != self.no_stitch_for


def test_stage_0_releases_the_other_pool_oldest_first_and_only_what_the_request_needs():
    """A large request short of room: the first stage waits for the streams and returns the small pool's free
    segments, oldest first, until the request's size is released; the large pool's own free memory is kept, no
    second stage runs."""
    alloc = Allocator(SimDriver(capacity=GiB), PaperPolicy(stitch=False))
    free_small_segments(alloc, 8)                        # small: 8 free segments of 2 MiB, serials 1-8
    fragment(alloc, [4])                                 # large: a free 4 MiB segment (too small to serve 8 MiB)
    assert alloc.stats()["reserved_bytes"] == 22 * MiB
    alloc.set_limit(26 * MiB)
    syncs = alloc.stats()["calls"]["synchronize"]
    alloc.malloc(8 * MiB)                                # 4 MiB of room: pressure
    after = pools(alloc)
    assert [s[0] for s in after["small"]] == [5, 6, 7, 8]          # 1-4 released: 8 MiB, the request's size
    assert (9, 4 * MiB, 4 * MiB) in after["large"]                 # the large pool's free segment kept
    stats = alloc.stats()
    assert stats["chunks_released"] == 4 and stats["reserved_bytes"] == 22 * MiB
    assert stats["calls"]["synchronize"] == syncs + 1               # one stage, one wait for the streams
    alloc.check()


def test_stage_0_for_a_small_request_releases_the_large_pool_and_keeps_the_small_pool():
    alloc = Allocator(SimDriver(capacity=GiB), PaperPolicy(stitch=False))
    small = [alloc.malloc(1 * MiB) for _ in range(2)]   # one small segment, full
    fragment(alloc, [4, 4, 4])                           # large: three free 4 MiB blocks (serials 2, 4, 6)
    free_small_segments(alloc, 1)                        # small: one free segment (serial 8)
    reserved = alloc.stats()["reserved_bytes"]
    alloc.set_limit(reserved)
    alloc.free(small[0])
    alloc.malloc(1 * MiB)                                # served from its own free half: no pressure
    assert alloc.stats()["chunks_released"] == 0
    alloc.malloc(1 * MiB)                                # the free small segment serves it: still none
    alloc.malloc(1 * MiB)
    alloc.malloc(1 * MiB)                                # the small pool is full: pressure
    after = pools(alloc)
    # the oldest free large block goes back (its free chunks in one unmap), which makes room: the others stay
    assert [s[0] for s in after["large"] if s[2]] == [4, 6] and 2 not in [s[0] for s in after["large"]]
    assert [s[0] for s in after["small"]] == [1, 8, 9] and alloc.stats()["chunks_released"] == 2
    alloc.check()


def test_stage_1_releases_the_small_pool_then_evicts_lru_first_then_returns_large_chunks():
    """When the first stage is not enough: everything free goes back, the small pool's first (it is gone by the
    first eviction), then the cached sBlocks, least recently used first, each asked of evict_victim under
    "pressure", then the large pool's free chunks; the request is then served."""
    policy = Watched(no_stitch_for=30 * MiB)
    alloc = Allocator(SimDriver(capacity=GiB), policy)
    free_small_segments(alloc, 4)                        # 8 MiB in the small pool
    fragment(alloc, [4, 4, 4])
    alloc.free(alloc.malloc(12 * MiB))                   # an older cached sBlock
    fragment(alloc, [4, 4, 4])
    alloc.free(alloc.malloc(12 * MiB))                   # a newer one
    before = alloc.stats()
    assert before["cached_sblocks"] == 2 and before["reserved_bytes"] == 32 * MiB
    live = before["allocated_bytes"]
    Watched.evictions.clear()
    alloc.set_limit(live + 30 * MiB)                     # the request fits only once every free byte is back
    alloc.malloc(30 * MiB)
    (first, second) = Watched.evictions
    assert first[0] == second[0] == "pressure"
    assert len(first[1]) == 2 and second[1] == first[1][1:]        # oldest first, one at a time
    assert first[2] == second[2] == 24 * MiB                       # the small pool's 8 MiB already back, no chunk
    after = alloc.stats()
    assert after["sblock_evictions"] == 2 and after["cached_sblocks"] == 0 and not pools(alloc)["small"]
    assert after["chunks_released"] == 10                          # 4 small, 6 large (12 MiB free)
    assert after["reserved_bytes"] == live + 30 * MiB
    alloc.check()


def test_stage_1_is_not_reached_when_stage_0_was_enough():
    """The same state, a request the small pool's memory alone makes room for: no eviction, the large pool's free
    chunks stay."""
    policy = Watched(no_stitch_for=14 * MiB)
    alloc = Allocator(SimDriver(capacity=GiB), policy)
    free_small_segments(alloc, 4)
    fragment(alloc, [4, 4, 4])
    alloc.free(alloc.malloc(12 * MiB))
    Watched.evictions.clear()
    reserved = alloc.stats()["reserved_bytes"]
    alloc.set_limit(reserved - 8 * MiB + 14 * MiB)       # room once the small pool's 8 MiB is back
    alloc.malloc(14 * MiB)
    assert Watched.evictions == [] and alloc.stats()["cached_sblocks"] == 1
    assert not pools(alloc)["small"] and alloc.stats()["chunks_released"] == 4
    alloc.check()


def test_pytorchs_rule_releases_both_pools_at_the_first_stage():
    """Without cross_stream (PyTorch's rule) the first stage already waits and returns every free segment of both
    pools."""
    alloc = Allocator(SimDriver(capacity=GiB), PaperPolicy(stitch=False, cross_stream=False))
    free_small_segments(alloc, 2)
    fragment(alloc, [4])
    reserved = alloc.stats()["reserved_bytes"]           # 4 small + 6 large
    alloc.set_limit(reserved + 2 * MiB)
    syncs = alloc.stats()["calls"]["synchronize"]
    alloc.malloc(6 * MiB)                                # 2 MiB of room; the small pool alone would make 6
    assert not pools(alloc)["small"] and alloc.stats()["chunks_released"] == 4
    assert alloc.stats()["calls"]["synchronize"] == syncs + 1
    alloc.check()


def test_a_policys_actions_stop_being_asked_once_the_request_fits():
    asked = []

    @dataclass(frozen=True)
    class Steps(PaperPolicy):
        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            asked.append((attempt, state.reserved))
            return ("sync", "release_other_pool", "release_all", "release_all")[attempt]

    alloc = Allocator(SimDriver(capacity=GiB), Steps(stitch=False))
    free_small_segments(alloc, 4)
    fragment(alloc, [4])
    alloc.set_limit(alloc.stats()["reserved_bytes"])
    alloc.malloc(6 * MiB)                                # "sync" frees nothing; "release_other_pool" is enough
    assert [a for a, _ in asked] == [0, 1]
    assert asked[1][1] == asked[0][1]                    # sync released nothing
    assert [s[0] for s in pools(alloc)["small"]] == [4] and pools(alloc)["large"][0][2] == 4 * MiB
    alloc.check()


def test_release_all_returns_the_small_pool_before_evicting_then_the_large_pools_chunks():
    """"release_all" (the built-in second stage, or a policy's first): the small pool's free segments go first,
    then the cached sBlocks (least recently used first), then the large pool's free chunks."""

    @dataclass(frozen=True)
    class AllAtOnce(Watched):
        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            return "release_all"

    alloc = Allocator(SimDriver(capacity=GiB), AllAtOnce(no_stitch_for=30 * MiB))
    free_small_segments(alloc, 4)
    fragment(alloc, [4, 4, 4])
    alloc.free(alloc.malloc(12 * MiB))
    before = alloc.stats()
    Watched.evictions.clear()
    alloc.set_limit(before["allocated_bytes"] + 30 * MiB)
    alloc.malloc(30 * MiB)
    ((reason, cached, reserved),) = Watched.evictions
    assert reason == "pressure" and len(cached) == 1
    assert reserved == before["reserved_bytes"] - 8 * MiB       # the small pool's 8 MiB back, no large chunk yet
    assert alloc.stats()["chunks_released"] == 4 + 6
    alloc.check()
