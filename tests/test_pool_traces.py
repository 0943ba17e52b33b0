"""Traces of programs that capture CUDA graphs (Note [Pools in traces]): allocations inside a snapshot's private-pool
segments are recognised and replayed in that pool, so graph memory is never reused outside its graph."""
from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest

from gmlake.sim.replay import run_requests
from gmlake.sim.trace import TraceError, load, load_compact, save_compact

MiB = 1 << 20
POOL = (1, 0)                   # the pair PyTorch gives a graph's own pool
KEY = 1 << 32


def _snapshot(tmp_path, with_pool: bool = True, reuse_before: bool = False):
    """A default-pool segment at 0x1000_0000 and a graph pool segment at 0x2000_0000. The graph allocates 64 MiB
    and frees it at the end of capture; the default pool then asks for 64 MiB again. With `reuse_before`, the pool
    segment's address served a default-pool allocation before its segment_alloc (a freed, remapped segment)."""
    base, graph = 0x1000_0000, 0x2000_0000
    trace = []
    if reuse_before:
        trace += [{"action": "segment_alloc", "addr": graph, "size": 64 * MiB, "stream": 0},
                  {"action": "alloc", "addr": graph, "size": 32 * MiB, "stream": 0},
                  {"action": "free_completed", "addr": graph, "size": 32 * MiB, "stream": 0},
                  {"action": "segment_free", "addr": graph, "size": 64 * MiB, "stream": 0}]
    trace += [
        {"action": "segment_alloc", "addr": base, "size": 64 * MiB, "stream": 0},
        {"action": "alloc", "addr": base, "size": 16 * MiB, "stream": 0},
        {"action": "segment_alloc", "addr": graph, "size": 64 * MiB, "stream": 7},
        {"action": "alloc", "addr": graph, "size": 64 * MiB, "stream": 7},          # inside the capture
        {"action": "free_completed", "addr": graph, "size": 64 * MiB, "stream": 7},
        {"action": "free_completed", "addr": base, "size": 16 * MiB, "stream": 0},
        {"action": "alloc", "addr": base, "size": 48 * MiB, "stream": 7},          # after it, on the same stream
        {"action": "free_completed", "addr": base, "size": 48 * MiB, "stream": 7},
    ]
    segments = [{"device": 0, "address": base, "total_size": 64 * MiB, "segment_pool_id": (0, 0), "blocks": []},
                {"device": 0, "address": graph, "total_size": 64 * MiB,
                 "segment_pool_id": POOL if with_pool else (0, 0), "blocks": []}]
    path = tmp_path / "graphs.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": segments, "device_traces": [trace]})))
    return path


def test_allocations_in_a_pool_segment_are_recognised(tmp_path):
    trace = load(_snapshot(tmp_path))
    assert trace.meta["pools"] == {str(KEY): [1]}
    assert trace.pool_of_requests().tolist() == [0, KEY, 0, 0, 0, 0]


def test_an_address_used_before_the_pool_segment_was_made_is_not_the_pools(tmp_path):
    trace = load(_snapshot(tmp_path, reuse_before=True))
    assert trace.meta["pools"] == {str(KEY): [2]}        # the earlier 32 MiB allocation (id 0) stays default


def test_replay_keeps_graph_memory_out_of_the_default_pool(tmp_path):
    """The graph's freed 64 MiB is its pool's: the later 48 MiB default request on the capture stream needs memory of
    its own (the caching model: 16 + 64 + 48 MiB), where a replay blind to pools reuses the graph's (16 + 64)."""
    pooled = load(_snapshot(tmp_path))
    plain = load(_snapshot(tmp_path, with_pool=False))
    for policy in ("caching", "expandable", "gmlake", "gmlake-paper"):
        a_pooled, r_pooled = run_requests(pooled, policy)
        _a_plain, r_plain = run_requests(plain, policy)
        assert r_pooled["ooms"] == r_plain["ooms"] == 0
        info = a_pooled.pools_info()
        assert [p["id"] for p in info] == [KEY] and info[0]["reserved_bytes"] >= 64 * MiB, (policy, info)
        assert r_pooled["peak_reserved"] >= r_plain["peak_reserved"] + 32 * MiB, policy
        if policy == "caching":
            assert (r_plain["peak_reserved"], r_pooled["peak_reserved"]) == (80 * MiB, 128 * MiB)
        a_pooled.check()


def test_pools_survive_the_compact_format(tmp_path):
    trace = load(_snapshot(tmp_path))
    again = load_compact(save_compact(trace, tmp_path / "t.gmtrace"))
    assert again.meta["pools"] == trace.meta["pools"]
    assert np.array_equal(again.pool_of_requests(), trace.pool_of_requests())


@pytest.mark.parametrize("pools", [{"x": [1]}, {"5": ["a"]}, {"5": [-1]}, [1, 2], {"0": [1]}])
def test_malformed_pool_metadata_is_refused(tmp_path, pools):
    trace = load(_snapshot(tmp_path))
    trace.meta["pools"] = pools
    path = save_compact(trace, tmp_path / "bad.gmtrace")
    with pytest.raises(TraceError, match="malformed pool metadata"):
        load_compact(path)
