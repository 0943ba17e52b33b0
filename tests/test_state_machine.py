"""Random malloc / free / record_stream / completion / empty_cache sequences on several streams, checked on real
bytes (host) against a reference model, and sim against host.

The machine drives the allocator through tests/streams.py: every block is written by a kernel queued on its stream
and checked by its last kernel before the free, kernels run only when the machine completes a stream (whole, up to a
point, or on a seeded random schedule), and the driver treats memory handed to a stream while another stream's
queued work still touches it as a hazard. The shadow of live physical bytes catches two live blocks sharing memory.
A memory cap makes the pressure paths run. Every policy runs under it.
"""
from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)
from streams import StreamHarness

import gmlake
from gmlake import Allocator, HostDriver, OutOfMemoryError, SimDriver

KiB = 1 << 10
MiB = 1 << 20

sizes = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(4 * KiB, MiB),
    st.integers(MiB + 1, 6 * MiB),
    st.integers(6 * MiB, 24 * MiB),
)
streams = st.integers(0, 2)


class HostAllocatorMachine(RuleBasedStateMachine):
    """The state machine over the host driver with hazard tracking, with a memory cap so the pressure paths run."""

    blocks = Bundle("blocks")

    policy = gmlake.policies.get("gmlake", max_cached_sblocks=6)

    def __init__(self) -> None:
        super().__init__()
        self.driver = HostDriver()
        self.h = StreamHarness(self.driver, self.policy, limit=96 * MiB)

    @precondition(lambda self: len(self.h.live) < 200)
    @rule(target=blocks, size=sizes, stream=streams)
    def malloc(self, size, stream):
        ptr = self.h.malloc(size, stream)
        if ptr is not None:
            assert self.h.alloc.block_size(ptr) >= size
        return ptr

    @rule(ptr=consumes(blocks))
    def free(self, ptr):
        if ptr is not None and ptr in self.h.live:
            self.h.free(ptr)

    @rule(ptr=blocks, stream=streams)
    def record_stream(self, ptr, stream):
        if ptr is not None and ptr in self.h.live and stream != self.h.live[ptr].stream:
            self.h.use_on(ptr, stream)

    @rule()
    def empty_cache(self):
        self.h.empty_cache()
        assert self.h.alloc.stats()["cached_sblocks"] == 0

    @rule(stream=streams)
    def complete_stream(self, stream):
        self.h.complete(stream)

    @rule(stream=streams, fraction=st.floats(0, 1))
    def complete_part_of_stream(self, stream, fraction):
        """Run only the older part of a stream's queued work: fences recorded before the rest complete first."""
        done, issued = self.driver.completed_ticket(stream), self.driver.queued(stream)
        self.h.complete(stream, int(done + (issued - done) * fraction))

    @rule(seed=st.integers(0, 2**32 - 1))
    def complete_random(self, seed):
        self.h.complete_random(random.Random(seed))

    @invariant()
    def consistent(self):
        self.h.verify()
        assert self.h.alloc.stats()["reserved_bytes"] == self.driver.live_chunk_bytes

    def teardown(self):
        self.h.close()


def seam_policy(base: type) -> type:
    """`base` with every seam overridden by a seeded random but valid answer, so the machine checks that any choice
    a policy may make keeps memory safe (no hazard, no shared bytes) and the invariants whole."""

    @dataclass(frozen=True)
    class RandomSeams(base):
        rng: random.Random = field(default_factory=lambda: random.Random(13), compare=False)
        calls: collections.Counter = field(default_factory=collections.Counter, compare=False)

        def choose_block(self, size, stream, pool, candidates, default, state):
            self.calls["choose_block"] += 1
            return self.rng.choice([default, None] + list(range(len(candidates))))

        def should_split(self, block_size, size, pool, default):
            self.calls["should_split"] += 1
            return default if self.rng.random() < 0.7 else not default

        def choose_stitch(self, size, stream, blocks, default, state):
            self.calls["choose_stitch"] += 1
            picked = self.rng.sample(range(len(blocks)), self.rng.randint(0, len(blocks)))
            return self.rng.choice([default, picked, []])

        def segment_layout(self, size, stream, pool, default, state):
            self.calls["segment_layout"] += 1
            segment, handle = default
            return self.rng.choice([default, (segment + handle, handle)])

        def evict_victim(self, cached, reason, state):
            self.calls["evict_victim"] += 1
            return self.rng.choice([None, 0, len(cached) - 1, self.rng.randrange(len(cached))])

        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            self.calls["relieve_pressure"] += 1
            return self.rng.choice([default, None, *gmlake.policies.base.PRESSURE_ACTIONS])

    RandomSeams.name = f"{base.name}-random-seams"
    return RandomSeams


class SeamsPaperMachine(HostAllocatorMachine):
    """The paper's policy (chunks, stitching, cross-stream reuse) with every decision made at random."""

    def __init__(self) -> None:
        self.policy = seam_policy(gmlake.policies.PaperPolicy)(max_cached_sblocks=3)
        super().__init__()


class SeamsGMLakeMachine(HostAllocatorMachine):
    """The default (expandable base, stitching, per-stream blocks) with every decision made at random."""

    def __init__(self) -> None:
        self.policy = seam_policy(gmlake.policies.GMLakePolicy)(max_cached_sblocks=3, min_saved_chunks=0)
        super().__init__()


class CrossStreamMachine(HostAllocatorMachine):
    """The default sharing freed blocks across streams behind fences: the candidate for FSDP (bench fsdp-pattern)."""

    policy = gmlake.policies.get("gmlake", max_cached_sblocks=6, cross_stream=True)


class CrossStreamWaitMachine(HostAllocatorMachine):
    """The default taking another stream's free block after a wait on the GPU (Note [Waiting for another stream's
    free block]): the hazard model orders the waiting stream's later kernels after the other stream's work."""

    policy = gmlake.policies.get("gmlake", max_cached_sblocks=6, cross_stream_wait=True)


class TailCutMachine(HostAllocatorMachine):
    """The default with fine pages at a block's tail and cuts at reuse (no built-in sets them): tails grown in
    slots, refused under the cap and grown into later, pages cut as reuse lays memory out."""

    policy = gmlake.policies.get("gmlake", max_cached_sblocks=6, expandable_page_large=8 * MiB, tail_page=2 * MiB,
                                    cut_at_reuse=1000)


class CachingMachine(HostAllocatorMachine):
    policy = gmlake.policies.get("caching")


class ExpandableMachine(HostAllocatorMachine):
    policy = gmlake.policies.get("expandable")


class PoolMachine(HostAllocatorMachine):
    """The machine with private pools (CUDA graphs) begun, ended and released at random, some capturing: each
    allocation lands in the pool its stream is routed to (or the default pool), and while a capture runs the
    allocator calls no synchronize and records or queries no event (Note [Pools and graph capture])."""

    def __init__(self) -> None:
        super().__init__()
        self.uses = {}              # pool id -> use count (the model)
        self.active = {}            # pool id -> (streams, capturing)
        self.frozen = None          # (synchronize, event_record, event_query) when the capture began

    def _calls(self):
        calls = self.h.alloc.stats()["calls"]
        return calls["synchronize"], calls["event_record"], calls["event_query"]

    def _capturing(self) -> bool:
        return any(cap for _, cap in self.active.values())

    def _route(self, stream):
        for pid, (chosen, _) in self.active.items():      # dicts keep the order pools began in
            if stream in chosen:
                return pid
        return 0

    @precondition(lambda self: len(self.h.live) < 200)
    @rule(target=HostAllocatorMachine.blocks, size=sizes, stream=streams)
    def malloc(self, size, stream):
        ptr = self.h.malloc(size, stream)
        if ptr is not None:
            want = self._route(stream)
            pools = {seg["private_pool"] for seg in self.h.alloc.segments_info()
                     if seg["va"] <= ptr < seg["va"] + seg["size"]}
            # A stitched block lies in no segment: only the default pool stitches.
            assert pools == {want} or (not pools and want == 0), (hex(ptr), pools, want)
        return ptr

    @rule(ptr=consumes(HostAllocatorMachine.blocks), other=streams)
    def free_after_use_elsewhere(self, ptr, other):
        """A free that must wait for another stream: polled by later mallocs, deferred during a capture."""
        if ptr is not None and ptr in self.h.live:
            if other != self.h.live[ptr].stream:
                self.h.use_on(ptr, other)
            self.h.free(ptr)

    @rule(pid=st.integers(1, 2), chosen=st.sets(streams, min_size=1), capturing=st.booleans())
    def begin_pool(self, pid, chosen, capturing):
        released_with_memory = any(p["id"] == pid and p["use_count"] == 0 for p in self.h.alloc.pools_info())
        if pid in self.active or released_with_memory:
            with pytest.raises(ValueError):
                self.h.alloc.begin_allocate_to_pool(pid, sorted(chosen), capturing=capturing)
            return
        if capturing and not self._capturing():
            self.frozen = self._calls()
        self.h.alloc.begin_allocate_to_pool(pid, sorted(chosen), capturing=capturing)
        self.uses[pid] = self.uses.get(pid, 0) + 1
        self.active[pid] = (chosen, capturing)

    @rule(pid=st.integers(1, 2))
    def end_pool(self, pid):
        if pid not in self.active:
            with pytest.raises(ValueError):
                self.h.alloc.end_allocate_to_pool(pid)
            return
        self.h.alloc.end_allocate_to_pool(pid)
        del self.active[pid]
        if not self._capturing():
            self.frozen = None

    @rule(pid=st.integers(1, 2))
    def release_pool(self, pid):
        if not self.uses.get(pid) or pid in self.active:
            with pytest.raises(ValueError):
                self.h.alloc.release_pool(pid)
            return
        self.h.alloc.release_pool(pid)
        self.uses[pid] -= 1

    @rule()
    def empty_cache(self):
        if self._capturing():
            with pytest.raises(gmlake.GraphCaptureError):
                self.h.alloc.empty_cache()
        else:
            super().empty_cache()

    @invariant()
    def pools_as_modelled(self):
        info = {p["id"]: p for p in self.h.alloc.pools_info()}
        for pid, uses in self.uses.items():
            if uses:
                assert info[pid]["use_count"] == uses and info[pid]["active"] == (pid in self.active)
            else:
                assert pid not in info or info[pid]["use_count"] == 0
        assert self.h.alloc.capturing == sum(cap for _, cap in self.active.values())
        if self.frozen is not None:
            assert self._calls() == self.frozen, "an event or synchronize call while a graph was being captured"

    def teardown(self):
        if self.h.broken:
            return
        for pid in list(self.active):
            self.h.alloc.end_allocate_to_pool(pid)
        for pid, uses in self.uses.items():
            for _ in range(uses):
                self.h.alloc.release_pool(pid)
        self.h.close()


class PoolPaperMachine(PoolMachine):
    """Pools beside the paper's policy: chunks, stitching and cross-stream fences in the default pool."""

    policy = gmlake.policies.get("gmlake-paper", max_cached_sblocks=3, min_saved_chunks=0)


class PoolTailCutMachine(PoolMachine):
    """Pools beside cuts at reuse: no cut (it synchronizes) while a graph is captured (Note [A cut under another
    thread's capture])."""

    policy = gmlake.policies.get("gmlake", max_cached_sblocks=3, expandable_page_large=8 * MiB, tail_page=2 * MiB,
                                    cut_at_reuse=1000)


class PoolCachingMachine(PoolMachine):
    policy = gmlake.policies.get("caching")


class PoolWaitMachine(PoolMachine):
    """Pools beside the default waiting for other streams' blocks: no wait while a graph is being captured."""

    policy = gmlake.policies.get("gmlake", max_cached_sblocks=3, cross_stream_wait=True)


# derandomize: the same examples on every run, so a bug this finds fails every run, not one in a few.
_settings = settings(max_examples=60, stateful_step_count=60, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow])
HostAllocatorMachine.TestCase.settings = _settings
CachingMachine.TestCase.settings = _settings
CrossStreamMachine.TestCase.settings = _settings
CrossStreamWaitMachine.TestCase.settings = _settings
ExpandableMachine.TestCase.settings = _settings
TailCutMachine.TestCase.settings = settings(_settings, max_examples=20)        # the suite's time: a third
SeamsPaperMachine.TestCase.settings = _settings
SeamsGMLakeMachine.TestCase.settings = _settings
TestHostAllocator = HostAllocatorMachine.TestCase
TestHostCaching = CachingMachine.TestCase
TestHostCrossStream = CrossStreamMachine.TestCase
TestHostCrossStreamWait = CrossStreamWaitMachine.TestCase
TestHostExpandable = ExpandableMachine.TestCase
TestHostTailCuts = TailCutMachine.TestCase
TestHostPaperSeams = SeamsPaperMachine.TestCase
TestHostGMLakeSeams = SeamsGMLakeMachine.TestCase
for _machine in (PoolMachine, PoolPaperMachine, PoolCachingMachine, PoolWaitMachine):
    _machine.TestCase.settings = _settings
PoolTailCutMachine.TestCase.settings = settings(_settings, max_examples=20)
TestHostPools = PoolMachine.TestCase
TestHostPoolsPaper = PoolPaperMachine.TestCase
TestHostPoolsCaching = PoolCachingMachine.TestCase
TestHostPoolsWait = PoolWaitMachine.TestCase
TestHostPoolsTailCuts = PoolTailCutMachine.TestCase


def test_the_random_seam_policies_reach_every_seam():
    """The seam machines above are worth running only if their policies' hooks are asked."""
    for base, knobs in ((gmlake.policies.PaperPolicy, {"cross_stream": False}), (gmlake.policies.GMLakePolicy, {})):
        policy = seam_policy(base)(max_cached_sblocks=1, min_saved_chunks=0, **knobs)
        h = StreamHarness(HostDriver(), policy, limit=48 * MiB)
        rng = random.Random(5)
        for step in range(300):
            live = list(h.live)
            if live and rng.random() < 0.45:
                h.free(rng.choice(live))
            else:
                h.malloc(rng.choice([4 * KiB, 3 * MiB, 5 * MiB, 9 * MiB, 17 * MiB]), rng.randrange(2))
            if step % 40 == 39:
                h.complete_random(rng)
        h.verify()
        missing = {"choose_block", "should_split", "choose_stitch", "segment_layout", "evict_victim",
                   "relieve_pressure"} - set(policy.calls)
        assert not missing, f"{base.name}: never asked {sorted(missing)}"
        h.close()


# The same operation lists on sim and host give identical statistics: the drivers differ only in what backs memory.
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, streams),
        st.tuples(st.just("free"), st.integers(0, 1000)),
        st.tuples(st.just("empty_cache")),
        st.tuples(st.just("complete"), streams),
    ),
    max_size=80,
)


def _run(driver, policy, program) -> list:
    driver.auto_complete = False
    alloc = Allocator(driver, gmlake.policies.get(policy), limit=64 * MiB)
    live: list[int] = []
    trace = []
    for op in program:
        if op[0] == "malloc":
            try:
                live.append(alloc.malloc(op[1], op[2]))
                trace.append("ok")
            except OutOfMemoryError:
                trace.append("oom")
        elif op[0] == "free" and live:
            alloc.free(live.pop(op[1] % len(live)))
        elif op[0] == "empty_cache":
            alloc.empty_cache()
        elif op[0] == "complete":
            driver.complete_stream(op[1])
        trace.append(alloc.stats())
    for ptr in live:
        alloc.free(ptr)
    alloc.close()
    trace.append(driver.leaks())
    return trace


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([*gmlake.policies.names(), "gmlake[expandable_page_large=4MiB,tail_page=2MiB,cut_at_reuse=1000]"]),
       ops)
def test_sim_and_host_agree(policy, program):
    # The expandable model sizes its VA reservation from the device: give both drivers the same capacity.
    assert _run(SimDriver(capacity=1 << 40), policy, program) == _run(HostDriver(capacity=1 << 40), policy, program)
