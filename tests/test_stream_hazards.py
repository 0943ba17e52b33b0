"""Stream-ordering bugs, caught on the CPU.

The modelled drivers queue kernels per stream and run them only when the test completes a stream (tests/streams.py
drives the allocator the way PyTorch would). Memory handed to one stream while another stream's queued work still
touches it, an unmap under queued work, or a release of a still-mapped handle is a hazard: these tests fail on
exactly the bugs that corrupt data only on a GPU. Each scenario below pins one such bug class down
deterministically; the state machines in test_state_machine.py search for the rest.
"""
from __future__ import annotations

import random

import pytest
from streams import StreamHarness

import gmlake
from gmlake import HostDriver, SimDriver
from gmlake.core.errors import HazardError

MiB = 1 << 20
# The scenarios below stitch and hand blocks across streams at once, as the paper's policy does (the harness's
# default); the state machines run every policy, the default included.


@pytest.fixture(params=["sim", "host"])
def harness_driver(request):
    return SimDriver() if request.param == "sim" else HostDriver()


# ---------------------------------------------------------------- the model itself


def test_a_kernel_on_memory_another_stream_still_uses_is_a_hazard(harness_driver):
    h = StreamHarness(harness_driver)
    p = h.malloc(4 * MiB, stream=0)
    with pytest.raises(HazardError, match="stream-ordering hazard: stream 1 was handed handle"):
        harness_driver.launch(1, p, 4096, write=7)
    harness_driver.complete_stream(0)
    harness_driver.launch(1, p, 4096, write=7)          # stream 0's work is done: no race any more
    harness_driver.complete_all()


def test_reads_on_two_streams_do_not_race_and_an_event_wait_orders_a_write(harness_driver):
    h = StreamHarness(harness_driver)
    p = h.malloc(4 * MiB, stream=0)
    h.use_on(p, 1)                                       # waits for stream 0's write
    harness_driver.launch(2, p, 4 * MiB, expect=h.live[p].value, after=(0,))
    harness_driver.launch(3, p, 4 * MiB, write=9, after=(0, 1, 2))
    h.driver.complete_all()
    h.verify()


def test_kernels_write_when_they_run_not_when_queued():
    driver = HostDriver()
    h = StreamHarness(driver)
    p = h.malloc(2 * MiB, stream=0)
    import ctypes

    assert ctypes.string_at(p, 16) == bytes(16)          # the write is queued, not done
    h.complete(0)
    assert ctypes.string_at(p, 16) == bytes([h.live[p].value]) * 16
    h.close()


def test_an_overwritten_block_is_reported_when_its_check_runs():
    driver = HostDriver()
    h = StreamHarness(driver)
    p = h.malloc(2 * MiB, stream=0)
    h.complete(0)
    driver.launch(0, p, 4096, write=250)                 # a stray kernel on the owner's own stream
    h.free(p)
    driver.complete_stream(0)
    with pytest.raises(HazardError, match="data race: .* expected its bytes to hold"):
        driver.check_hazards()


def test_hazards_are_judged_on_physical_memory_through_an_sblock(harness_driver):
    """A stitched block maps the same handles as its pieces: a kernel through the sBlock's VA races with one through
    a piece's home VA."""
    h = StreamHarness(harness_driver)
    a, b = h.malloc(8 * MiB, 0), h.malloc(8 * MiB, 0)
    home = a
    h.free(a)
    h.free(b)
    h.complete(0)
    big = h.malloc(16 * MiB, 0)
    assert h.alloc.stats()["stitches"] == 1
    phys = {e[0] for e in harness_driver.physical(big, 16 * MiB)}
    assert {e[0] for e in harness_driver.physical(home, 8 * MiB)} <= phys
    with pytest.raises(HazardError, match="stream-ordering hazard"):
        harness_driver.launch(1, home, 4096, write=3)


def test_the_model_refuses_releasing_a_mapped_handle_unmapping_under_work_and_freeing_mapped_va():
    from gmlake.core._driver import StreamModel

    model = StreamModel(SimDriver())
    model.on_map(0x10000, 0x1000, 7)
    model.on_map(0x20000, 0x1000, 7)                    # one handle in two ranges, as an sBlock maps it
    model.launch(0, 1, 0x20000, 0x100, 5, None, {}, "k")
    assert "still mapped at 0x10000, 0x20000" in model.on_release(7)
    assert "address free of 0x10000+4096 while a handle is still mapped" in model.on_free_va(0x10000, 0x1000)
    assert model.on_unmap(0x10000, 0x1000) is None       # no queued work on this VA
    assert "unmap of 0x20000+4096 with no synchronize since stream 0's queued kernel #1" in model.on_unmap(0x20000, 0x1000)
    model.run_until(0, 1)
    assert model.on_unmap(0x20000, 0x1000) is None
    assert model.on_release(7) is None and model.on_free_va(0x10000, 0x1000) is None


def test_empty_cache_synchronizes_before_it_unmaps():
    from gmlake import Allocator

    driver = SimDriver()
    driver.track_hazards()
    alloc = Allocator(driver, gmlake.policies.get("gmlake-paper"))
    p = alloc.malloc(4 * MiB, 0)
    driver.launch(0, p, 4 * MiB, write=1)
    alloc.free(p)
    alloc.empty_cache()
    driver.check_hazards()
    assert driver.pending_kernels() == 0 and alloc.stats()["reserved_bytes"] == 0
    alloc.close()


def test_hazard_tracking_is_off_by_default_and_needs_a_fresh_driver():
    driver = SimDriver()
    assert driver.hazards == []
    with pytest.raises(RuntimeError, match="track_hazards"):
        driver.launch(0, 1 << 44, 16)
    alloc = gmlake.Allocator(driver)
    p = alloc.malloc(MiB)
    with pytest.raises(RuntimeError, match="before the driver hands anything out"):
        driver.track_hazards()
    alloc.free(p)
    alloc.close()


def test_partial_completion_runs_only_the_work_queued_up_to_the_ticket(harness_driver):
    h = StreamHarness(harness_driver)
    p = h.malloc(4 * MiB, 0)
    mark = harness_driver.queued(0)
    q = h.malloc(4 * MiB, 0)
    h.complete(0, upto=mark)
    assert harness_driver.pending_kernels(0) == 1
    harness_driver.launch(1, p, 4096, write=5)           # p's writer has run
    with pytest.raises(HazardError):
        harness_driver.launch(1, q, 4096, write=5)       # q's has not


# ---------------------------------------------------------------- one scenario per bug class


def test_blocks_freed_on_a_stream_wait_for_its_work_before_another_stream_gets_them(harness_driver):
    """Best fit must respect the stream boundary: stream 1 may not get stream 0's freed block while stream 0's last
    kernel on it is queued."""
    h = StreamHarness(harness_driver)
    for size in (4 * MiB, 512 * 1024):                 # the large pool and the small pool
        p = h.malloc(size, 0)
        h.free(p)
        q = h.malloc(size, 1)
        assert q is not None
    h.close()


def test_a_fence_covers_only_the_frees_before_it(harness_driver):
    """A completed fence on stream 0 frees for other streams only what stream 0 freed before the fence was
    recorded; a block freed after it still has queued work."""
    h = StreamHarness(harness_driver)
    x = h.malloc(8 * MiB, 0)
    h.free(x)
    y = h.malloc(8 * MiB, 1)         # stream 0's block is not free for stream 1 yet: a fence is recorded on 0
    fence = harness_driver.queued(0)
    z = h.malloc(8 * MiB, 0)         # stream 0 takes its block back ...
    assert z == x
    h.free(z)                        # ... and frees it again after the fence, with its last use queued
    h.complete(0, upto=fence)        # the fence completes, the later work does not
    w = h.malloc(8 * MiB, 1)         # must not get x's block
    assert w not in (x, y)
    h.free(w)
    h.free(y)
    h.close()


def test_free_neighbours_of_different_streams_are_not_merged(harness_driver):
    """Coalescing merges only free neighbours of one stream: a block freed on stream 0 next to one freed on
    stream 1 must not become one block that either stream can take while the other's work is queued."""
    h = StreamHarness(harness_driver)
    seg = h.malloc(16 * MiB, 0)
    h.free(seg)
    h.complete(0)
    first = h.malloc(8 * MiB, 1)      # fences stream 0; new memory for stream 1
    h.complete(0)
    a = h.malloc(8 * MiB, 1)          # the fence is done: stream 0's 16 MiB serves any stream; stream 1 takes its head
    b = h.malloc(8 * MiB, 0)          # and stream 0 its tail
    assert b == a + 8 * MiB, "the scenario needs the two blocks side by side"
    h.free(a)                         # freed on stream 1, last use queued
    h.free(b)                         # freed on stream 0 next to it, last use queued
    for stream in (0, 1):
        c = h.malloc(16 * MiB, stream)
        if c is not None:
            h.free(c)
    h.free(first)
    h.close()


def test_a_cached_sblock_waits_for_its_pieces_stream(harness_driver):
    """A cached sBlock whose pieces were freed on stream 0 is not reused by stream 1 while stream 0's work on it
    is queued."""
    h = StreamHarness(harness_driver)
    a, b = h.malloc(8 * MiB, 0), h.malloc(8 * MiB, 0)
    h.free(a)
    h.free(b)
    big = h.malloc(16 * MiB, 0)       # stitched on stream 0
    assert h.alloc.stats()["stitches"] == 1
    h.free(big)                       # cached, its last use queued on stream 0
    other = h.malloc(16 * MiB, 1)
    assert other != big
    h.free(other)
    h.complete(0)
    h.complete(1)
    again = h.malloc(16 * MiB, 1)     # stream 0's work is done: now it may serve stream 1 (after a fence)
    h.free(again)
    h.close()


@pytest.mark.parametrize("busy", ["first piece's tail", "second piece"])
def test_a_cached_sblock_is_not_reused_while_part_of_a_piece_is_live(harness_driver, busy):
    h = StreamHarness(harness_driver)
    a, b = h.malloc(8 * MiB, 0), h.malloc(8 * MiB, 0)
    h.free(a)
    h.free(b)
    big = h.malloc(16 * MiB, 0)
    h.free(big)                       # cached sBlock over a's and b's bytes
    h.complete(0)
    if busy == "first piece's tail":
        head = h.malloc(6 * MiB, 0)   # a's head ...
        tail = h.malloc(2 * MiB, 0)   # ... and a's 2 MiB tail, which stays live
        assert tail == a + 6 * MiB, "the scenario needs a's tail live"
        h.free(head)                  # a's first 6 MiB are free again, its tail is not
    else:
        tail = h.malloc(8 * MiB, 0)   # a or b, whole
        assert tail in (a, b)
    again = h.malloc(16 * MiB, 0)     # must not reuse the sBlock over the live bytes
    h.free(again)
    h.free(tail)
    h.close()


def test_releasing_chunks_spares_those_an_sblock_still_maps(harness_driver):
    """empty_cache and pressure release only chunks no sBlock maps: an sBlock in use maps its unclaimed pieces too,
    and a handle cannot be released while mapped anywhere."""
    h = StreamHarness(harness_driver)
    a, b, c = h.malloc(8 * MiB, 0), h.malloc(8 * MiB, 0), h.malloc(8 * MiB, 0)
    for p in (a, b, c):
        h.free(p)
    big = h.malloc(24 * MiB, 0)       # one sBlock over all three
    h.free(big)
    small = h.malloc(18 * MiB, 0)     # reuses it partly: the last piece's chunks stay free but mapped by it
    assert h.alloc.stats()["sblock_reuses"] == 1
    h.empty_cache()
    h.free(small)
    h.empty_cache()
    assert h.alloc.stats()["reserved_bytes"] == 0
    h.close()


def test_pressure_releases_only_unmapped_chunks():
    """The same under memory pressure: a request over the cap evicts and releases, never a mapped handle."""
    h = StreamHarness(SimDriver(), limit=32 * MiB)
    a, b, c = h.malloc(8 * MiB, 0), h.malloc(8 * MiB, 0), h.malloc(8 * MiB, 0)
    for p in (a, b, c):
        h.free(p)
    big = h.malloc(24 * MiB, 0)
    h.free(big)
    small = h.malloc(18 * MiB, 0)
    other = h.malloc(12 * MiB, 1)     # only 8 MiB are unreserved: pressure releases the free, unmapped chunks
    assert other is not None
    h.free(other)
    h.free(small)
    h.close()


def test_an_sblock_is_evicted_only_after_a_synchronize(harness_driver):
    """With at most one cached sBlock, a second stitch evicts the first: its VA is unmapped, which is safe only
    once the kernels queued on it have run."""
    h = StreamHarness(harness_driver, max_cached_sblocks=1)
    blocks = [h.malloc(8 * MiB, 0) for _ in range(4)]
    for p in blocks:
        h.free(p)
    first = h.malloc(16 * MiB, 0)
    h.free(first)                     # cached, with its last use queued
    keep = h.malloc(4 * MiB, 0)       # split off a free block, so the next request cannot reuse the cached sBlock
    second = h.malloc(24 * MiB, 0)    # stitches again: the first sBlock is evicted
    assert h.alloc.stats()["sblock_evictions"] >= 1
    h.free(second)
    h.free(keep)
    h.close()


# The paper's design, today's default, and the default sharing blocks across streams (the candidate for FSDP,
# bench fsdp-pattern): an expandable base whose freed pages move between streams behind fences.
RANDOM_SCHEDULE_POLICIES = [("gmlake-paper", {"max_cached_sblocks": 4}),
                            ("gmlake", {"max_cached_sblocks": 4, "min_saved_chunks": 0}),
                            ("gmlake", {"max_cached_sblocks": 4, "min_saved_chunks": 0, "cross_stream": True})]


@pytest.mark.parametrize("policy, knobs", RANDOM_SCHEDULE_POLICIES,
                         ids=["paper", "default", "default-cross-stream"])
def test_random_schedules_never_hand_out_busy_memory(harness_driver, policy, knobs):
    rng = random.Random(1234)
    h = StreamHarness(harness_driver, policy, **knobs)
    live = []
    for _ in range(400):
        op = rng.random()
        if op < 0.45 or not live:
            p = h.malloc(rng.choice([rng.randint(1, MiB), rng.randint(MiB, 12 * MiB)]), rng.randint(0, 2))
            if p is not None:
                live.append(p)
        elif op < 0.8:
            h.free(live.pop(rng.randrange(len(live))))
        elif op < 0.9:
            h.use_on(rng.choice(live), rng.randint(0, 2))
        elif op < 0.98:
            h.complete_random(rng)
        else:
            h.empty_cache()
    shares = gmlake.policies.get(policy, **knobs).cross_stream
    assert (h.alloc.stats()["stream_migrations"] > 0) == shares       # blocks did move between streams, or never
    h.close()



def test_a_refused_call_is_described_by_the_hazard_it_found():
    """What the driver refuses reaches the user as a DriverError whose text is the hazard's description."""
    driver = HostDriver()
    h = StreamHarness(driver)
    assert driver.describe_error(78) == "hazard: ?"
    p = h.malloc(2 * MiB, stream=0)
    h.complete(0)
    driver.launch(0, p, 4096, write=250)
    h.free(p)
    driver.complete_stream(0)
    assert driver.describe_error(78).startswith("hazard: data race: ")


# ---------------------------------------------------------------- waiting for another stream's block


def test_a_wait_hands_another_streams_block_over_at_once_and_orders_the_work(harness_driver):
    """Note [Waiting for another stream's free block]: with cross_stream_wait, stream 0 takes the block stream 2
    freed while stream 2's last use of it is still queued; the wait orders stream 0's kernels after it, and after
    them a third stream that waits for stream 0 (transitively after stream 2), so no kernel races and every byte
    checks. Without the knob the block stays with stream 2 until an event says its work is done."""
    for wait in (False, True):
        driver = SimDriver() if isinstance(harness_driver, SimDriver) else HostDriver()
        h = StreamHarness(driver, "gmlake", cross_stream_wait=wait)
        a = h.malloc(4 * MiB, 2)
        h.free(a)
        b = h.malloc(4 * MiB, 0)
        assert (b == a) is wait
        assert h.alloc.stats()["stream_waits"] == h.alloc.stats()["calls"]["event_wait"] == int(wait)
        h.use_on(b, 1)                    # stream 1 waits for stream 0, and so for stream 2's last use too
        h.close()


def test_after_a_wait_every_block_the_other_stream_had_freed_is_the_waiting_streams(harness_driver):
    """One wait covers all the other stream's work so far, so all it had freed moves over (as RMM merges the free
    lists): the second request takes stream 2's other block with no second wait, and stream 2's work stays
    ordered before both."""
    h = StreamHarness(harness_driver, "gmlake", cross_stream_wait=True)
    a = h.malloc(4 * MiB, 2)
    guard = h.malloc(2 * MiB, 2)
    c = h.malloc(8 * MiB, 2)
    h.malloc(6 * MiB, 2)                  # fills stream 2's page: c's free block stays 8 MiB
    h.free(a)
    h.free(c)
    assert h.malloc(4 * MiB, 0) == a
    assert h.malloc(8 * MiB, 0) == c and h.alloc.stats()["stream_waits"] == 1
    h.free(guard)
    h.close()


def test_no_wait_where_no_single_block_of_another_stream_fits(harness_driver):
    """The wait is taken only for a block that serves the request whole: a larger request grows (or stitches
    behind fences), leaving the other stream's work unordered."""
    h = StreamHarness(harness_driver, "gmlake", cross_stream_wait=True)
    a = h.malloc(4 * MiB, 2)
    h.malloc(16 * MiB, 2)                 # the rest of stream 2's 20 MiB page: its free block stays 4 MiB
    h.free(a)
    b = h.malloc(6 * MiB, 0)
    assert b != a and h.alloc.stats()["stream_waits"] == 0
    h.close()


def test_a_failed_wait_fails_the_request_with_its_call_and_leaks_nothing():
    driver = SimDriver()
    alloc = gmlake.Allocator(driver, gmlake.policies.get("gmlake", cross_stream_wait=True))
    driver.auto_complete = False                      # stream 2's work never completes by itself
    a = alloc.malloc(4 * MiB, stream=2)
    alloc.free(a)
    driver.inject_fault("event_record", nth=3)        # the fence and the event pass; the wait fails
    with pytest.raises(gmlake.DriverError, match="event_wait"):
        alloc.malloc(4 * MiB, stream=0)
    b = alloc.malloc(4 * MiB, stream=0)               # the allocator stays usable: now it waits
    assert b == a and alloc.stats()["stream_waits"] == 1
    alloc.free(b)
    alloc.close()
    assert set(driver.leaks().values()) == {0}
