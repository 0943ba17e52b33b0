"""The allocator core's rules, on the sim and host drivers."""
import os
import threading

import pytest
from conftest import snapshot

import gmlake
from gmlake import Allocator, InvalidPointerError, OutOfMemoryError

# These tests exercise the chunk-and-stitch mechanics, so they run the paper's design, where every request
# past the free blocks stitches; the default policy's own tests are in test_gmlake_policy.py.
PAPER = gmlake.policies.get("gmlake-paper")

MiB = 1 << 20
KiB = 1 << 10


def test_exact_fit_reuses_the_freed_block(driver):
    alloc = Allocator(driver, PAPER)
    p = alloc.malloc(10 * MiB)
    alloc.free(p)
    assert alloc.malloc(10 * MiB) == p
    assert alloc.stats()["segments_created"] == 1


def test_best_fit_then_split(driver):
    alloc = Allocator(driver, PAPER)
    big = alloc.malloc(20 * MiB)
    small = alloc.malloc(8 * MiB)
    alloc.free(big)
    alloc.free(small)
    p = alloc.malloc(6 * MiB)        # best fit is the 8 MiB block, split
    assert p == small
    q = alloc.malloc(2 * MiB)        # the 2 MiB remainder of it
    assert q == small + 6 * MiB
    alloc.check()


def test_requests_pack_at_512_bytes_below_chunk_level(driver):
    alloc = Allocator(driver, PAPER)
    a = alloc.malloc(2 * MiB + 1)
    b = alloc.malloc(100 * KiB)              # small pool
    assert alloc.block_size(a) == 2 * MiB + 512
    c = alloc.malloc(MiB + 100 * KiB)        # large: lands in the 4 MiB segment's free tail
    assert c == a + 2 * MiB + 512
    stats = alloc.stats()
    assert stats["reserved_bytes"] == 4 * MiB + 2 * MiB   # one large segment, one small
    for p in (a, b, c):
        alloc.free(p)
    alloc.check()


def test_small_requests_share_a_2mib_segment(driver):
    alloc = Allocator(driver, PAPER)
    ptrs = [alloc.malloc(100 * KiB) for _ in range(20)]
    assert alloc.stats()["reserved_bytes"] == 2 * MiB
    assert len(set(ptrs)) == 20
    assert all(alloc.block_size(p) == 100 * KiB for p in ptrs)
    for p in ptrs:
        alloc.free(p)
    alloc.check()


def test_stitch_instead_of_growing(driver):
    alloc = Allocator(driver, PAPER)
    parts = [alloc.malloc(8 * MiB) for _ in range(4)]
    for p in parts:
        alloc.free(p)
    reserved = alloc.stats()["reserved_bytes"]
    p = alloc.malloc(30 * MiB)
    stats = alloc.stats()
    assert stats["reserved_bytes"] == reserved
    assert stats["stitches"] == 1
    assert stats["stitched_handles"] == 15
    alloc.free(p)
    # The same request again reuses the cached sBlock: no driver calls at all.
    calls = sum(alloc.stats()["calls"].values())
    assert alloc.malloc(30 * MiB) == p
    stats = alloc.stats()
    assert stats["sblock_reuses"] == 1 and sum(stats["calls"].values()) == calls
    alloc.check()


def test_shortfall_only_is_allocated(driver):
    alloc = Allocator(driver, PAPER)
    a = alloc.malloc(10 * MiB)
    alloc.free(a)
    p = alloc.malloc(16 * MiB)
    stats = alloc.stats()
    assert stats["reserved_bytes"] == 16 * MiB     # 10 free + 6 new, not 10 + 16
    assert stats["stitches"] == 1
    alloc.free(p)
    alloc.check()


def test_sblock_is_not_reused_while_a_piece_is_busy(driver):
    alloc = Allocator(driver, PAPER)
    parts = [alloc.malloc(8 * MiB) for _ in range(2)]
    for p in parts:
        alloc.free(p)
    s = alloc.malloc(16 * MiB)
    alloc.free(s)
    q = alloc.malloc(8 * MiB)   # takes a primitive block under the sBlock
    assert q in parts
    t = alloc.malloc(16 * MiB)  # cannot reuse the sBlock: one of its pieces is live
    assert t != s
    alloc.check()
    for p in (q, t):
        alloc.free(p)
    alloc.check()


def test_cap_gives_clean_oom_and_allocator_recovers(driver):
    alloc = Allocator(driver, PAPER, limit=64 * MiB)
    held = [alloc.malloc(20 * MiB) for _ in range(3)]
    with pytest.raises(OutOfMemoryError) as info:
        alloc.malloc(10 * MiB)
    err = info.value
    assert err.requested == 10 * MiB and err.limit == 64 * MiB
    assert err.allocated == 60 * MiB and err.reserved == 60 * MiB
    assert "out of memory" in str(err) and "cap 64.00 MiB" in str(err)
    alloc.check()
    alloc.free(held.pop())
    p = alloc.malloc(10 * MiB)
    alloc.free(p)
    alloc.check()


def test_pressure_releases_small_pool_for_large(driver):
    alloc = Allocator(driver, PAPER, limit=8 * MiB)
    smalls = [alloc.malloc(512 * KiB) for _ in range(12)]   # three 2 MiB small segments
    for p in smalls:
        alloc.free(p)
    p = alloc.malloc(8 * MiB)     # needs the small segments given back
    assert alloc.stats()["reserved_bytes"] == 8 * MiB
    alloc.free(p)
    alloc.check()


def test_pressure_releases_large_chunks_for_small(driver):
    alloc = Allocator(driver, PAPER, limit=8 * MiB)
    p = alloc.malloc(8 * MiB)
    alloc.free(p)
    q = alloc.malloc(4 * KiB)
    assert alloc.stats()["reserved_bytes"] <= 8 * MiB
    alloc.free(q)
    alloc.check()


def test_empty_cache_returns_everything_free(driver):
    alloc = Allocator(driver, PAPER)
    keep = alloc.malloc(3 * MiB)
    ptrs = [alloc.malloc(s * MiB) for s in (5, 7, 9)]
    small = alloc.malloc(1000)
    for p in ptrs:
        alloc.free(p)
    stitched = alloc.malloc(20 * MiB)
    alloc.free(stitched)
    alloc.free(small)
    alloc.empty_cache()
    alloc.check()
    stats = alloc.stats()
    assert stats["cached_sblocks"] == 0 and stats["sblock_va_bytes"] == 0
    assert stats["reserved_bytes"] == 4 * MiB          # keep's two chunks (3 MiB + 512 B needs both)
    assert driver.live_chunk_bytes == 4 * MiB
    alloc.free(keep)
    alloc.close()
    assert driver.leaks() == {k: 0 for k in driver.leaks()}


def test_empty_cache_releases_free_chunks_inside_a_busy_segment(driver):
    alloc = Allocator(driver, PAPER)
    a = alloc.malloc(20 * MiB)
    alloc.free(a)
    head = alloc.malloc(3 * MiB)          # splits the 20 MiB block: 17 MiB stays free
    alloc.empty_cache()
    alloc.check()
    assert alloc.stats()["reserved_bytes"] == 4 * MiB
    # The hole is never handed out, and new memory still works.
    p = alloc.malloc(10 * MiB)
    alloc.check()
    alloc.free(p)
    alloc.free(head)
    alloc.close()


@pytest.mark.parametrize("size", [0, -1, -(1 << 40)])
def test_bad_size_is_refused_and_changes_nothing(driver, size):
    alloc = Allocator(driver, PAPER)
    p = alloc.malloc(5 * MiB)
    before = snapshot(alloc)
    with pytest.raises(ValueError):
        alloc.malloc(size)
    assert snapshot(alloc) == before
    alloc.free(p)


def test_non_int_size_is_refused(driver):
    alloc = Allocator(driver, PAPER)
    with pytest.raises(TypeError):
        alloc.malloc(1.5)
    with pytest.raises(TypeError):
        alloc.malloc(True)


def test_size_over_cap_is_refused_and_changes_nothing(driver):
    """Nothing but the out-of-memory count, which memory_stats' num_ooms reports as PyTorch's allocator does."""
    alloc = Allocator(driver, PAPER, limit=32 * MiB)
    p = alloc.malloc(5 * MiB)
    q = alloc.malloc(5 * MiB)
    alloc.free(q)
    before = snapshot(alloc)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(33 * MiB)
    after = snapshot(alloc)
    assert after[0]["ooms"] == before[0]["ooms"] + 1
    after[0]["ooms"] = before[0]["ooms"]
    assert after == before
    alloc.free(p)


def test_double_free_is_refused_and_changes_nothing(driver):
    alloc = Allocator(driver, PAPER)
    p = alloc.malloc(5 * MiB)
    q = alloc.malloc(5 * MiB)
    alloc.free(p)
    before = snapshot(alloc)
    with pytest.raises(InvalidPointerError, match="double free"):
        alloc.free(p)
    assert snapshot(alloc) == before
    alloc.free(q)


@pytest.mark.parametrize("offset", [1, 512, 3 * MiB])
def test_free_of_foreign_address_is_refused(driver, offset):
    alloc = Allocator(driver, PAPER)
    p = alloc.malloc(5 * MiB)
    before = snapshot(alloc)
    with pytest.raises(InvalidPointerError):
        alloc.free(p + offset)
    with pytest.raises(InvalidPointerError):
        alloc.free(0)
    with pytest.raises(InvalidPointerError):
        alloc.free("0x1000")
    assert snapshot(alloc) == before


def test_negative_stream_is_refused(driver):
    alloc = Allocator(driver, PAPER)
    with pytest.raises(ValueError):
        alloc.malloc(10, stream=-1)


def test_same_stream_reuse_is_immediate_other_stream_waits_for_events():
    drv = gmlake.HostDriver()
    drv.auto_complete = False
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(6 * MiB, stream=7)
    alloc.free(p)
    assert alloc.malloc(6 * MiB, stream=7) == p     # same stream: at once
    alloc.free(p)
    q = alloc.malloc(6 * MiB, stream=8)             # stream 7's kernels may still use p
    assert q != p
    assert alloc.stats()["calls"]["event_record"] == 1
    alloc.free(q)
    drv.complete_stream(7)
    r = alloc.malloc(6 * MiB, stream=9)
    assert r == p
    alloc.free(r)
    alloc.check()


def test_pressure_waits_for_other_streams():
    drv = gmlake.HostDriver()
    drv.auto_complete = False
    alloc = Allocator(drv, PAPER, limit=8 * MiB)
    p = alloc.malloc(8 * MiB, stream=1)
    alloc.free(p)
    q = alloc.malloc(8 * MiB, stream=2)       # only possible after synchronizing
    assert q == p
    assert alloc.stats()["calls"]["synchronize"] >= 1
    alloc.free(q)
    alloc.check()


def test_lru_bound_on_cached_sblocks(driver):
    policy = gmlake.policies.get("gmlake-paper", max_cached_sblocks=2)
    alloc = Allocator(driver, policy)
    for size in (9, 11, 13, 15):
        parts = [alloc.malloc(4 * MiB) for _ in range(4)]
        for p in parts:
            alloc.free(p)
        s = alloc.malloc(size * MiB)
        alloc.free(s)
        assert alloc.stats()["cached_sblocks"] <= 2
    assert alloc.stats()["sblock_evictions"] >= 1
    alloc.check()


def test_stitching_can_be_turned_off(driver):
    alloc = Allocator(driver, gmlake.policies.get("gmlake-paper", stitch=False))
    a = alloc.malloc(8 * MiB)
    b = alloc.malloc(8 * MiB)
    alloc.free(a)
    alloc.free(b)
    alloc.malloc(12 * MiB)
    assert alloc.stats()["stitches"] == 0
    assert alloc.stats()["reserved_bytes"] == 28 * MiB


# (handle size, handles the 150 MiB stitch maps): every handle costs driver time, so larger handles stitch cheaper.
@pytest.mark.parametrize("chunk_mib,handles", [(2, 75), (4, 38), (20, 8)])
def test_handle_size_is_a_policy_choice(driver, chunk_mib, handles):
    alloc = Allocator(driver, gmlake.policies.get("gmlake-paper", chunk_size=chunk_mib * MiB))
    ptrs = [alloc.malloc(s * MiB) for s in (40, 60, 80)]
    for p in ptrs:
        alloc.free(p)
    s = alloc.malloc(150 * MiB)
    stats = alloc.stats()
    assert stats["stitches"] == 1
    assert stats["stitched_handles"] == handles
    assert stats["reserved_bytes"] == 180 * MiB
    alloc.free(s)
    alloc.check()


def test_bad_policy_is_refused(driver):
    with pytest.raises(ValueError, match="granularity"):
        Allocator(driver, gmlake.policies.get("gmlake-paper", chunk_size=3 * MiB))
    with pytest.raises(ValueError, match="unknown policy"):
        gmlake.policies.get("nope")
    with pytest.raises(TypeError):
        Allocator(driver, policy="gmlake")


def test_peaks_reset(driver):
    alloc = Allocator(driver, PAPER)
    p = alloc.malloc(40 * MiB)
    alloc.free(p)
    assert alloc.stats()["peak_allocated_bytes"] >= 40 * MiB
    alloc.reset_peak_stats()
    stats = alloc.stats()
    assert stats["peak_allocated_bytes"] == 0
    assert stats["peak_reserved_bytes"] == stats["reserved_bytes"]


def threads_share_one_allocator() -> None:
    """8 threads malloc, fill, check and free through one allocator on real memory."""
    drv = gmlake.HostDriver()
    alloc = Allocator(drv, PAPER)
    import ctypes
    import random

    errors = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        live = []
        try:
            for _ in range(400):
                if live and rng.random() < 0.5:
                    p, n, v = live.pop(rng.randrange(len(live)))
                    if ctypes.string_at(p, n) != bytes([v]) * n:
                        errors.append("corrupted")
                    alloc.free(p)
                else:
                    n = rng.choice([rng.randint(1, 64 * KiB), rng.randint(1, 6 * MiB)])
                    p = alloc.malloc(n, stream=seed % 2)
                    ctypes.memset(p, seed + 1, n)
                    live.append((p, n, seed + 1))
            for p, n, v in live:
                if ctypes.string_at(p, n) != bytes([v]) * n:
                    errors.append("corrupted")
                alloc.free(p)
        except Exception as exc:  # noqa: BLE001  # pragma: no cover - whatever fails in a thread is reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    alloc.check()
    alloc.close()
    assert drv.live_chunks == 0


def test_threads_share_one_allocator_safely():
    # In a child process: a core bug that hands out too small a block makes the fill crash the process, which
    # then fails this test with its output instead of killing the whole run.
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent), str(here)]))
    child = subprocess.run([sys.executable, "-c", "import test_allocator; test_allocator.threads_share_one_allocator()"],
                           cwd=here, env=env, capture_output=True, check=False, text=True, timeout=300)
    assert child.returncode == 0, f"exit status {child.returncode}:\n{child.stderr[-3000:]}"


@pytest.mark.parametrize("make", [gmlake.SimDriver, gmlake.HostDriver])
def test_events_are_recorded_again_instead_of_made_anew(make):
    """Note [Reusing events]: a steady state of record_stream frees records an event per free but makes no new one
    after the first few; empty_cache destroys the spares."""
    drv = make()
    drv.auto_complete = False
    alloc = Allocator(drv)
    for _ in range(50):
        p = alloc.malloc(6 * MiB, stream=1)
        alloc.record_stream(p, 2)
        alloc.free(p)                               # pending until stream 2's event is done
        drv.complete_stream(2)                      # the next malloc finds it done and keeps the event
    assert alloc.stats()["calls"]["event_record"] == 50
    assert drv.created_events == 1                  # one event, recorded 50 times
    alloc.free(alloc.malloc(4096, stream=1))        # retires the last free: its event becomes the spare
    assert alloc.spares["events"] == 1 and drv.leaks()["events"] == 1
    alloc.check()
    alloc.empty_cache()
    assert alloc.spares["events"] == 0 and drv.leaks()["events"] == 0
    alloc.close()


def test_a_spare_event_the_driver_refuses_to_record_is_dropped_and_the_free_still_waits():
    drv = gmlake.HostDriver()
    drv.auto_complete = False
    alloc = Allocator(drv)
    p = alloc.malloc(6 * MiB, stream=1)
    alloc.record_stream(p, 2)
    alloc.free(p)
    drv.complete_stream(2)
    alloc.free(alloc.malloc(4096, stream=1))        # retires p, keeping its event
    assert alloc.spares["events"] == 1 and drv.created_events == 1
    q = alloc.malloc(6 * MiB, stream=1)
    alloc.record_stream(q, 2)
    drv.inject_fault("event_record")
    alloc.free(q)                                   # the spare's record fails: it is destroyed, the free synchronizes
    assert alloc.spares["events"] == 0 and drv.leaks()["events"] == 0
    assert alloc.stats()["pending_frees"] == 0      # waited for the device instead of an event
    alloc.check()
    alloc.close()
    assert set(drv.leaks().values()) == {0}


def test_record_stream_defers_reuse_until_the_other_stream_is_done():
    drv = gmlake.HostDriver()
    drv.auto_complete = False
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(6 * MiB, stream=1)
    alloc.record_stream(p, 2)
    alloc.record_stream(p, 2)                       # idempotent
    alloc.record_stream(p, 1)                       # its own stream: nothing to wait for
    alloc.free(p)
    stats = alloc.stats()
    assert stats["pending_frees"] == 1 and stats["allocated_bytes"] == 0
    assert stats["active_bytes"] == 6 * MiB          # still in use by stream 2's queued work
    q = alloc.malloc(6 * MiB, stream=1)
    assert q != p, "memory stream 2 may still be reading was handed out"
    alloc.check()
    drv.complete_stream(2)
    alloc.free(q)
    r = alloc.malloc(6 * MiB, stream=1)             # the event completed: p's memory is back
    assert alloc.stats()["pending_frees"] == 0
    assert r in (p, q)
    alloc.free(r)
    alloc.check()
    with pytest.raises(InvalidPointerError):
        alloc.record_stream(r, 3)                   # no longer live


@pytest.mark.parametrize("policy", ["gmlake", "gmlake-paper"])
def test_pending_frees_retire_as_soon_as_their_events_complete(policy):
    """Note [Polling pending frees]: a pass stops at a stream's first incomplete event, so the pending frees must be
    walked in the order they were made. Frees A, B, C wait on stream 2; once A's and then B's events complete, each
    is retired at the next request, although C's event, later on the same stream, is still incomplete."""
    drv = gmlake.SimDriver()
    drv.auto_complete = False
    alloc = Allocator(drv, gmlake.policies.get(policy))
    blocks = [alloc.malloc(6 * MiB, stream=1) for _ in range(3)]
    tickets = []
    for p in blocks:
        alloc.record_stream(p, 2)
        alloc.free(p)                                # records an event on stream 2
        tickets.append(drv.queued(2))
    assert alloc.stats()["pending_frees"] == 3
    for done, (ticket, left) in enumerate(zip(tickets[:2], (2, 1))):
        drv.complete_stream(2, ticket)
        alloc.free(alloc.malloc(4096, stream=1))     # any request polls the pending frees
        assert alloc.stats()["pending_frees"] == left, f"free {done} completed but was kept pending"
    alloc.check()
    drv.complete_stream(2)
    alloc.free(alloc.malloc(4096, stream=1))
    assert alloc.stats()["pending_frees"] == 0
    alloc.close()


def test_a_busy_stream_does_not_hold_back_another_streams_frees():
    """A pass stops early only once every stream with pending events has an incomplete one: frees waiting on a
    stream whose work is done retire even behind many frees waiting on a busy stream."""
    drv = gmlake.SimDriver()
    drv.auto_complete = False
    alloc = Allocator(drv, gmlake.policies.get("gmlake"))
    alloc.debug_checks = True                        # the per-stream count is checked inside every operation
    for stream in (2,) * 50 + (3,):
        p = alloc.malloc(2 * MiB, stream=1)
        alloc.record_stream(p, stream)
        alloc.free(p)
    drv.complete_stream(3)
    alloc.free(alloc.malloc(4096, stream=1))
    assert alloc.stats()["pending_frees"] == 50
    drv.complete_stream(2, drv.queued(2) - 10)       # the 40 oldest of stream 2
    alloc.free(alloc.malloc(4096, stream=1))
    assert alloc.stats()["pending_frees"] == 10
    alloc.check()
    alloc.close()


def test_empty_cache_waits_for_pending_frees():
    drv = gmlake.HostDriver()
    drv.auto_complete = False
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(6 * MiB, stream=1)
    alloc.record_stream(p, 5)
    alloc.free(p)
    alloc.empty_cache()                             # synchronizes: the pending free completes, memory goes back
    assert alloc.stats()["pending_frees"] == 0 and alloc.stats()["reserved_bytes"] == 0
    alloc.close()
    assert drv.leaks() == {k: 0 for k in drv.leaks()}


def test_capture_queries_are_asked_only_where_a_driver_call_may_follow():
    """Note [Unannounced capture]: a cache hit asks nothing; a request that grows asks once; while a record_stream free
    is pending, every request polls events and so asks once; the count is in stats()["capture_queries"]."""
    drv = gmlake.HostDriver()
    drv.auto_complete = False
    alloc = Allocator(drv)
    p = alloc.malloc(6 * MiB, stream=1)                 # growth: one question
    assert alloc.stats()["capture_queries"] == 1
    alloc.free(p)
    for _ in range(5):                                  # cache hits: none
        alloc.free(alloc.malloc(6 * MiB, stream=1))
    assert alloc.stats()["capture_queries"] == 1
    q = alloc.malloc(4 * MiB, stream=1)
    alloc.record_stream(q, 2)
    alloc.free(q)                                       # deferred until stream 2's work is done
    assert alloc.stats()["pending_frees"] == 1
    for _ in range(3):
        alloc.free(alloc.malloc(1 * MiB, stream=1))
    assert alloc.stats()["capture_queries"] == 4
    drv.complete_stream(2)
    alloc.free(alloc.malloc(1 * MiB, stream=1))         # this poll retires the pending free
    assert alloc.stats()["pending_frees"] == 0 and alloc.stats()["capture_queries"] == 5
    alloc.free(alloc.malloc(1 * MiB, stream=1))
    assert alloc.stats()["capture_queries"] == 5
    alloc.close()


def test_the_hot_path_reuses_its_blocks_and_nodes_and_keeps_at_most_64(driver):
    """Note [Reusing nodes on the hot path]: a malloc + free that splits and merges takes its Block and container
    nodes from the spares and gives them back, so a steady state allocates nothing; a burst keeps 64 of each."""
    alloc = Allocator(driver)
    alloc.debug_checks = True
    alloc.free(alloc.malloc(4096))
    settled = alloc.spares
    assert settled["blocks"] >= 1 and settled["address_nodes"] >= 1 and settled["live_nodes"] >= 1
    for _ in range(100):
        alloc.free(alloc.malloc(4096))
    assert alloc.spares == settled
    burst = [alloc.malloc(4096) for _ in range(200)]
    assert alloc.spares["blocks"] == 0 and alloc.spares["address_nodes"] == 0     # every split took one
    for p in burst:
        alloc.free(p)
    after = alloc.spares
    assert after["blocks"] == after["address_nodes"] == after["live_nodes"] == 64
    assert after["free_index_nodes"] <= 64
    assert alloc.stats()["allocated_bytes"] == 0
    alloc.close()
