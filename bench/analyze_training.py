"""The evidence behind docs/benchmarks.md's analysis, from the traces captured on the GPU (tests/data/results/traces).

    python -m bench report analysis [TRACE ...]

For each trace: where gmlake's reserved bytes are at its peak (gmlake.sim.explain), when its driver time is spent
(per quarter of the run's requests, at the H200's measured per-call costs), step by step against the time gmlake's
steps took beyond native's in the benchmark runs of the same shapes, and what policy variants would do (utilization
and driver time on replay). Markdown on stdout.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from bench import ROOT
from bench.cli import OneLineParser, error_line
from gmlake.policies import get
from gmlake.sim.explain import explain
from gmlake.sim.replay import driver_seconds, replay, run_requests
from gmlake.sim.trace import ALLOC, load

VARIANTS = {
    "gmlake (default)": {},
    "min_saved_chunks=0": {"min_saved_chunks": 0},
    "sblock_search_depth=64": {"sblock_search_depth": 64},
    "both": {"min_saved_chunks": 0, "sblock_search_depth": 64},
    "both + 4 MiB pages": {"min_saved_chunks": 0, "sblock_search_depth": 64, "expandable_page_large": 4 << 20},
    "8 MiB pages": {"expandable_page_large": 8 << 20},
}
GiB = 1 << 30

# The traces captured during the suites, and the runs they came from: kept with the tests that replay them.
CAPTURED = ROOT / "tests" / "data" / "results"


def quarters(trace, policy) -> list[tuple[int, float]]:
    """(stitches, driver seconds) in each quarter of the trace's requests."""
    n = len(trace.requests())
    out, before = [], (0, 0.0)
    for q in range(1, 5):
        alloc, _ = run_requests(trace, policy, upto=n * q // 4, samples=1)
        stats = alloc.stats()
        now = (stats["stitches"], driver_seconds(stats))
        out.append((now[0] - before[0], now[1] - before[1]))
        before = now
    return out


def step_starts(trace, per_step: list[dict]) -> list[int]:
    """The request index at which each step begins: its input ids, batch x seq int64, are its first allocation.
    Steps the trace does not reach (a capture that ended first) are left out."""
    req = trace.requests()
    starts, at = [], 0
    for step in per_step:
        hits = np.nonzero((req["action"][at:] == ALLOC) & (req["size"][at:] == step["batch"] * step["seq"] * 8))[0]
        if not len(hits):
            break
        at += int(hits[0])
        starts.append(at)
        at += 1
    return starts


def driver_ms_per_step(trace, starts: list[int]) -> list[float]:
    """gmlake's replayed driver time in each step, ms (step i: from its start to the next step's)."""
    ends = starts[1:] + [len(trace.requests())]
    out, before = [], driver_seconds(run_requests(trace, get("gmlake"), upto=starts[0], samples=1)[0].stats())
    for end in ends:
        now = driver_seconds(run_requests(trace, get("gmlake"), upto=end, samples=1)[0].stats())
        out.append((now - before) * 1e3)
        before = now
    return out


def paired_runs(workload: str) -> list[tuple[str, dict, dict]]:
    """(result file, native run, gmlake run) for each file that ran both on the same GPU, one after the other."""
    out = []
    for path in sorted((CAPTURED / "train").glob("*.json")):
        runs = {r["allocator"]: r for r in json.loads(path.read_text())["runs"]
                if r["workload"] == workload and r.get("returncode") == 0 and r.get("per_step")}
        if "native" in runs and "gmlake" in runs:
            out.append((path.stem, runs["native"], runs["gmlake"]))
    return out


def main(argv: list[str] | None = None, prog: str = "bench report analysis") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path,
                        default=sorted((CAPTURED / "traces").glob("*.gmtrace")))
    args = parser.parse_args(argv)
    try:
        traces = [load(str(p)) for p in args.traces]
    except (OSError, ValueError) as exc:
        parser.error(error_line(exc))

    print("### Where gmlake's reserved memory is at its peak\n")
    print("| trace | request that set the peak | reserved GiB | requested | free in shared chunks "
          "(fragments < 2 MiB) | free whole chunks | small pool free |")
    print("|---|---|---|---|---|---|---|")
    for t in traces:
        b = explain(t, get("gmlake"))
        count, _ = b.fragments["< 2 MiB"]
        print(f"| {t.name} | #{b.request_index} ({b.request_size / 2**20:.2f} MiB) | {b.reserved / GiB:.3f} | "
              f"{b.requested / b.reserved:.1%} | {b.free_in_shared_chunks / GiB:.3f} GiB ({count}) | "
              f"{b.free_whole_chunks / GiB:.3f} | {b.free_small / GiB:.3f} |")

    print("\n### When gmlake's driver time is spent (stitches / driver s per quarter of the requests)\n")
    print("| trace | Q1 | Q2 | Q3 | Q4 |")
    print("|---|---|---|---|---|")
    for t in traces:
        cells = [f"{s} / {d:.2f}" for s, d in quarters(t, get("gmlake"))]
        print(f"| {t.name} | " + " | ".join(cells) + " |")

    print("\n### Step by step: gmlake's replayed driver time against its measured excess over native\n")
    print("Steps 1-23 of each pair of runs (same GPU, one after the other, same shapes). Stitch steps: replayed "
          "driver time over 20 ms; quiet steps: under 5 ms.\n")
    print("| trace | runs | stitch steps | their driver ms | their excess ms | excess / driver | quiet steps | "
          "median excess in quiet steps, ms | correlation |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in traces:
        workload = t.name.removesuffix("-gmlake")
        pairs = paired_runs(workload)
        if not pairs:
            continue
        driver = np.array(driver_ms_per_step(t, step_starts(t, pairs[0][2]["per_step"])))
        for name, native, gm in pairs:
            excess = np.array([g["step_s"] - n["step_s"] for g, n in zip(gm["per_step"], native["per_step"])]) * 1e3
            steps = min(len(driver), len(excess))      # the steps both the trace and the runs reach
            d, e = driver[1:steps], excess[1:steps]
            busy, quiet = d > 20, d < 5
            print(f"| {t.name} | {name} | {int(busy.sum())} | {d[busy].sum():.0f} | {e[busy].sum():.0f} | "
                  f"{e[busy].sum() / d[busy].sum():.1f} | {int(quiet.sum())} | {statistics.median(e[quiet]):.0f} | "
                  f"{np.corrcoef(d, e)[0, 1]:.2f} |")

    print("\n### Policy variants on replay (utilization / driver s over the run)\n")
    print("| variant | " + " | ".join(t.name for t in traces) + " |")
    print("|---|" + "---|" * len(traces))
    for label, knobs in VARIANTS.items():
        cells = []
        for t in traces:
            r = replay(t, get("gmlake", **knobs), samples=1)
            cells.append(f"{r.utilization:.3f} / {r.driver_seconds:.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for t in traces:
        r = replay(t, "expandable", samples=1)
        cells.append(f"{r.utilization:.3f} / {r.driver_seconds:.2f}")
    print("| expandable segments | " + " | ".join(cells) + " |")
