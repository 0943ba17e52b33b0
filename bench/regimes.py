"""Which part of the machine made a run slow? Step times against the machine probes (Note [Machine regimes]).

    python -m bench report regimes RESULTS... [--json OUT]

RESULTS are training-suite JSONs (bench train --out), speed-suite folders and single bench/workloads/dynamic.py
JSONs, from runs whose workloads recorded the probes (`gpu_spin_ms`, `launch_ms`, `cpu_ms` in each step; since
2026-11-30). Every run of a workload draws the same shapes step by step, so step k's time in one run against the
median of step k over all runs of that workload (every allocator) is how slow the machine, or the allocator, was at
that step: its `slowness`. Printed per run: median slowness after warm-up and the median of each probe; then per
workload, each probe's correlation with slowness over all steps after warm-up. A probe that tracks slowness names
the part of the machine that changed (GPU clock, launch path, host CPU), which an allocator cannot: its runs can
then be compared on probe-matched steps, or the probe's regime reported beside the ratio.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from bench.cli import OneLineParser
from bench.stall_check import load_runs

PROBES = ("gpu_spin_ms", "launch_ms", "cpu_ms")


def load(paths: list[Path]) -> list[dict]:
    """Runs with per-step records: {"workload", "allocator", "source", "steps": [{"step_s", probes...}], "warmup"}."""
    runs = []
    for path in paths:
        if path.is_file() and path.suffix == ".json":
            data = _read_json(path)
            if isinstance(data, dict) and isinstance(data.get("runs"), list):     # a training-suite JSON
                for run in data["runs"]:
                    steps = run.get("per_step") or _zip_steps(run)
                    runs.append({"workload": run.get("workload"), "allocator": run.get("allocator"),
                                 "source": str(path), "steps": steps, "warmup": max(1, len(steps) // 4)})
                continue
        try:
            found = load_runs([path])
        except ValueError as exc:
            raise ValueError(f"{path}: not a result file ({exc})") from None
        for run in found:
            steps = run.get("per_step") or []
            runs.append({"workload": run.get("workload"), "allocator": run.get("allocator"), "source": str(path),
                         "steps": steps, "warmup": run.get("warmup_steps", max(1, len(steps) // 4))})
    return [r for r in runs if r["steps"] and all("step_s" in s for s in r["steps"])]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None


def _zip_steps(run: dict) -> list[dict]:
    """Per-step records of a run that keeps its step times and probes as parallel lists, per rank (the FSDP workload):
    rank 0's."""
    ranks = run.get("ranks")
    rank0 = ranks[0] if isinstance(ranks, list) and ranks and isinstance(ranks[0], dict) else {}
    times, probes = rank0.get("step_s"), rank0.get("probes") or []
    if not isinstance(times, list):
        return []
    return [{"step_s": t, **(probes[k] if k < len(probes) else {})} for k, t in enumerate(times)]


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else None


def analyse(runs: list[dict]) -> dict:
    """Per run: median slowness and probes after warm-up; per workload: each probe's correlation with slowness."""
    by_workload: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        by_workload[run["workload"]].append(run)
    out = {"runs": [], "workloads": {}}
    for workload, group in sorted(by_workload.items()):
        length = min(len(r["steps"]) for r in group)
        typical = [statistics.median(r["steps"][k]["step_s"] for r in group) for k in range(length)]
        pooled: dict[str, tuple[list, list]] = {p: ([], []) for p in PROBES}
        for run in group:
            slowness, probes = [], defaultdict(list)
            for k in range(run["warmup"], length):
                step = run["steps"][k]
                slow = step["step_s"] / typical[k] if typical[k] > 0 else None
                if slow is None:
                    continue
                slowness.append(slow)
                for p in PROBES:
                    if p in step:
                        probes[p].append(step[p])
                        pooled[p][0].append(step[p])
                        pooled[p][1].append(slow)
            out["runs"].append({
                "workload": workload, "allocator": run["allocator"], "source": run["source"],
                "slowness": statistics.median(slowness) if slowness else None,
                **{p: statistics.median(v) for p, v in probes.items() if v}})
        out["workloads"][workload] = {p: pearson(*pooled[p]) for p in PROBES}
    return out


def main(argv: list[str] | None = None, prog: str = "bench report regimes") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, help="also write the analysis here")
    args = parser.parse_args(argv)
    try:
        runs = load(args.results)
    except (OSError, ValueError) as exc:
        parser.error(f"{exc}")
    if not runs:
        parser.error("no run with per-step times in the results given")
    result = analyse(runs)
    print(f"{'workload':24} {'allocator':12} {'slowness':>8} " + " ".join(f"{p:>11}" for p in PROBES) + "  source")
    for r in result["runs"]:
        cells = " ".join(f"{r[p]:11.3f}" if p in r else f"{'-':>11}" for p in PROBES)
        slow = f"{r['slowness']:8.3f}" if r["slowness"] is not None else f"{'-':>8}"
        print(f"{r['workload']:24} {r['allocator']:12} {slow} {cells}  {r['source']}")
    print("\ncorrelation of slowness with each probe, over the steps after warm-up:")
    for workload, corr in result["workloads"].items():
        print(f"  {workload:24} " + ", ".join(f"{p} {c:+.2f}" if c is not None else f"{p} -" for p, c in corr.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
