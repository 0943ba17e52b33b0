"""Concurrency and scale on the host driver, with byte-pattern checks on every block.

The default run is short; the marked `slow` tests are the long runs whose figures README reports
(`pytest -m slow tests/test_stress.py -s`).
"""
from __future__ import annotations

import ctypes
import random
import threading
import time

import pytest

import gmlake
from gmlake import Allocator, HostDriver, OutOfMemoryError

KiB, MiB = 1 << 10, 1 << 20


def _hammer(alloc: Allocator, seed: int, seconds: float, counts: list, errors: list, big: bool) -> None:
    rng = random.Random(seed)
    live = []
    ops = 0
    deadline = time.monotonic() + seconds
    value = seed % 200 + 1
    try:
        while time.monotonic() < deadline:
            for _ in range(64):
                if live and (rng.random() < 0.5 or len(live) > 64):
                    p, n, v = live.pop(rng.randrange(len(live)))
                    if ctypes.string_at(p, n).count(v) != n:
                        errors.append(f"thread {seed}: block overwritten")
                        return
                    alloc.free(p)
                else:
                    n = rng.choice([rng.randint(1, 16 * KiB), rng.randint(16 * KiB, MiB),
                                    rng.randint(MiB, (8 if big else 2) * MiB)])
                    try:
                        p = alloc.malloc(n, stream=seed % 3)
                    except OutOfMemoryError:
                        continue
                    if rng.random() < 0.05:
                        alloc.record_stream(p, (seed + 1) % 3)
                    ctypes.memset(p, value, n)
                    live.append((p, n, value))
                ops += 1
        for p, n, v in live:
            if ctypes.string_at(p, n).count(v) != n:
                errors.append(f"thread {seed}: block overwritten")
            alloc.free(p)
    except Exception as exc:  # noqa: BLE001 - whatever fails in a thread is reported by the test
        errors.append(f"thread {seed}: {exc!r}")
    counts.append(ops)


def run_threads(policy: str, threads: int, seconds: float) -> int:
    drv = HostDriver()
    alloc = Allocator(drv, gmlake.policies.get(policy), limit=512 * MiB)
    counts: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def janitor():                      # empty_cache from another thread while the others work
        while not stop.wait(0.05):
            alloc.empty_cache()

    workers = [threading.Thread(target=_hammer, args=(alloc, i, seconds, counts, errors, i % 2 == 0))
               for i in range(threads)]
    side = threading.Thread(target=janitor)
    side.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=seconds + 60)
    stop.set()
    side.join()
    assert not any(t.is_alive() for t in workers), "deadlock: a worker did not finish"
    assert errors == []
    alloc.check()
    alloc.close()
    assert drv.leaks() == {k: 0 for k in drv.leaks()}
    return sum(counts)


# Fine pages at a block's tail and cuts at reuse, which no built-in policy sets: growth cuts tails, reuse cuts pages
# (each synchronizing) while empty_cache makes memory be laid out again. Pages of 4 MiB, so that blocks of a few MiB
# span whole pages and end inside others.
TAIL_CUTS = "gmlake[expandable_page_large=4MiB,tail_page=2MiB,cut_at_reuse=1000]"


@pytest.mark.parametrize("policy", [*gmlake.policies.names(), TAIL_CUTS])
def test_eight_threads_with_pattern_checks(policy):
    ops = run_threads(policy, threads=8, seconds=2.0)
    assert ops > 1000


def random_ops(total: int, seed: int = 0, check_every: int = 10_000, empty_every: int = 50_000,
               policy: str = "gmlake-paper") -> dict:
    """`total` random mallocs and frees on two streams with pattern checks, empty_cache every `empty_every`; the
    paper's policy by default, the one that stitches most."""
    drv = HostDriver()
    alloc = Allocator(drv, gmlake.policies.get(policy), limit=256 * MiB)
    rng = random.Random(seed)
    live: list[tuple[int, int, int]] = []
    used = set()
    ooms = empties = 0
    for i in range(total):
        if live and (rng.random() < 0.5 or len(live) > 150):
            p, n, v = live.pop(rng.randrange(len(live)))
            assert ctypes.string_at(p, n).count(v) == n, f"op {i}: a live block was overwritten"
            used.discard(v)
            alloc.free(p)
        else:
            n = rng.choice([rng.randint(1, 4 * KiB), rng.randint(4 * KiB, 256 * KiB), rng.randint(MiB, 6 * MiB)])
            try:
                p = alloc.malloc(n, stream=rng.randint(0, 1))
            except OutOfMemoryError:
                ooms += 1
                continue
            v = next(x for x in range(1, 256) if x not in used)
            used.add(v)
            ctypes.memset(p, v, n)
            live.append((p, n, v))
        if i % empty_every == 0 and i:
            alloc.empty_cache()
            empties += 1
        if i % check_every == 0:
            alloc.check()
    for p, n, v in live:
        assert ctypes.string_at(p, n).count(v) == n
        alloc.free(p)
    stats = alloc.stats()
    alloc.close()
    assert drv.leaks() == {k: 0 for k in drv.leaks()}
    return {"ops": total, "ooms": ooms, "stitches": stats["stitches"], "sblock_reuses": stats["sblock_reuses"],
            "empty_caches": empties, "tails_cut_at_reuse": stats["tails_cut_at_reuse"], "plan": stats["plan"]}


def test_random_operations_short():
    result = random_ops(30_000, empty_every=4_000)
    assert result["stitches"] > 0 and result["empty_caches"] == 7


def test_random_operations_short_with_tail_pages_and_cuts_at_reuse():
    result = random_ops(8_000, empty_every=1_000, policy=TAIL_CUTS)
    assert result["tails_cut_at_reuse"] > 0 and result["empty_caches"] == 7, result


def test_random_operations_short_with_a_plan():
    """The planner's tails (Note [A plan learned from the run]) on 4 MiB pages, under a limit: blocks of 1-6 MiB span
    whole pages and cut tails, with pressure and empty_cache between."""
    result = random_ops(8_000, empty_every=1_000,
                        policy="gmlake[expandable_page_large=4MiB,tail_page=2MiB,plan=true,plan_tail_share=50]")
    assert result["plan"]["hits"] > 0 and result["plan"]["misses"] > 0 and result["empty_caches"] == 7, result


@pytest.mark.slow
def test_one_million_random_operations():
    t0 = time.monotonic()
    result = random_ops(1_000_000)
    print(f"\n1M ops: {result}, {time.monotonic() - t0:.0f} s")


@pytest.mark.slow
def test_eight_threads_for_a_minute():
    ops = run_threads("gmlake", threads=8, seconds=60.0)
    print(f"\n8 threads x 60 s: {ops} operations")
