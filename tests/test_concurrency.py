"""Concurrency as a system: seeded random allocate / free / record_stream / empty_cache / cap changes from several
threads and streams at once on the host driver's real bytes, checked against a reference model after every step
(docs/design.md, "Safety").

Each step, every worker thread runs a burst of random operations on one allocator, all at once (the allocator's
lock is the only thing serializing them): it allocates on its own stream or another, fills each new block with a
pattern derived from the block's id, checks the pattern before each free, marks blocks used on other streams
(record_stream), empties the cache, moves the cap, reads the statistics. Between steps, with the workers parked, the
coordinator checks every byte of every live block, the allocator's own invariants (Allocator.check), and the
allocator against the model: the live blocks, their sizes and streams, the bytes allocated and requested, no two
live blocks overlapping, the cap, and every chunk the driver holds accounted for. Then it completes some streams'
work (record_stream's frees wait for it) and at times plants a driver fault for the next burst to meet.

The test in CI runs a few seeds for a few seconds; the soak (`pytest -m slow tests/test_concurrency.py -s`) runs
the same for minutes (docs/benchmarks.md, "Soak runs").
"""
from __future__ import annotations

import ctypes
import itertools
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import gmlake
from gmlake import Allocator, DriverError, HostDriver, OutOfMemoryError

KiB, MiB = 1 << 10, 1 << 20
STREAMS = 3
MAX_LIVE = 32                   # blocks a thread holds at most (about 60 MiB)
CAPS = (None, 48 * MiB, 64 * MiB, 96 * MiB, 160 * MiB)
# Faults a burst may meet: each kind of driver call the allocator makes on a request, a free or empty_cache.
FAULTS = ("create_chunk", "map", "set_access", "unmap", "release_chunk", "reserve", "free_va", "synchronize",
          "event_record")


_libc = ctypes.CDLL(None)
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.memcmp.restype = ctypes.c_int


def unit(bid: int) -> bytes:
    """The 8 bytes that block `bid` holds over and over: its id, mixed, so a byte of another block (or a stale one)
    never passes for it."""
    return struct.pack("<Q", (bid * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & ((1 << 64) - 1))


def fill(ptr: int, bid: int, n: int) -> None:
    """Write block `bid`'s pattern over its `n` bytes: the unit, then the bytes written so far, doubling."""
    head = unit(bid)[:n]
    ctypes.memmove(ptr, head, len(head))
    done = len(head)
    while done < n:
        step = min(done, n - done)
        ctypes.memmove(ptr + done, ptr, step)
        done += step


def holds_pattern(ptr: int, bid: int, n: int) -> bool:
    """The bytes hold the pattern: the first 8 are the unit and the rest repeat them (each byte equals the one 8
    before it), checked in place by memcmp."""
    head = unit(bid)[:n]
    return ctypes.string_at(ptr, len(head)) == head and (n <= 8 or _libc.memcmp(ptr, ptr + 8, n - 8) == 0)


@dataclass
class Block:
    bid: int
    ptr: int
    size: int               # requested
    held: int               # block_size: the request rounded
    stream: int
    users: set = field(default_factory=set)


class Model:
    """What the allocator must agree with: the live blocks (by address), the cap, and a count of what was done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, Block] = {}
        # Blocks freed after use on another stream: the allocator keeps them until that stream's work completes.
        self.maybe_pending: dict[int, Block] = {}
        self.limit = None
        self.next_id = 0
        self.ops: dict[str, int] = {}

    def new_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id

    def count(self, op: str) -> None:
        with self.lock:
            self.ops[op] = self.ops.get(op, 0) + 1


def check_bytes(b: Block, when: str) -> None:
    if not holds_pattern(b.ptr, b.bid, b.size):
        got, want = ctypes.string_at(b.ptr, b.size), (unit(b.bid) * (b.size // 8 + 1))[:b.size]
        first = next(i for i in range(b.size) if got[i] != want[i])
        raise AssertionError(f"{when}: block {b.bid} at 0x{b.ptr:x} ({b.size} bytes, stream {b.stream}) lost its "
                             f"bytes from offset {first}")


class Worker:
    """One thread's share of the run: its own blocks, its own seeded choices."""

    def __init__(self, alloc: Allocator, model: Model, index: int, seed: int) -> None:
        self.alloc, self.model, self.index = alloc, model, index
        self.rng = random.Random(seed * 1000 + index)
        self.mine: list[Block] = []

    def size(self) -> int:
        r = self.rng.random()
        if r < 0.45:
            return self.rng.randint(1, 64 * KiB)
        if r < 0.85:
            return self.rng.randint(64 * KiB, 2 * MiB)
        return self.rng.randint(2 * MiB, 10 * MiB)

    def burst(self, n: int) -> None:
        for _ in range(n):
            r = self.rng.random()
            if not self.mine or (r < 0.42 and len(self.mine) < MAX_LIVE):
                self.malloc()
            elif r < 0.72:
                self.free(self.mine.pop(self.rng.randrange(len(self.mine))))
            elif r < 0.82:
                self.record_stream()
            elif r < 0.88:
                b = self.rng.choice(self.mine)
                check_bytes(b, "a check by its thread")
            elif r < 0.92:
                self.empty_cache()
            elif r < 0.96:
                with self.model.lock:           # the model sees caps in the allocator's order
                    limit = self.rng.choice(CAPS)
                    self.alloc.set_limit(limit)
                    self.model.limit = limit
                self.model.count("set_limit")
            else:
                s = self.alloc.stats()
                assert s["allocated_bytes"] <= s["active_bytes"] and s["live_blocks"] <= s["allocs"], s
                self.alloc.segments_info()
                self.model.count("read")

    def malloc(self) -> None:
        size = self.size()
        stream = self.index % STREAMS if self.rng.random() < 0.8 else self.rng.randrange(STREAMS)
        try:
            ptr = self.alloc.malloc(size, stream)
        except (OutOfMemoryError, DriverError) as exc:
            self.model.count(type(exc).__name__)
            return
        b = Block(self.model.new_id(), ptr, size, self.alloc.block_size(ptr), stream)
        assert b.held >= size, (b, size)
        with self.model.lock:
            other = self.model.live.get(ptr)
            assert other is None, f"malloc({size}) returned 0x{ptr:x}, live as block {other}"
            self.model.live[ptr] = b
            self.model.maybe_pending.pop(ptr, None)
        fill(ptr, b.bid, size)
        self.mine.append(b)
        self.model.count("malloc")

    def free(self, b: Block) -> None:
        check_bytes(b, "before its free")
        with self.model.lock:       # out of the model before the allocator may hand the address to another thread
            del self.model.live[b.ptr]
            if b.users - {b.stream}:
                self.model.maybe_pending[b.ptr] = b
        self.alloc.free(b.ptr)
        self.model.count("free")

    def record_stream(self) -> None:
        b = self.rng.choice(self.mine)
        other = self.rng.choice([s for s in range(STREAMS) if s != b.stream])
        self.alloc.record_stream(b.ptr, other)
        b.users.add(other)
        self.model.count("record_stream")

    def empty_cache(self) -> None:
        try:
            self.alloc.empty_cache()
        except DriverError:
            self.model.count("DriverError")
            return
        self.model.count("empty_cache")


def check_against_model(alloc: Allocator, driver: HostDriver, model: Model) -> None:
    """With every worker parked: every byte of every live block, the allocator's invariants, and the allocator
    against the model."""
    live = sorted(model.live.values(), key=lambda b: b.ptr)
    for b in live:
        check_bytes(b, "the check between steps")
    for a, b in itertools.pairwise(live):
        assert a.ptr + a.held <= b.ptr, f"live blocks {a.bid} and {b.bid} overlap"
    alloc.check()
    s = alloc.stats()
    assert s["live_blocks"] == len(live), f"live blocks: {s['live_blocks']} in the allocator, {len(live)} modelled"
    assert s["allocated_bytes"] == sum(b.held for b in live), s
    assert s["requested_bytes"] == sum(b.size for b in live), s
    assert s["active_bytes"] >= s["allocated_bytes"], s
    assert s["reserved_bytes"] + s["orphan_chunk_bytes"] == driver.live_chunk_bytes, s
    assert alloc.limit == model.limit
    # Each live block inside a segment is an allocated row at its address, of its size and stream; every other
    # allocated row is a block freed after use on another stream, still waiting for that stream (a stitched block
    # lies in no segment, its pieces are claimed rows).
    rows = {}
    spans = []
    for seg in alloc.segments_info():
        spans.append((seg["va"], seg["va"] + seg["size"]))
        for offset, size, state, stream, _used in seg["blocks"]:
            if state == "allocated":
                rows[seg["va"] + offset] = (size, stream)
    for b in live:
        if any(lo <= b.ptr < hi for lo, hi in spans):
            assert rows.pop(b.ptr, None) == (b.held, b.stream), (b, "not an allocated row of its size and stream")
    waiting = {}
    for ptr, (size, stream) in rows.items():
        b = model.maybe_pending.get(ptr)
        assert b is not None and (b.held, b.stream) == (size, stream), \
            f"an allocated row at 0x{ptr:x} ({size} bytes, stream {stream}) that no block owns or waits for"
        waiting[ptr] = b
    assert s["pending_frees"] >= len(waiting), (s["pending_frees"], len(waiting))
    assert s["active_bytes"] - s["allocated_bytes"] >= sum(b.held for b in waiting.values()), s
    if s["pending_frees"] == 0:
        model.maybe_pending.clear()
    else:                           # forget those whose rows went (released, merged into a free neighbour)
        for ptr, b in list(model.maybe_pending.items()):
            if ptr not in waiting and any(lo <= ptr < hi for lo, hi in spans):
                del model.maybe_pending[ptr]


def run(policy: gmlake.Policy, seed: int, *, threads: int = 4, steps: int = 40, burst: int = 25,
        faults: bool = True, seconds: float | None = None) -> dict:
    """The run: `steps` steps (or as many as fit in `seconds`) of `threads` concurrent bursts, checked between
    steps; at the end every block is freed, every stream completed, and nothing may be left or leak."""
    driver = HostDriver()
    driver.auto_complete = False                # record_stream's frees wait until the coordinator completes streams
    alloc = Allocator(driver, policy)
    model = Model()
    rng = random.Random(seed)
    workers = [Worker(alloc, model, i, seed) for i in range(threads)]
    go = threading.Barrier(threads + 1)
    done = threading.Barrier(threads + 1)
    errors: list[str] = []
    stop = threading.Event()

    def loop(w: Worker) -> None:
        while True:
            go.wait()
            if stop.is_set():
                return
            try:
                w.burst(burst)
            except BaseException as exc:  # noqa: BLE001 - reported by the coordinator
                errors.append(f"thread {w.index}: {type(exc).__name__}: {exc}")
            done.wait()

    pool = [threading.Thread(target=loop, args=(w,), daemon=True) for w in workers]
    for t in pool:
        t.start()
    deadline = time.monotonic() + seconds if seconds else None
    step = 0
    try:
        while (step < steps) if deadline is None else (time.monotonic() < deadline):
            go.wait(timeout=120)
            done.wait(timeout=120)
            assert not errors, f"step {step}: {errors}"
            check_against_model(alloc, driver, model)
            step += 1
            # the streams' work: some of it completes; at times a driver call of the next burst fails
            for s in range(STREAMS):
                if rng.random() < 0.5:
                    driver.complete_stream(s)
            driver.clear_faults()
            if faults and rng.random() < 0.3:
                driver.inject_fault(rng.choice(FAULTS), rng.randint(1, 4), oom=rng.random() < 0.3)
    finally:
        stop.set()
        go.wait(timeout=120)
        for t in pool:
            t.join(timeout=120)
    driver.clear_faults()
    for w in workers:
        for b in w.mine:
            check_bytes(b, "the teardown")
            del model.live[b.ptr]
            alloc.free(b.ptr)
    driver.complete_all()
    alloc.set_limit(None)
    model.limit = None
    alloc.empty_cache()
    check_against_model(alloc, driver, model)
    s = alloc.stats()
    assert s["active_bytes"] == 0 and s["pending_frees"] == 0 and s["orphans"] == 0, s
    alloc.close()
    assert driver.leaks() == {k: 0 for k in driver.leaks()}
    return {"steps": step, **model.ops, "faults": driver.faults_triggered, "stitches": s["stitches"],
            "ooms": s["ooms"]}


# Every built-in policy, the default sharing freed blocks across streams (behind fences, or after a wait), and the
# default with fine pages at a block's tail and cuts at reuse (no built-in sets them).
POLICIES = [pytest.param((name, {}), id=name) for name in gmlake.policies.names()] + [
    pytest.param(("gmlake", {"cross_stream": True, "cross_stream_wait": True}), id="gmlake-cross-stream-wait"),
    pytest.param(("gmlake", {"expandable_page_large": 4 * MiB, "tail_page": 2 * MiB, "cut_at_reuse": 1000}),
                 id="gmlake-tail-cuts")]


def run_in_child(name: str, knobs: dict, seed: int, **options) -> dict:
    """run() in a child process, as test_allocator's thread test does: memory unmapped or handed out wrongly under a
    thread may kill the process (SIGSEGV), which then fails the test with its output instead of ending the session."""
    here = Path(__file__).resolve().parent
    code = (f"import json, gmlake, test_concurrency as t; "
            f"print(json.dumps(t.run(gmlake.policies.get({name!r}, **{knobs!r}), {seed!r}, **{options!r})))")
    child = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, check=False,
                           timeout=900, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), str(here)]),
                                             "PYTHONFAULTHANDLER": "1"})
    status = child.returncode
    if status < 0:
        status = f"{status} ({signal.Signals(-status).name})"
    assert child.returncode == 0, f"exit status {status}:\n{child.stdout[-2000:]}\n{child.stderr[-4000:]}"
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("spec", POLICIES)
def test_threads_and_streams_against_the_model(spec, seed):
    result = run_in_child(*spec, seed)
    # the run reached what it is for: frees and record_stream's deferred frees, the cap refusing, faults met
    assert result["malloc"] > 1000 and result["free"] > 1000 and result["record_stream"] > 200, result
    assert result.get("OutOfMemoryError", 0) > 0 and result["set_limit"] > 100 and result["faults"] > 0, result


def test_the_checks_see_a_changed_byte_a_stale_block_and_a_wrong_stream():
    """The checks above can fail: one byte changed at a block's end, a block the model places on another stream, a
    block the model does not know."""
    driver = HostDriver()
    alloc = Allocator(driver, gmlake.policies.get("gmlake"))
    model = Model()
    ptr = alloc.malloc(3 * MiB + 5, stream=1)
    b = Block(model.new_id(), ptr, 3 * MiB + 5, alloc.block_size(ptr), 1)
    fill(ptr, b.bid, b.size)
    model.live[ptr] = b
    check_against_model(alloc, driver, model)
    ctypes.memset(ptr + b.size - 1, ctypes.string_at(ptr + b.size - 1, 1)[0] ^ 1, 1)
    with pytest.raises(AssertionError, match="lost its bytes from offset 3145732"):
        check_bytes(b, "test")
    fill(ptr, b.bid, b.size)
    b.stream = 2
    with pytest.raises(AssertionError, match="of its size and stream"):
        check_against_model(alloc, driver, model)
    b.stream = 1
    del model.live[ptr]
    with pytest.raises(AssertionError, match="1 in the allocator, 0 modelled"):
        check_against_model(alloc, driver, model)
    alloc.free(ptr)
    alloc.close()


@pytest.mark.slow
@pytest.mark.parametrize("spec", POLICIES)
def test_soak_threads_and_streams_against_the_model(spec):
    """The soak: eight threads for SOAK_SECONDS (default 120) per policy."""
    name, knobs = spec
    t0 = time.monotonic()
    result = run_in_child(name, knobs, 7, threads=8, steps=0, seconds=float(os.environ.get("SOAK_SECONDS", "120")))
    print(f"\n{name} {knobs}: {result}, {time.monotonic() - t0:.0f} s")
