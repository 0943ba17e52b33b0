"""The 1,000-step runs on the H200 (docs/benchmarks.md, "Speed suite"): what the doc says of
them, held to the bundled results, so that the figures cannot drift from the data.

Three device calls ran ViT and ResNet-50 (the multi-scale CNN) for 1,000 steps under gmlake and expandable segments
in alternating order (`bench/results/train/long-2026-12-01{a,b,c}/speed`, per-step records in runs.tar.gz)."""
from __future__ import annotations

import statistics

import pytest

from bench import RESULTS
from bench.stall_check import load_runs

LONG = [RESULTS / "train" / f"long-2026-12-01{call}" / "speed" for call in "abc"]

WARMUP = 250


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return load_runs(LONG)


def by(runs: list[dict], workload: str, allocator: str) -> list[dict]:
    return [r for r in runs if r["workload"] == workload and r["allocator"] == allocator]


def test_the_bundled_runs_are_the_ones_the_doc_counts(runs):
    counts = {(w, a): len(by(runs, w, a)) for w in ("vit", "cnn") for a in ("gmlake", "expandable")}
    assert counts == {("vit", "gmlake"): 2, ("vit", "expandable"): 2, ("cnn", "gmlake"): 4, ("cnn", "expandable"): 4}
    assert all(r["steps"] == 1000 and r["warmup_steps"] == WARMUP for r in runs)


@pytest.mark.parametrize("workload, cached", [("vit", 10), ("cnn", 1)])
def test_gmlake_reaches_a_steady_state_with_no_driver_call(runs, workload, cached):
    """After warm-up: no stitch, no driver call, no eviction, a small bounded cache, in every run."""
    for run in by(runs, workload, "gmlake"):
        after = run["gmlake_after_warmup"]
        assert (after["stitches"], after["driver_calls"], after["sblock_evictions"]) == (0, 0, 0)
        assert after["cached_sblocks"] == cached


@pytest.mark.parametrize("workload, less", [("vit", 100 << 20), ("cnn", 0)])
def test_reserved_bytes_are_the_same_in_every_run_and_gmlake_reserves_no_more(runs, workload, less):
    reserved = {a: {r["max_memory_reserved"] for r in by(runs, workload, a)} for a in ("gmlake", "expandable")}
    assert all(len(v) == 1 for v in reserved.values()), reserved
    assert reserved["expandable"].pop() - reserved["gmlake"].pop() == less


@pytest.mark.parametrize("workload", ["vit", "cnn"])
def test_step_by_step_gmlake_takes_expandables_time_within_a_quarter_percent(runs, workload):
    """Each step's median time under gmlake over its median under expandable segments, then the median over steps:
    1.002 on both (docs/benchmarks.md), where the summed times differ by 1.5-1.9 %."""
    mine, theirs = by(runs, workload, "gmlake"), by(runs, workload, "expandable")
    ratios = [statistics.median(r["per_step"][k]["step_s"] for r in mine)
              / statistics.median(r["per_step"][k]["step_s"] for r in theirs) for k in range(WARMUP, 1000)]
    assert statistics.median(ratios) == pytest.approx(1.002, abs=0.001)

