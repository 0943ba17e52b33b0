"""bench fsdp-pattern (sim driver, no GPU): FSDP1's streams, and what sharing blocks across streams recovers."""
from __future__ import annotations

import subprocess
import sys

from bench import ROOT, fsdp_pattern
from gmlake.policies import resolve


def utilization(spec: str) -> tuple[float, dict]:
    st = fsdp_pattern.run(resolve(spec).policy, steps=4, layers=8)
    return st["peak_allocated_bytes"] / st["peak_reserved_bytes"], st


def test_blocks_kept_per_stream_strand_the_sharded_gradients():
    """Kept per stream (PyTorch's rule, gmlake's default before 2026-11-30 20:30) gmlake reserves what expandable
    segments reserve; the default shares freed blocks across streams, so the next forward uses the post-backward
    stream's freed gradients (Note [Blocks shared by streams])."""
    per_stream, st_per_stream = utilization("gmlake[cross_stream=false]")
    expandable, _ = utilization("expandable")
    shared, st_shared = utilization("gmlake")
    assert abs(per_stream - expandable) < 0.01
    assert st_per_stream["stream_migrations"] == 0
    assert shared > per_stream + 0.05 and st_shared["stream_migrations"] > 0


def test_bad_input_gets_one_line_and_exit_2():
    for args in (["--policy", "no-such-policy"], ["--steps", "0"]):
        proc = subprocess.run([sys.executable, "-m", "bench", "fsdp-pattern", *args],
                              capture_output=True, check=False, text=True, cwd=ROOT)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("bench fsdp-pattern: "), \
            proc.stderr


def test_the_written_trace_replays_as_the_pattern_runs(tmp_path):
    """--trace records the pattern under the caching policy; replaying it through another policy gives what running
    the pattern through that policy gives, so explain, compare and cap work on it."""
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    path = tmp_path / "fsdp.pickle.gz"
    fsdp_pattern.write_trace(path, steps=3, layers=6, seed=0)
    trace = load(path)
    assert trace.meta["device_total"] == fsdp_pattern.H200_BYTES
    for spec in ("caching", "gmlake", "gmlake[cross_stream=false]"):
        direct = fsdp_pattern.run(resolve(spec).policy, steps=3, layers=6)
        replayed = replay(trace, resolve(spec))
        assert replayed.peak_reserved == direct["peak_reserved_bytes"], spec
        assert replayed.peak_allocated == direct["peak_allocated_bytes"], spec


def test_with_the_gpu_behind_completed_frees_do_not_pile_up():
    """Note [Polling pending frees]: with events completing two layers late, the frees still pending at the end
    are the last step's few, not a backlog of completed ones (38 of them before the fix, on 24 layers)."""
    st = fsdp_pattern.run(resolve("gmlake").policy, steps=3, layers=24, lag=2)
    assert st["pending_frees"] <= 6


def test_event_lag_brackets_sharing_between_at_once_and_never(tmp_path):
    """Note [Event lag in replay]: with events complete at once sharing blocks by fences shares the most; when
    they never complete before a synchronize it reserves exactly what blocks kept per stream reserve; the default's
    wait on the GPU (cross_stream_wait) takes back part of that; single-stream traces replay the same at any lag."""
    from gmlake.sim.replay import bundled_traces, replay
    from gmlake.sim.trace import load

    path = tmp_path / "fsdp.pickle.gz"
    fsdp_pattern.write_trace(path, steps=3, layers=8, seed=0)
    trace = load(path)
    at_once = replay(trace, "gmlake[cross_stream_wait=false]")
    never = replay(trace, "gmlake[cross_stream_wait=false]", event_lag=1 << 40)
    waiting = replay(trace, "gmlake", event_lag=1 << 40)
    per_stream = replay(trace, "gmlake[cross_stream=false]")
    assert at_once.peak_reserved < never.peak_reserved == per_stream.peak_reserved
    assert at_once.peak_reserved <= waiting.peak_reserved < never.peak_reserved
    assert never.stats["stream_migrations"] == 0 < at_once.stats["stream_migrations"]
    assert never.stats["stream_waits"] == 0 < waiting.stats["stream_waits"]
    assert never.summary()["event_lag"] == 1 << 40
    single = load(bundled_traces()[0])
    assert replay(single, "gmlake", event_lag=100).peak_reserved == replay(single, "gmlake").peak_reserved
