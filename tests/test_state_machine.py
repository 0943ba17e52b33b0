"""Random malloc / free / empty_cache / stream sequences, checked on real bytes (host) and against sim.

Every live block is filled with a byte value no other live block has, and checked when freed: if two live blocks
ever shared physical bytes (a stitching or splitting bug), one of the patterns would be overwritten.
"""
from __future__ import annotations

import ctypes

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

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


def _fill_check(ptr: int, size: int, value: int) -> bool:
    return ctypes.string_at(ptr, size).count(value) == size


class HostAllocatorMachine(RuleBasedStateMachine):
    """The state machine over the host driver, with a memory cap so the pressure paths run too."""

    blocks = Bundle("blocks")

    policy = gmlake.policies.get("gmlake", max_cached_sblocks=6)

    def __init__(self) -> None:
        super().__init__()
        self.driver = HostDriver()
        self.driver.auto_complete = False
        self.alloc = Allocator(self.driver, self.policy, limit=96 * MiB)
        self.values: dict[int, int] = {}   # ptr -> pattern byte
        self.sizes: dict[int, int] = {}

    def _free_value(self) -> int:
        used = set(self.values.values())
        return next(v for v in range(1, 256) if v not in used)

    @precondition(lambda self: len(self.values) < 200)
    @rule(target=blocks, size=sizes, stream=streams)
    def malloc(self, size, stream):
        try:
            ptr = self.alloc.malloc(size, stream)
        except OutOfMemoryError as err:
            assert err.requested == size
            return None
        assert ptr not in self.values
        assert self.alloc.block_size(ptr) >= size
        value = self._free_value()
        ctypes.memset(ptr, value, size)
        self.values[ptr] = value
        self.sizes[ptr] = size
        return ptr

    @rule(ptr=consumes(blocks))
    def free(self, ptr):
        if ptr is None:
            return
        assert _fill_check(ptr, self.sizes[ptr], self.values[ptr]), "a live block's bytes were overwritten"
        self.alloc.free(ptr)
        del self.values[ptr], self.sizes[ptr]

    @rule(ptr=blocks, stream=streams)
    def record_stream(self, ptr, stream):
        if ptr is not None and ptr in self.values:
            self.alloc.record_stream(ptr, stream)

    @rule()
    def empty_cache(self):
        self.alloc.empty_cache()
        assert self.alloc.stats()["cached_sblocks"] == 0

    @rule(stream=streams)
    def complete_stream(self, stream):
        self.driver.complete_stream(stream)

    @invariant()
    def consistent(self):
        self.alloc.check()
        assert self.alloc.stats()["reserved_bytes"] == self.driver.live_chunk_bytes

    def teardown(self):
        for ptr in list(self.values):
            assert _fill_check(ptr, self.sizes[ptr], self.values[ptr])
            self.alloc.free(ptr)
        self.alloc.empty_cache()
        self.alloc.check()
        assert self.alloc.stats()["reserved_bytes"] == 0
        leaks = self.driver.leaks()
        assert leaks == {k: 0 for k in leaks}, leaks


class CachingMachine(HostAllocatorMachine):
    policy = gmlake.policies.get("caching")


class ExpandableMachine(HostAllocatorMachine):
    policy = gmlake.policies.get("expandable")


_settings = settings(max_examples=60, stateful_step_count=60, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
HostAllocatorMachine.TestCase.settings = _settings
CachingMachine.TestCase.settings = _settings
ExpandableMachine.TestCase.settings = _settings
TestHostAllocator = HostAllocatorMachine.TestCase
TestHostCaching = CachingMachine.TestCase
TestHostExpandable = ExpandableMachine.TestCase


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
@given(st.sampled_from(gmlake.policies.names()), ops)
def test_sim_and_host_agree(policy, program):
    # The expandable model sizes its VA reservation from the device: give both drivers the same capacity.
    assert _run(SimDriver(capacity=1 << 40), policy, program) == _run(HostDriver(capacity=1 << 40), policy, program)
