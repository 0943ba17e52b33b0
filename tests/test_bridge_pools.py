"""The torch bridge's CUDA graph pool hooks on a CPU (Note [Graph pools through the bridge]): a C++ harness
(tests/torch_pool_harness.cpp) calls them as PyTorch's CUDAPluggableAllocator does, over an allocator on the sim
driver, in a fresh process (the bridge's state is per process)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

# The bridge over an allocator on the sim driver, the hooks' addresses (as torch's set_* methods take them), and the
# harness (argv[1]) that calls them with C++ arguments.
PRELUDE = r"""
import ctypes, itertools, json, sys, warnings
import torch
import gmlake, gmlake.torch as gt
from gmlake import Allocator, SimDriver
from gmlake.torch import _torch_bridge

_torch_bridge.configure(lambda device: Allocator(SimDriver(), gmlake.policies.get("gmlake")))
bridge = ctypes.CDLL(_torch_bridge.__file__)
hook = {name: ctypes.cast(getattr(bridge, "gmlake_" + name), ctypes.c_void_p).value
        for name in ("begin_allocate_to_pool", "end_allocate_to_pool", "release_pool", "alloc", "free")}
h = ctypes.CDLL(sys.argv[1])
h.harness_begin.argtypes = [ctypes.c_uint64, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int64]
h.harness_begin_throwing.argtypes = [ctypes.c_uint64, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong]
h.harness_pool.argtypes = [ctypes.c_uint64, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong]
h.harness_alloc.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64]
h.harness_alloc.restype = ctypes.c_uint64
h.harness_error.restype = ctypes.c_char_p
free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(hook["free"])
"""

SCENARIO = r"""
MiB = 1 << 20
KEY = 3 << 32                                   # PyTorch's pool (3, 0)

def alloc(size, stream):
    ptr = h.harness_alloc(hook["alloc"], size, 0, stream)
    assert ptr, h.harness_error().decode()
    return ptr

def pool_of(ptr):
    a = _torch_bridge.allocator(0)
    return next(s["private_pool"] for s in a.segments_info() if s["va"] <= ptr < s["va"] + s["size"])

out = {}
before = alloc(4 * MiB, 5)                      # no pool begun: the default pool, on the plain path
out["before"] = pool_of(before)
assert h.harness_begin(hook["begin_allocate_to_pool"], 0, 3, 0, 5) == 0, h.harness_error()
in_pool, outside = alloc(4 * MiB, 5), alloc(4 * MiB, 6)
out["routed"] = [pool_of(in_pool), pool_of(outside)]
assert h.harness_begin(hook["begin_allocate_to_pool"], 0, 3, 0, 6) == 0, h.harness_error()    # nested begin
nested = alloc(4 * MiB, 6)
out["nested"] = [pool_of(nested), _torch_bridge.allocator(0).pools_info()[0]["use_count"],
                 len(_torch_bridge.routed_pools())]
# cudagraph trees' questions, answered from the pool: its live blocks, and the snapshot's pool pair per segment
out["live"] = [gt._check_pool_live_allocations(0, (3, 0), {in_pool, nested}),
               gt._check_pool_live_allocations(0, (3, 0), {in_pool}),
               gt.CheckpointState(0, (3, 0)).allocated_bytes]
snap = gt.snapshot_of(_torch_bridge.allocators())
out["snapshot_pools"] = sorted({tuple(seg["segment_pool_id"]) for seg in snap["segments"]})
assert h.harness_pool(hook["end_allocate_to_pool"], 0, 3, 0) == 0                         # drops stream 6's route
still_routed = alloc(4 * MiB, 5)
out["after_one_end"] = [pool_of(alloc(4 * MiB, 6)), pool_of(still_routed),
                        _torch_bridge.allocator(0).pools_info()[0]["active"]]
assert h.harness_pool(hook["end_allocate_to_pool"], 0, 3, 0) == 0
out["after_both_ends"] = [pool_of(alloc(4 * MiB, 5)), _torch_bridge.routed_pools(),
                          _torch_bridge.allocator(0).pools_info()[0]["active"]]
out["bad_id"] = [h.harness_begin(hook["begin_allocate_to_pool"], 0, 1 << 40, 0, 5), h.harness_error().decode()]
for ptr in (in_pool, nested, still_routed):     # the pool's blocks: freed, they go back to the pool
    free(ptr, 0, 0, None)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):                          # two uses to release, then one too many: a warning, not a throw
        assert h.harness_pool(hook["release_pool"], 0, 3, 0) == 0
out["released"] = [_torch_bridge.allocator(0).pools_info(), [str(w.message)[:80] for w in caught]]
_torch_bridge.allocator(0).check()
print(json.dumps(out))
"""


def _run(scenario: str, harness: str) -> dict:
    """The scenario after PRELUDE in a fresh process; the JSON line it prints last."""
    pytest.importorskip("torch", reason="the scenario drives gmlake.torch's pool hooks, which import torch")
    proc = subprocess.run([sys.executable, "-c", PRELUDE + scenario, harness], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> str:
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the stand-in for PyTorch's pool hooks")
    library = tmp_path_factory.mktemp("harness") / "torch_pool_harness.so"
    subprocess.run([compiler, "-std=c++17", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(library),
                    str(HERE / "torch_pool_harness.cpp")], check=True)
    return str(library)


def test_graph_pool_hooks_route_requests_by_filter_nest_and_release(harness):
    got = _run(SCENARIO, harness)
    key = 3 << 32
    assert got["before"] == 0
    assert got["routed"] == [key, 0]                        # the filter's stream only
    assert got["nested"] == [key, 2, 2]                     # a second begin: one more use, one more route
    assert got["live"] == [True, False, 8 << 20]            # exactly the pool's allocated blocks
    assert got["snapshot_pools"] == [[0, 0], [3, 0]]        # PyTorch's pairs
    assert got["after_one_end"] == [0, key, True]           # the latest route ended; the pool still routes stream 5
    assert got["after_both_ends"] == [0, [], False]
    assert got["bad_id"][0] == 1 and "pool id out of range" in got["bad_id"][1]
    pools, warned = got["released"]
    assert pools == [] and len(warned) == 1 and "release_pool" in warned[0], got["released"]


MEMPOOL = r"""
ids = itertools.count(41)
torch.cuda.current_device = lambda: 0                   # a CPU machine: the device and torch's id counter, faked
torch.cuda.graph_pool_handle = lambda: (0, next(ids))
a = _torch_bridge.allocator(0)
out = {}
pool = gt.MemPool()
out["id"], out["created"] = list(pool.id), pool.use_count()
# torch.cuda.use_mem_pool(pool): begin (a thread filter in PyTorch; a stream filter here), allocate, end, release
assert h.harness_begin(hook["begin_allocate_to_pool"], 0, *pool.id, 8) == 0
ptr = h.harness_alloc(hook["alloc"], 6 << 20, 0, 8)
out["inside"] = [pool.use_count(), len(pool.snapshot()["segments"])]
assert h.harness_pool(hook["end_allocate_to_pool"], 0, *pool.id) == 0
assert h.harness_pool(hook["release_pool"], 0, *pool.id) == 0
out["after_context"] = pool.use_count()
del pool                                                # its use goes; the live block keeps the pool's segment
out["deleted"] = [p["use_count"] for p in a.pools_info()]
free(ptr, 0, 0, None)
a.empty_cache()
out["freed"] = a.pools_info()
try:
    gt.MemPool(use_on_oom=True)
except ValueError as exc:
    out["refused"] = str(exc)
a.check()
print(json.dumps(out))
"""


def test_mempool_holds_a_use_and_use_mem_pool_routes_into_it(harness):
    got = _run(MEMPOOL, harness)
    assert got["id"] == [0, 41] and got["created"] == 1
    assert got["inside"] == [2, 1]
    assert got["after_context"] == 1 and got["deleted"] == [0] and got["freed"] == []
    assert "use_on_oom" in got["refused"] and "caching allocator" in got["refused"]


THROWING_FILTER = r"""
assert h.harness_begin_throwing(hook["begin_allocate_to_pool"], 0, 3, 0) == 0, h.harness_error()
out = {"alloc": [h.harness_alloc(hook["alloc"], 1 << 20, 0, 5), h.harness_error().decode()]}
out["routes"] = _torch_bridge.routed_pools()            # hangs if the throw left the routing lock held
assert h.harness_pool(hook["end_allocate_to_pool"], 0, 3, 0) == 0
out["after"] = [_torch_bridge.routed_pools(), bool(h.harness_alloc(hook["alloc"], 1 << 20, 0, 5))]
assert h.harness_pool(hook["release_pool"], 0, 3, 0) == 0
_torch_bridge.allocator(0).check()
print(json.dumps(out))
"""


def test_a_filter_that_throws_fails_the_request_and_leaves_the_routing_unlocked(harness):
    """The filter runs under the bridge's routing lock; its exception reaches torch as the request's, and the lock
    is let go on the way out (a ScopedLock), so the routes can be read and ended, and requests go on."""
    got = _run(THROWING_FILTER, harness)
    assert got["alloc"] == [0, "the stream filter failed"]
    assert got["routes"] == [[0, 3 << 32]]
    assert got["after"] == [[], True]
