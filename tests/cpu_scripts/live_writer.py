"""A Python thread writes live blocks while the main thread allocates at the limit, on the host driver's real bytes
(docs/design.md, "Safety"). Run in a subprocess by tests/test_safety.py: memory unmapped under the writer kills this
process (SIGSEGV), which a test in the same process could not report.

    python live_writer.py KNOBS WHERE ROUNDS [UNMAP_PAUSE]

KNOBS: "default" (the default policy object, GMLakePolicy()) or "k=v,k=v" knobs of the gmlake policy; WHERE: "cap"
(a 200 MiB cap) or "device" (a driver of 200 MiB capacity). Each round lays out ten 20 MiB pages, each holding a live
6 MiB block beside a freed 14 MiB gap, and starts a writer thread that, block by block, checks every byte holds its
expected value and then writes the next value (ctypes.memset, which lets the GIL go, so the write runs while the
allocator works), counting its writes per block. Meanwhile the main thread asks for 100 MiB, which fits only if the
gaps go back, fills the gaps with 2 MiB blocks and frees them, and empties the cache. At the end of the round every
byte of every block must equal its start value plus its count of writes. UNMAP_PAUSE (seconds, default 0) holds each
unmapped range unmapped that long (HostDriver's unmap_pause), many times the writer's pass over the blocks, so a
writer that can reach an unmapped block does. Prints one "summary:" line; exit status 0 only if no write was lost and
the allocator's invariants held.
"""
from __future__ import annotations

import ctypes
import sys
import threading
import time

import gmlake
from gmlake import Allocator, HostDriver, OutOfMemoryError

MiB = 1 << 20
PAGES, LIVE, GAP, BIG, LIMIT = 10, 6 * MiB, 14 * MiB, 100 * MiB, 200 * MiB


class Writer(threading.Thread):
    """Checks, then writes, each block in turn until stopped; counts its writes per block."""

    def __init__(self, blocks: list[int], starts: list[int]) -> None:
        super().__init__(daemon=True)
        self.blocks, self.values = blocks, list(starts)
        self.counts = [0] * len(blocks)
        self.stop = threading.Event()
        self.passes = 0
        self.lost: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for i, p in enumerate(self.blocks):
                v = self.values[i]
                seen = ctypes.string_at(p, LIVE)
                if seen.count(v) != LIVE:
                    self.lost.append(f"block {i}: {LIVE - seen.count(v)} bytes are not {v} before write "
                                     f"{self.counts[i] + 1}")
                    return
                v = (v + 1) % 256
                ctypes.memset(p, v, LIVE)
                self.values[i] = v
                self.counts[i] += 1
            self.passes += 1


def policy_of(knobs: str) -> gmlake.Policy:
    if knobs == "default":
        return gmlake.policies.GMLakePolicy()
    # the knobs as text, typed by the policy's declarations as GMLAKE_KNOBS's are
    return gmlake.policies.get("gmlake", **dict(item.split("=", 1) for item in knobs.split(",")))


def one_round(alloc: Allocator, r: int) -> tuple[int, list[str], str]:
    live, gaps = [], []
    for i in range(PAGES):
        live.append(alloc.malloc(LIVE))
        gaps.append(alloc.malloc(GAP))
    starts = [(37 * r + i + 1) % 256 for i in range(PAGES)]
    for p, v in zip(live, starts):
        ctypes.memset(p, v, LIVE)
    for g in gaps:
        alloc.free(g)
    writer = Writer(live, starts)
    writer.start()
    while writer.passes == 0 and writer.is_alive():
        time.sleep(0.001)
    try:
        big = alloc.malloc(BIG)
        ctypes.memset(big, 0xB1, BIG)
        outcome = "fit"
    except OutOfMemoryError:
        big, outcome = None, "oom"
    fill = []
    try:
        while len(fill) < PAGES * GAP // (2 * MiB):           # the gaps (where they are still mapped)
            fill.append(alloc.malloc(2 * MiB))
            ctypes.memset(fill[-1], 0xF0 + len(fill) % 8, 2 * MiB)
    except OutOfMemoryError:
        pass
    for k, p in enumerate(fill):
        if ctypes.string_at(p, 2 * MiB).count(0xF0 + (k + 1) % 8) != 2 * MiB:
            writer.lost.append(f"gap block {k} was overwritten")
        alloc.free(p)
    if big is not None:
        if ctypes.string_at(big, BIG).count(0xB1) != BIG:
            writer.lost.append("the big block was overwritten")
        alloc.free(big)
    alloc.empty_cache()
    time.sleep(0.05)
    writer.stop.set()
    writer.join(timeout=120)
    if writer.is_alive():
        raise RuntimeError("the writer did not stop")
    for i, p in enumerate(live):
        want = (starts[i] + writer.counts[i]) % 256
        if ctypes.string_at(p, LIVE).count(want) != LIVE:
            writer.lost.append(f"block {i}: not {starts[i]} + {writer.counts[i]} writes at the end")
    alloc.check()
    for p in live:
        alloc.free(p)
    alloc.empty_cache()
    return sum(writer.counts), writer.lost, outcome


def main(knobs: str, where: str, rounds: int, unmap_pause: float = 0.0) -> int:
    policy = policy_of(knobs)
    driver = HostDriver(capacity=LIMIT if where == "device" else 0, unmap_pause=unmap_pause)
    alloc = Allocator(driver, policy, limit=LIMIT if where == "cap" else None)
    writes, lost, outcomes = 0, [], []
    for r in range(rounds):
        n, bad, outcome = one_round(alloc, r)
        writes += n
        lost += bad
        outcomes.append(outcome)
    stats = alloc.stats()
    alloc.close()
    print(f"summary: reback_slot={policy.reback_slot} where={where} rounds={rounds} writes={writes} "
          f"lost_writes={len(lost)} big_request={outcomes} rebacked_chunks={stats['rebacked_chunks']}", flush=True)
    for line in lost:
        print("lost:", line, flush=True)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(float, sys.argv[4:5])))
