"""The sim driver: bookkeeping, capacity, modelled events."""
import pytest

import gmlake
from gmlake import Allocator, OutOfMemoryError, SimDriver

# These tests exercise the chunk-and-stitch mechanics, so they run the paper's design, where every request
# past the free blocks stitches; the default policy's own tests are in test_gmlake_policy.py.
PAPER = gmlake.policies.get("gmlake-paper")

MiB = 1 << 20
GiB = 1 << 30


def test_models_a_device_far_larger_than_this_machine():
    drv = SimDriver(capacity=512 * GiB)
    alloc = Allocator(drv, gmlake.policies.get("gmlake-paper", chunk_size=512 * MiB))
    ptrs = [alloc.malloc(100 * GiB) for _ in range(5)]
    assert drv.live_chunk_bytes == 500 * GiB
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(20 * GiB)
    for p in ptrs:
        alloc.free(p)
    alloc.close()
    assert drv.leaks() == {k: 0 for k in drv.leaks()}


def test_capacity_bounds_chunks():
    drv = SimDriver(capacity=8 * MiB)
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(8 * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        alloc.malloc(2 * MiB)
    assert info.value.capacity == 8 * MiB
    alloc.free(p)
    alloc.check()


def test_addresses_never_reused():
    drv = SimDriver()
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(4 * MiB)
    alloc.free(p)
    alloc.empty_cache()
    q = alloc.malloc(4 * MiB)
    assert q != p


def test_bad_construction():
    with pytest.raises(ValueError):
        SimDriver(granularity=3 * MiB)
    with pytest.raises(ValueError):
        SimDriver(capacity=-1)


def test_manual_events_complete_only_when_told():
    drv = SimDriver()
    drv.auto_complete = False
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(4 * MiB, stream=1)
    alloc.free(p)
    q = alloc.malloc(4 * MiB, stream=2)   # stream 1's work may still run: new memory
    assert q != p
    drv.complete_stream(1)
    alloc.free(q)
    r = alloc.malloc(4 * MiB, stream=3)   # stream 1's block is now safe for anyone
    assert r == p
    assert alloc.stats()["stream_migrations"] >= 1
