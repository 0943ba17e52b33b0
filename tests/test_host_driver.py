"""The host driver: VMM semantics over real bytes."""
import ctypes

import pytest

import gmlake
from gmlake import Allocator, HostDriver

# These tests exercise the chunk-and-stitch mechanics, so they run the paper's design, where every request
# past the free blocks stitches; the default policy's own tests are in test_gmlake_policy.py.
PAPER = gmlake.policies.get("gmlake-paper")

MiB = 1 << 20


def test_stitched_block_writes_land_in_its_primitive_blocks():
    drv = HostDriver()
    alloc = Allocator(drv, PAPER)
    # Three 4 MiB blocks with 1 MiB guards between them; free the three, then ask for 12 MiB: no single free block
    # is large enough, so the allocator must stitch.
    blocks = [alloc.malloc(4 * MiB) for _ in range(3)]
    guards = [alloc.malloc(1 * MiB + 512) for _ in range(3)]
    for i, p in enumerate(blocks):
        ctypes.memset(p, 0x10 + i, 4 * MiB)
    for p in blocks:
        alloc.free(p)
    before = alloc.stats()["reserved_bytes"]
    big = alloc.malloc(12 * MiB)
    stats = alloc.stats()
    assert stats["stitches"] == 1
    assert stats["reserved_bytes"] == before, "stitching must not need new memory"
    ctypes.memset(big, 0xEE, 12 * MiB)
    # Every byte of the three primitive ranges now reads 0xEE through their own addresses.
    for p in blocks:
        assert ctypes.string_at(p, 4 * MiB) == b"\xee" * (4 * MiB)
    alloc.free(big)
    for g in guards:
        alloc.free(g)
    alloc.close()
    assert drv.leaks() == {k: 0 for k in drv.leaks()}


def test_one_chunk_mapped_in_two_ranges():
    drv = HostDriver()
    alloc = Allocator(drv, PAPER)
    a = alloc.malloc(6 * MiB)
    b = alloc.malloc(6 * MiB)
    alloc.free(a)
    alloc.free(b)
    whole = alloc.malloc(12 * MiB)   # the two segments' chunks, stitched
    ctypes.memset(whole, 0x5A, 12 * MiB)
    assert ctypes.string_at(a, 6 * MiB) == b"\x5a" * (6 * MiB)
    assert ctypes.string_at(b, 6 * MiB) == b"\x5a" * (6 * MiB)
    alloc.free(whole)
    alloc.close()


def test_granularity_must_be_page_multiple():
    with pytest.raises(ValueError):
        HostDriver(granularity=1000)


@pytest.mark.parametrize("pause", [-0.1, 11.0, float("nan")])
def test_unmap_pause_out_of_range_is_refused(pause):
    with pytest.raises(ValueError, match="unmap_pause"):
        HostDriver(unmap_pause=pause)


def test_unmap_pause_holds_the_range_unmapped_that_long():
    """The pause tests/test_safety.py widens its race window with: an empty_cache that unmaps one page takes at
    least the pause."""
    import time

    alloc = Allocator(HostDriver(unmap_pause=0.05), PAPER)
    alloc.free(alloc.malloc(2 * MiB))
    start = time.perf_counter()
    alloc.empty_cache()
    assert time.perf_counter() - start >= 0.05
    assert alloc.stats()["reserved_bytes"] == 0
    alloc.close()


def test_errors_are_described():
    drv = HostDriver()
    assert "errno" in drv.describe_error(1000 + 22)
    assert drv.describe_error(1) == "out of memory"
