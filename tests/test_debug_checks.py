"""Invariant checks inside the allocator (issue 12): on in a GMLAKE_DEBUG build, switchable for tests."""
from __future__ import annotations

import pytest

import gmlake
from gmlake import Allocator, SimDriver
from gmlake.replay import run_requests
from gmlake.trace import load

MiB = 1 << 20
TINY = "tests/data/tiny-gpt2-native.pickle.gz"


@pytest.mark.parametrize("policy", gmlake.policies.names())
def test_every_operation_of_a_real_trace_ends_with_a_full_check(policy):
    trace = load(TINY)
    alloc, out = run_requests(trace, policy, upto=4000)
    assert alloc.debug_checks_run == 0, "off unless asked for (or built with GMLAKE_DEBUG)"
    checked = Allocator(SimDriver(capacity=80 << 30), gmlake.policies.get(policy))
    checked.debug_checks = True
    requests = trace.requests()[:4000]
    live = {}
    for action, stream, size, ident in zip(requests["action"], requests["stream"], requests["size"], requests["id"]):
        if action == 0:
            live[int(ident)] = checked.malloc(int(size), int(stream))
        elif action == 1 and int(ident) in live:
            checked.free(live.pop(int(ident)))
    operations = int((requests["action"] == 0).sum()) + int((requests["action"] == 1).sum())
    assert checked.debug_checks_run == operations
    assert checked.stats()["peak_reserved_bytes"] == out["peak_reserved"], "checking must not change a decision"


def test_the_checks_can_be_switched_off_again():
    alloc = Allocator(SimDriver())
    alloc.debug_checks = True
    alloc.free(alloc.malloc(3 * MiB))
    alloc.debug_checks = False
    alloc.free(alloc.malloc(3 * MiB))
    assert alloc.debug_checks_run == 2 and not alloc.debug_checks
