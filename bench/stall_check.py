"""The stall model against the GPU: does priced driver time x the stall factor predict the training time an
allocator loses to its driver calls?

    python -m bench report stall RESULTS... [--tolerance 0.3] [--json OUT]

RESULTS are speed-suite folders and single dynamic.py run JSONs. Per gmlake run: its driver calls after warm-up
priced with the cost table, the predicted loss, and the measured one against the median native run of the same source. A prediction is judged only
beyond its baseline's spread; exit 1 where a judged one misses by more than the tolerance, 2 on bad input.
docs/benchmarks.md ("Speed, and what the runs can resolve") holds the method.
"""
from __future__ import annotations

import json
import statistics
import sys
import tarfile
from pathlib import Path

from bench.cli import OneLineParser, cell, render_table
from gmlake.sim.replay import driver_costs, driver_seconds


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


def check(runs: list[dict], tolerance: float, costs: dict | None = None) -> list[dict]:
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
        priced = driver_seconds(after, costs)
        predicted = priced * costs["stall_factor"]
        measured = run["timed_s"] - median
        judged = spread is not None and predicted / median > spread
        error = measured / predicted - 1.0 if predicted else None
        rows.append({"workload": run["workload"], "allocator": policy, "source": run.get("source"),
                     "baseline": used, "native_runs": len(native),
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
    parser.add_argument("--tolerance", type=float, default=0.3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        rows = check(load_runs(args.results), args.tolerance)
    except (OSError, ValueError, KeyError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    factor = driver_costs()["stall_factor"]
    print(f"stall factor {factor}; loss = time after warm-up - the median of native's runs in the same source (a "
          f"single run JSON: of every source); judged where the prediction exceeds that baseline's spread")
    cells = []
    for r in rows:
        head = [r["workload"], r["allocator"], Path(r["source"]).name if r["source"] else "-"]
        if r["baseline"] is None:
            cells.append([*head, "none", *["-"] * 8, "no native run in its source"])
            continue
        cells.append([*head, f"{r['baseline']} ({r['native_runs']})", f"{r['native_s']:.3f}",
                      cell(r["native_spread"], ".1%"), f"{r['priced_s']:.4f}", cell(r.get("busy_s"), ".4f"),
                      f"{r['predicted_s']:.3f}", f"{r['measured_s']:+.3f}", cell(r["ratio"], ".2f"),
                      "not resolvable" if not r["judged"] else f"{'ok' if r['ok'] else 'MISS'} ({r['error']:+.0%})"])
    columns = ["workload", "allocator", "source", "baseline", "native s", "spread", "priced s", "busy s", "predicted",
               "measured", "x priced", "verdict"]
    print(render_table("", columns, cells, left=("workload", "allocator", "source", "baseline", "verdict"),
                       borders=False), end="")
    judged = [r for r in rows if r["judged"]]
    print(f"{sum(bool(r['ok']) for r in judged)} of {len(judged)} judged predictions within {args.tolerance:.0%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any(r["ok"] is False for r in rows) else 0
