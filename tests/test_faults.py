"""Injected driver faults: every call the allocator makes can fail, at every point of a workload.

For each kind of driver call and each N, a fresh allocator runs the same workload with the Nth call of that kind
failing. Each operation must succeed or raise a clean gmlake error; after each one the invariants hold and every
byte the driver holds is accounted for; live blocks keep their bytes; and at shutdown nothing leaks.
"""
from __future__ import annotations

import ctypes

import pytest

import gmlake
from gmlake import Allocator, DriverError, HostDriver, OutOfMemoryError
from gmlake.core._driver import FAULT_NAMES

# These tests exercise the chunk-and-stitch mechanics, so they run the paper's design, where every request
# past the free blocks stitches; the default policy's own tests are in test_gmlake_policy.py.
PAPER = gmlake.policies.get("gmlake-paper")

MiB = 1 << 20
KiB = 1 << 10


class Workload:
    def __init__(self, policy: str, fault: tuple[str, int, bool] | None = None) -> None:
        self.driver = HostDriver()
        self.alloc = Allocator(self.driver, gmlake.policies.get(policy))
        self.live: dict[int, tuple[int, int]] = {}
        self.value = 0
        self.errors = 0
        if fault:
            self.driver.inject_fault(fault[0], fault[1], oom=fault[2])

    def checked(self, op, *args):
        try:
            return op(*args)
        except (OutOfMemoryError, DriverError):
            self.errors += 1
            return None
        finally:
            self.verify()

    def verify(self) -> None:
        self.alloc.check()
        s = self.alloc.stats()
        assert s["reserved_bytes"] + s["orphan_chunk_bytes"] == self.driver.live_chunk_bytes, s

    def m(self, size: int, stream: int = 0):
        p = self.checked(self.alloc.malloc, size, stream)
        if p is not None:
            self.value = self.value % 250 + 1
            ctypes.memset(p, self.value, size)
            self.live[p] = (size, self.value)
        return p

    def f(self, p) -> None:
        if p is None or p not in self.live:
            return
        size, value = self.live.pop(p)
        assert ctypes.string_at(p, size).count(value) == size, "a live block's bytes were overwritten"
        self.checked(self.alloc.free, p)

    def run(self) -> None:
        m, f = self.m, self.f
        a, b, c = m(3 * MiB), m(5 * MiB), m(7 * MiB)
        s1, g = m(100 * KiB), m(MiB + 1)
        f(a)
        f(c)
        d = m(9 * MiB)                      # stitched from a's and c's chunks
        e = m(20 * MiB)                     # stitched with a shortfall of new chunks
        f(d)
        d = m(9 * MiB)                      # a cached sBlock again
        h = m(4 * MiB, stream=1)
        if h is not None:
            self.checked(self.alloc.record_stream, h, 0)
        f(h)                                # deferred on an event
        x = m(2 * MiB, stream=2)            # other streams' free blocks: fences
        self.checked(self.alloc.empty_cache)
        self.alloc.set_limit(self.alloc.stats()["reserved_bytes"] + 4 * MiB)
        y = m(30 * MiB)                     # memory pressure: synchronize, release, retry (or OOM)
        self.alloc.set_limit(None)
        for p in (b, s1, g, e, d, x, y):
            f(p)
        self.checked(self.alloc.empty_cache)

    def shutdown(self) -> None:
        self.driver.clear_faults()
        for p in list(self.live):
            self.f(p)
        self.alloc.close()
        leaks = self.driver.leaks()
        assert leaks == {k: 0 for k in leaks}, leaks


def calls_made(policy: str) -> dict[str, int]:
    w = Workload(policy)
    w.run()
    calls = w.alloc.stats()["calls"]
    w.shutdown()
    names = dict(zip(FAULT_NAMES, ("create_chunk", "release_chunk", "reserve", "free_va", "map", "unmap",
                                   "set_access", "synchronize", "event_record")))
    return {fault: calls[name] for fault, name in names.items()}


@pytest.mark.parametrize("policy", gmlake.policies.names())
def test_every_driver_call_can_fail_at_every_point(policy):
    counts = calls_made(policy)
    assert sum(counts.values()) > 20
    injected = triggered = 0
    for call, n_calls in counts.items():
        for oom in ((False, True) if call in ("create_chunk", "reserve", "map") else (False,)):
            for nth in range(1, n_calls + 1):
                w = Workload(policy, (call, nth, oom))
                w.run()
                injected += 1
                triggered += w.driver.faults_triggered
                w.shutdown()
    assert triggered == injected, "every injected fault must have been reached"
    print(f"{policy}: {injected} faults injected and survived")


def test_a_failed_release_is_retried_not_leaked():
    drv = HostDriver()
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(8 * MiB)
    alloc.free(p)
    drv.inject_fault("release_chunk", 1)
    with pytest.raises(DriverError, match="release_chunk"):
        alloc.empty_cache()                         # reported, and the chunk kept to retry
    s = alloc.stats()
    assert s["orphans"] == 1 and s["reserved_bytes"] == 0 and drv.live_chunk_bytes == 2 * MiB
    alloc.close()                                   # retries the refused release
    assert drv.leaks() == {k: 0 for k in drv.leaks()}


def test_a_failed_stitch_gives_back_its_new_chunks():
    drv = HostDriver()
    alloc = Allocator(drv, PAPER)
    p = alloc.malloc(10 * MiB)
    alloc.free(p)
    before = alloc.stats()["reserved_bytes"]
    drv.inject_fault("set_access", 2)               # the new chunks' set_access succeeds, the stitch's fails
    with pytest.raises(DriverError, match="set_access"):
        alloc.malloc(16 * MiB)
    assert alloc.stats()["reserved_bytes"] == before
    alloc.check()
    alloc.close()
    assert drv.leaks() == {k: 0 for k in drv.leaks()}


def test_fault_injection_arguments():
    drv = HostDriver()
    with pytest.raises(ValueError):
        drv.inject_fault("nope")
    with pytest.raises(ValueError):
        drv.inject_fault("map", 0)
