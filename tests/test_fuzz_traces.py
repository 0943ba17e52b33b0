"""Fuzzing the trace readers: truncated, corrupted and hostile inputs give a TraceError, never anything else."""
from __future__ import annotations

import gzip
import lzma
import pickle
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from gmlake.sim.trace import Trace, TraceError, load

TINY = Path("tests/data/tiny-gpt2-native.pickle.gz")
RAW = gzip.decompress(TINY.read_bytes())[:60_000]      # a prefix keeps each example fast
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _load_bytes(tmp_path, data: bytes):
    path = tmp_path / "fuzz.bin"
    path.write_bytes(data)
    try:
        result = load(path)
    except TraceError:
        return None
    assert isinstance(result, Trace)
    return result


@st.composite
def mutated(draw, base: bytes):
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 64))]
    return bytes(data)


@FUZZ
@given(data=mutated(RAW))
def test_mutated_snapshot_pickles(tmp_path, data):
    _load_bytes(tmp_path, data)


@FUZZ
@given(data=mutated(TINY.read_bytes()[:40_000]))
def test_mutated_gzip_snapshots(tmp_path, data):
    _load_bytes(tmp_path, data)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
entry = st.fixed_dictionaries({"action": st.sampled_from(["alloc", "free_completed", "segment_alloc", "x"]) | json_like,
                               "addr": json_like | st.integers(0, 1 << 64), "size": json_like | st.integers(0, 1 << 40),
                               "stream": json_like | st.integers(0, 8)})


@FUZZ
@given(snapshot=st.fixed_dictionaries({"device_traces": st.lists(st.lists(entry | json_like, max_size=6), max_size=3)})
       | json_like, gmlake_meta=json_like)
def test_structurally_wrong_snapshots(tmp_path, snapshot, gmlake_meta):
    if isinstance(snapshot, dict):
        snapshot["gmlake"] = gmlake_meta
    trace = _load_bytes(tmp_path, pickle.dumps(snapshot))
    if trace is not None:
        from gmlake.sim.replay import replay

        replay(trace, "gmlake", device_memory=1 << 40)   # what loads must also replay


@FUZZ
@given(data=mutated(lzma.compress(b"GMLTRACE" + bytes(64))))
def test_mutated_compact_traces(tmp_path, data):
    _load_bytes(tmp_path, data)


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/gmlake-pwned",))


@pytest.mark.parametrize("payload", [
    b"cos\nsystem\n(S'touch /tmp/gmlake-pwned'\ntR.",                   # protocol 0: GLOBAL + REDUCE
    pickle.dumps(_Evil(), protocol=4),                                   # protocol 4: STACK_GLOBAL
    pickle.dumps({"device_traces": [[_Evil()]]}, protocol=2),            # hidden inside a snapshot
    b"cbuiltins\neval\n(S'1+1'\ntR.",
    b"csubprocess\nPopen\n(S'true'\ntR.",
])
def test_hostile_pickles_refused_without_running_code(tmp_path, payload):
    with pytest.raises(TraceError, match="refusing"):
        _raise(tmp_path, payload)
    assert not Path("/tmp/gmlake-pwned").exists()


def _raise(tmp_path, data):
    path = tmp_path / "evil.pickle"
    path.write_bytes(data)
    load(path)


@pytest.mark.slow
@settings(max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated(RAW))
def test_mutated_snapshot_pickles_long(tmp_path, data):
    _load_bytes(tmp_path, data)
