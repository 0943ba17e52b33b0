"""The allocator over CUDA VMM on a real GPU (skipped where no CUDA device exists)."""
from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest

import gmlake
from gmlake import Allocator

pytestmark = pytest.mark.gpu
MiB = 1 << 20
# Most tests here exercise the chunk-and-stitch mechanics, which the paper's policy reaches at once.
PAPER = gmlake.policies.get("gmlake-paper")


def _torch():
    return pytest.importorskip("torch")


class _DeviceBytes:
    """Raw device memory as a CUDA array (uint8), so torch kernels can read and write it in place."""

    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None}


def view(ptr: int, size: int):
    torch = _torch()
    return torch.as_tensor(_DeviceBytes(ptr, size), device="cuda")


@pytest.fixture
def cuda():
    torch = _torch()
    torch.cuda.init()
    torch.zeros(1, device="cuda")   # torch's context is the primary context the driver retains too
    drv = gmlake.cuda_driver(0)
    assert drv.granularity == 2 * MiB
    yield drv
    torch.cuda.synchronize()


def test_kernel_writes_through_stitched_block_read_back_through_pblocks(cuda):
    torch = _torch()
    alloc = Allocator(cuda, PAPER)
    n = 8 * MiB
    blocks = [alloc.malloc(n) for _ in range(3)]
    guard = alloc.malloc(3 * MiB)
    for p in blocks:
        alloc.free(p)
    big = alloc.malloc(3 * n)
    assert alloc.stats()["stitches"] == 1
    stitched = view(big, 3 * n)
    pattern = (torch.arange(3 * n, device="cuda", dtype=torch.int64) * 7 // 5 % 251).to(torch.uint8)
    stitched.copy_(pattern)            # a kernel writes through the stitched VA
    torch.cuda.synchronize()
    slices = {bytes(pattern[i * n:(i + 1) * n][:64].cpu().numpy()): i for i in range(3)}
    seen = set()
    for p in blocks:
        got = view(p, n)
        key = bytes(got[:64].cpu().numpy())
        assert key in slices, "a primitive block does not hold any slice of what was written"
        i = slices[key]
        assert torch.equal(got, pattern[i * n:(i + 1) * n]), "data differs through the primitive range"
        seen.add(i)
    assert seen == {0, 1, 2}
    alloc.free(big)
    alloc.free(guard)
    torch.cuda.synchronize()
    alloc.close()


def test_default_policy_stitches_free_pages_that_kernels_then_read_back(cuda):
    """The default policy's stitch: A and C (100 MiB each) freed around live B and D; 200 MiB maps their pages."""
    torch = _torch()
    alloc = Allocator(cuda)
    a, b, c, d = (alloc.malloc(n * MiB) for n in (100, 20, 100, 20))
    view(b, 20 * MiB).fill_(0x5B)
    alloc.free(a)
    alloc.free(c)
    reserved = alloc.stats()["reserved_bytes"]
    big = alloc.malloc(200 * MiB)
    assert alloc.stats()["stitches"] == 1 and alloc.stats()["reserved_bytes"] == reserved
    pattern = (torch.arange(200 * MiB, device="cuda", dtype=torch.int64) * 7 // 5 % 251).to(torch.uint8)
    view(big, 200 * MiB).copy_(pattern)
    torch.cuda.synchronize()
    # The stitch maps the largest free blocks first, in the free index's order: A's and C's pages in either order.
    halves = [pattern[:100 * MiB], pattern[100 * MiB:]]
    order = [next((i for i, want in enumerate(halves) if torch.equal(view(p, 100 * MiB), want)), None) for p in (a, c)]
    assert sorted(order, key=str) == [0, 1], f"the stitched pages do not hold what was written ({order})"
    assert bool((view(b, 20 * MiB) == 0x5B).all()), "a live neighbour was overwritten"
    for p in (big, b, d):
        alloc.free(p)
    torch.cuda.synchronize()
    alloc.close()


def test_random_malloc_free_with_patterns_on_device(cuda):
    torch = _torch()
    alloc = Allocator(cuda, PAPER, limit=2 << 30)
    rng = random.Random(1234)
    live: dict[int, tuple[int, int]] = {}
    used_values: set[int] = set()
    ops = 0
    for _ in range(3000):
        if live and (rng.random() < 0.45 or len(live) > 120):
            ptr = rng.choice(list(live))
            size, value = live.pop(ptr)
            used_values.discard(value)
            assert bool((view(ptr, size) == value).all()), "a live block's bytes were overwritten"
            alloc.free(ptr)
        else:
            size = rng.choice([rng.randint(1, 1 << 20), rng.randint(1 << 20, 64 * MiB)])
            try:
                ptr = alloc.malloc(size, stream=0)
            except gmlake.OutOfMemoryError:
                continue
            value = next(v for v in range(1, 256) if v not in used_values)
            used_values.add(value)
            view(ptr, size).fill_(value)
            live[ptr] = (size, value)
        ops += 1
    for ptr, (size, value) in live.items():
        assert bool((view(ptr, size) == value).all())
        alloc.free(ptr)
    torch.cuda.synchronize()
    alloc.check()
    stats = alloc.stats()
    assert stats["stitches"] > 0, "the workload should have exercised stitching"
    alloc.close()
    assert cuda.live_chunks == 0 and cuda.live_reservations == 0


def test_nothing_leaks_driver_free_memory_returns(cuda):
    torch = _torch()
    torch.cuda.synchronize()
    free_before, _ = cuda.mem_get_info()
    alloc = Allocator(cuda, PAPER)
    rng = random.Random(7)
    live = []
    for _ in range(500):
        if live and rng.random() < 0.4:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(alloc.malloc(rng.randint(1, 48 * MiB)))
    mid_free, _ = cuda.mem_get_info()
    assert mid_free < free_before
    for p in live:
        alloc.free(p)
    alloc.empty_cache()
    assert alloc.stats()["reserved_bytes"] == 0
    alloc.close()
    free_after, _ = cuda.mem_get_info()
    assert free_after == free_before, f"driver free memory {free_before} -> {free_after}"
    assert cuda.leaks() == {k: 0 for k in cuda.leaks()}


def test_cross_stream_reuse_waits_for_the_stream(cuda):
    torch = _torch()
    alloc = Allocator(cuda, PAPER)
    s1 = torch.cuda.Stream()
    s2 = torch.cuda.Stream()
    n = 64 * MiB
    p = alloc.malloc(n, stream=s1.cuda_stream)
    with torch.cuda.stream(s1):
        t = view(p, n)
        torch.cuda._sleep(200_000_000)      # keep s1 busy
        t.fill_(3)
    alloc.free(p)                           # freed while s1's kernels are still queued
    q = alloc.malloc(n, stream=s2.cuda_stream)
    assert q != p, "memory still in use by s1's queued kernels was handed to s2"
    s1.synchronize()
    alloc.free(q)
    r = alloc.malloc(n, stream=s2.cuda_stream)
    assert r in (p, q)
    alloc.free(r)
    torch.cuda.synchronize()
    alloc.close()


def test_the_core_alone_grows_stitches_and_fences_without_torch():
    """The core with no torch and so no current context: the driver makes its own context current for every call,
    the capture query included (a CUDA_ERROR_INVALID_CONTEXT there read as an unannounced capture and refused every new
    chunk: bench micro, 2026-11-30). From the main thread and from a thread that never touched CUDA."""
    body = textwrap.dedent("""
        import threading, gmlake
        drv = gmlake.cuda_driver(0)
        def work(label):
            alloc = gmlake.Allocator(drv, gmlake.policies.get("gmlake-paper"))
            parts = [alloc.malloc(8 << 20, stream=0) for _ in range(3)]
            guard = alloc.malloc(3 << 20, stream=0)
            for p in parts:
                alloc.free(p)
            big = alloc.malloc(24 << 20, stream=0)          # stitched from the three
            stats = alloc.stats()
            for p in (big, guard):
                alloc.free(p)
            alloc.empty_cache()
            alloc.close()
            assert stats["stitches"] == 1, (label, stats["stitches"])
            print("ok", label)
        work("main thread")
        t = threading.Thread(target=work, args=("new thread",))
        t.start(); t.join()
        assert set(drv.leaks().values()) == {0}, drv.leaks()
    """)
    proc = subprocess.run([sys.executable, "-c", body], capture_output=True, check=False, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split("\n")[:2] == ["ok main thread", "ok new thread"], \
        proc.stdout + proc.stderr


def test_the_driver_measures_the_time_inside_its_calls(cuda):
    """Driver.busy_seconds on the real driver: 64 MiB as 32 handles of 2 MiB (create, map, set access, then unmap
    and release) costs about 2 ms at the H200's prices (gmlake/sim/data/driver_costs_h200.json); measured, it must be
    more than nothing and far less than a second."""
    before = cuda.busy_seconds
    alloc = Allocator(cuda, PAPER)
    p = alloc.malloc(64 * MiB)
    alloc.free(p)
    alloc.empty_cache()
    alloc.close()
    spent = cuda.busy_seconds - before
    assert 0 < spent < 1.0, spent


def test_a_cut_at_reuse_waits_for_work_queued_on_the_page_and_keeps_live_bytes(cuda):
    """Note [Fine pages at reuse] on the CUDA driver: kernels still queued on a freed block when reuse cuts the
    page it would end in; the cut synchronizes before it unmaps, so they finish on mapped memory, and the live block
    beside it, the reused block and the rest of the run each read back what was written to them."""
    torch = _torch()
    alloc = Allocator(cuda, gmlake.policies.get("gmlake", tail_page=2 * MiB, cut_at_reuse=100))
    a = alloc.malloc(40 * MiB)
    keep = alloc.malloc(20 * MiB)
    view(keep, 20 * MiB).fill_(7)
    queued = view(a, 40 * MiB)
    for _ in range(200):
        queued.add_(1)                 # work queued on the block's bytes, still running when it is freed
    del queued
    alloc.free(a)
    b = alloc.malloc(25 * MiB)
    assert b == a and alloc.stats()["tails_cut_at_reuse"] == 1
    view(b, 25 * MiB).fill_(0xAB)
    c = alloc.malloc(15 * MiB)
    assert c == b + 25 * MiB
    view(c, 15 * MiB).fill_(0xCD)
    torch.cuda.synchronize()
    assert bool((view(keep, 20 * MiB) == 7).all()), "a live block's bytes changed"
    assert bool((view(b, 25 * MiB) == 0xAB).all()) and bool((view(c, 15 * MiB) == 0xCD).all())
    for p in (b, c, keep):
        alloc.free(p)
    alloc.close()
