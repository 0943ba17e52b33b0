"""The stall model against the GPU: does priced driver time x the stall factor predict the training time an
allocator loses to its driver calls?

    python -m bench report stall RESULTS... [--traces DIR] [--tolerance 0.3] [--json OUT]

RESULTS are speed-suite folders and single dynamic.py run JSONs. Per gmlake run: its driver calls after warm-up
priced with the cost table (or, with --traces, by replaying the native trace from the first timed step), the
predicted loss, and the measured one against the median native run of the same source. A prediction is judged only
beyond its baseline's spread; exit 1 where a judged one misses by more than the tolerance, 2 on bad input.
docs/benchmarks.md ("Speed, and what the runs can resolve") holds the method.
"""
from __future__ import annotations

import json
import statistics
import sys
import tarfile
from pathlib import Path

from bench.cli import OneLineParser
from gmlake.sim.replay import driver_costs, driver_seconds, run_requests
from gmlake.sim.trace import ALLOC, load


def load_runs(paths: list[Path]) -> list[dict]:
    """Every run record in `paths` (speed-suite folders or single dynamic.py JSONs), each tagged with its `source`
    (the path it came from) and `source_kind` ("suite" for a folder, "run" for a single run JSON)."""
    runs = []
    for path in paths:
        if path.is_dir():
            found = []
            if (path / "runs.tar.gz").exists():
                with tarfile.open(path / "runs.tar.gz") as tar:
                    found += [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")]
            found += [json.loads(p.read_text()) for p in sorted((path / "runs").glob("*.json"))]
            runs += [{**run, "source": str(path), "source_kind": "suite"} for run in found]
        elif path.is_file():
            run = json.loads(path.read_text())
            run.setdefault("allocator", run.get("gmlake_policy") or "native")
            if run.get("gmlake_policy") and run["allocator"] == "gmlake":
                run["allocator"] = run["gmlake_policy"]
            runs.append({**run, "source": str(path), "source_kind": "run"})
        else:
            raise FileNotFoundError(f"no such results: {path}")
    return [r for r in runs if r.get("timed_s")]


def baseline(run: dict, runs: list[dict]) -> tuple[list[float], str]:
    """Native's timed seconds to compare `run` with, and which they are: native's runs of the workload from the run's
    own source ("same source"); for a single run JSON without any, those of every source ("all sources"). An empty
    list where a suite folder has no native run of the workload."""
    natives = [r for r in runs if r["workload"] == run["workload"] and r["allocator"] == "native"]
    same = [r["timed_s"] for r in natives if r.get("source") == run.get("source")]
    if same or run.get("source_kind") != "run":
        return same, "same source"
    return [r["timed_s"] for r in natives], "all sources"


def replayed_after_warmup(traces: Path, workload: str, policy: str, warmup: int, costs: dict) -> float | None:
    """Priced driver time of `policy` on the captured trace of `workload`, for the steps after `warmup` alone; None
    where no trace with step markers is there."""
    capture = traces / f"{workload}-capture.json"
    found = [p for p in (traces / f"{workload}-native.pickle.gz", traces / f"{workload}-native.gmtrace") if p.exists()]
    if not found or not capture.exists():
        return None
    trace_path = found[0]
    steps = json.loads(capture.read_text())["per_step"]
    allocations = steps[warmup].get("allocations_before") if warmup < len(steps) else None
    if allocations is None:
        return None
    trace = load(trace_path)
    alloc_positions = (trace.requests()["action"] == ALLOC).nonzero()[0]
    if allocations > len(alloc_positions):
        raise ValueError(f"{trace_path}: {len(alloc_positions)} allocations, but the run made {allocations} before "
                         f"step {warmup} (a truncated trace?)")
    upto = int(alloc_positions[allocations]) if allocations < len(alloc_positions) else len(trace.requests())
    before, _ = run_requests(trace, policy, upto=upto)
    everything, _ = run_requests(trace, policy)
    return driver_seconds(everything.stats(), costs) - driver_seconds(before.stats(), costs)


def check(runs: list[dict], tolerance: float, costs: dict | None = None, traces: Path | None = None) -> list[dict]:
    """One row per gmlake run: predicted and measured loss against native's median (see `baseline()`), and whether
    it is judged. A run without a baseline gets a row with `baseline` None and no numbers but its own."""
    costs = costs or driver_costs()
    rows = []
    for run in runs:
        after = run.get("gmlake_after_warmup")
        if not after:
            continue
        policy = run.get("gmlake_policy") or "gmlake"
        native, used = baseline(run, runs)
        if not native:
            rows.append({"workload": run["workload"], "allocator": policy, "source": run.get("source"),
                         "baseline": None, "native_runs": 0, "timed_s": run["timed_s"], "judged": False, "ok": None})
            continue
        median = statistics.median(native)
        spread = (max(native) - min(native)) / median if len(native) > 1 else None
        replayed = traces and replayed_after_warmup(traces, run["workload"], policy, run["warmup_steps"], costs)
        priced = replayed if replayed is not None else driver_seconds(after, costs)
        predicted = priced * costs["stall_factor"]
        measured = run["timed_s"] - median
        judged = spread is not None and predicted / median > spread
        error = measured / predicted - 1.0 if predicted else None
        rows.append({"workload": run["workload"], "allocator": policy, "source": run.get("source"),
                     "baseline": used, "native_runs": len(native),
                     "priced_by": "GPU counts" if replayed is None else "replay",
                     "native_s": median, "native_spread": spread, "timed_s": run["timed_s"], "priced_s": priced,
                     "predicted_s": predicted, "measured_s": measured, "ratio": measured / priced if judged else None,
                     # seconds measured inside the driver's calls after warm-up (runs since 2026-12-01), or None
                     "busy_s": after.get("driver_busy_s"),
                     "judged": judged, "error": error,
                     "ok": (abs(error) <= tolerance) if judged and error is not None else None})
    return rows


def main(argv: list[str] | None = None, prog: str = "bench report stall") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--traces", type=Path, help="price by replaying the traces in this folder")
    parser.add_argument("--tolerance", type=float, default=0.3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.traces is not None and not args.traces.is_dir():
            raise FileNotFoundError(f"no such traces folder: {args.traces}")
        rows = check(load_runs(args.results), args.tolerance, traces=args.traces)
    except (OSError, ValueError, KeyError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    factor = driver_costs()["stall_factor"]
    print(f"stall factor {factor}; loss = time after warm-up - the median of native's runs in the same source (a "
          f"single run JSON: of every source); judged where the prediction exceeds that baseline's spread")
    print(f"{'workload':8} {'allocator':13} {'source':20} {'baseline':15} {'priced by':10} {'native s':>8} "
          f"{'spread':>7} {'priced s':>8} {'busy s':>8} {'predicted':>9} {'measured':>8} {'x priced':>8}  verdict")
    for r in rows:
        source = Path(r["source"]).name if r["source"] else "-"
        if r["baseline"] is None:
            print(f"{r['workload']:8} {r['allocator']:13} {source:20} {'none':15} {'-':10} {'-':>8} {'-':>7} {'-':>8} "
                  f"{'-':>8} {'-':>9} {'-':>8} {'-':>8}  no native run in its source")
            continue
        verdict = ("not resolvable" if not r["judged"] else
                   f"{'ok' if r['ok'] else 'MISS'} ({r['error']:+.0%})")
        spread = f"{r['native_spread']:.1%}" if r["native_spread"] is not None else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        used = f"{r['baseline']} ({r['native_runs']})"
        busy = f"{r['busy_s']:8.4f}" if r.get("busy_s") is not None else f"{'-':>8}"
        print(f"{r['workload']:8} {r['allocator']:13} {source:20} {used:15} {r['priced_by']:10} {r['native_s']:8.3f} "
              f"{spread:>7} {r['priced_s']:8.4f} {busy} {r['predicted_s']:9.3f} {r['measured_s']:+8.3f} {ratio:>8}  "
              f"{verdict}")
    judged = [r for r in rows if r["judged"]]
    print(f"{sum(bool(r['ok']) for r in judged)} of {len(judged)} judged predictions within {args.tolerance:.0%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any(r["ok"] is False for r in rows) else 0
