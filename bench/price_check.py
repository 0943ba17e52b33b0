"""gmlake's driver price table against the time measured inside the driver's calls on the GPU, and the driver's
steady-state share of step time.

    python -m bench report prices RESULTS... [--json OUT]

RESULTS are cap-search and speed-suite folders and run JSONs; every gmlake run (each FSDP rank) that recorded
`driver_busy_s` gives a row: driver calls, priced and measured seconds and their ratio, and after warm-up the
measured share of the timed steps; then the ratio's quartiles. Bad input: one line, exit 2.
"""
from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path

from bench.cli import OneLineParser, cell, error_line, json_object, render_table
from bench.stall_check import load_runs
from gmlake.sim.replay import driver_costs, driver_seconds


def parse(text: str | bytes, where: str) -> dict:
    """The workload summary in `text`; ValueError (not JSON) or TypeError (not an object) naming `where`."""
    return json_object(text, where, "a workload summary")


def cap_runs(folder: Path) -> list[dict]:
    """The probe summaries of a cap-search folder, each tagged with its workload, allocator and purpose (from
    cap.json's probe list, by index; else from the file name NNN-WORKLOAD-ALLOCATOR-PURPOSE.json) and source."""
    listed = {}
    if (folder / "cap.json").exists():
        cap = parse((folder / "cap.json").read_text(), f"{folder}/cap.json")
        listed = {p["index"]: p for p in cap.get("probes", [])}
    found: list[tuple[str, dict]] = []
    if (folder / "probes.tar.gz").exists():
        with tarfile.open(folder / "probes.tar.gz") as tar:
            found += [(Path(m.name).name, parse(tar.extractfile(m).read(), f"{folder}/probes.tar.gz:{m.name}"))
                      for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")]
    found += [(p.name, parse(p.read_text(), str(p))) for p in sorted((folder / "probes").glob("*.json"))]
    runs = []
    for name, run in sorted(found, key=lambda f: f[0]):
        index, _, rest = name.removesuffix(".json").split(".rank")[0].partition("-")
        workload, allocator, purpose = (rest.rsplit("-", 2) + ["?", "?"])[:3]
        probe = listed.get(int(index), {}) if index.isdigit() else {}
        runs.append({**run, "workload": probe.get("workload", workload), "purpose": probe.get("purpose", purpose),
                     "allocator": run.get("allocator") or probe.get("allocator", allocator), "source": str(folder)})
    return runs


def load(paths: list[Path]) -> list[dict]:
    """Every completed run (one with `timed_s`) in `paths`; FileNotFoundError or ValueError on bad input."""
    runs: list[dict] = []
    for path in paths:
        if path.is_dir() and any((path / n).exists() for n in ("cap.json", "probes.tar.gz", "probes")):
            runs += [r for r in cap_runs(path) if r.get("timed_s")]
        elif path.is_dir() and any((path / n).exists() for n in ("summary.json", "runs.tar.gz", "runs")):
            try:
                runs += [{**r, "purpose": "suite"} for r in load_runs([path])]
            except ValueError as err:
                raise ValueError(f"{path}: a run that is not JSON ({err})") from None
        elif path.is_dir():
            raise ValueError(f"{path}: neither a cap-search folder (cap.json, probes.tar.gz) nor a speed-suite "
                             f"folder (summary.json, runs.tar.gz or runs/)")
        elif not path.exists():
            raise FileNotFoundError(f"no such results: {path}")
        elif isinstance((data := parse(path.read_text(), str(path))).get("runs"), list):
            runs += [{**r, "purpose": "run", "source": str(path)} for r in data["runs"] if r.get("timed_s")]
        elif data.get("timed_s"):
            runs += [{**r, "purpose": "run"} for r in load_runs([path])]
        else:
            raise ValueError(f"{path}: not a workload summary (no timed_s)")
    return runs


def rows(runs: list[dict], costs: dict | None = None) -> tuple[list[dict], int]:
    """One row per gmlake run (per rank under FSDP) that recorded `driver_busy_s`, and how many gmlake runs/ranks
    were left out for lack of it (runs from before 2026-12-01)."""
    costs = costs or driver_costs()
    # The factor compares the calls bench micro prices in a tight loop with their time in training; a synchronize's
    # price is the step time it costs (bench sync-price), not a call's time, so it stays out of this comparison.
    costs = {**costs, "per_call": {k: v for k, v in costs["per_call"].items() if k != "synchronize"}}
    out, skipped = [], 0
    for run in runs:
        ranks = [(i, r) for i, r in enumerate(run["ranks"])] if run.get("ranks") else [(None, run)]
        for rank, part in ranks:
            whole, after = part.get("gmlake"), part.get("gmlake_after_warmup") or {}
            if not whole:
                continue
            if whole.get("driver_busy_s") is None:
                skipped += 1
                continue
            timed = part.get("timed_s") or run["timed_s"]
            priced, busy = driver_seconds(whole, costs), whole["driver_busy_s"]
            busy_after = after.get("driver_busy_s")
            out.append({"workload": run["workload"], "allocator": run.get("gmlake_policy") or run["allocator"],
                        "purpose": run.get("purpose"), "source": run["source"], "rank": rank,
                        "memory_fraction": run.get("memory_fraction"), "capped": run.get("memory_fraction") is not None,
                        "calls": sum(whole["calls"].values()), "priced_s": priced, "busy_s": busy,
                        "ratio": busy / priced if priced else None, "timed_s": timed,
                        "busy_after_s": busy_after, "priced_after_s": driver_seconds(after, costs) if after else None,
                        "share_after_pct": 100 * busy_after / timed if busy_after is not None else None})
    return out, skipped


def summarize(table: list[dict], skipped: int) -> dict:
    """Median, quartiles and range of measured / priced over whole runs; the uncapped runs' after-warm-up share."""
    ratios = sorted(r["ratio"] for r in table if r["ratio"] is not None)
    shares = [r["share_after_pct"] for r in table if not r["capped"] and r["share_after_pct"] is not None]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios or [None]) * 3
    return {"n": len(ratios), "skipped_without_busy": skipped, "ratio_median": statistics.median(ratios) if ratios
            else None, "ratio_q1": q1, "ratio_q3": q3, "ratio_min": min(ratios, default=None),
            "ratio_max": max(ratios, default=None), "uncapped_n": len(shares),
            "uncapped_share_after_pct_min": min(shares, default=None),
            "uncapped_share_after_pct_max": max(shares, default=None)}


def render(table: list[dict], s: dict) -> str:
    """The rows as a table, and the summary line."""
    if not s["n"]:                  # no table of empty rows
        return f"no gmlake run with driver_busy_s ({s['skipped_without_busy']} without it)"
    columns = ["workload", "allocator", "purpose", "source", "rank", "capped", "calls", "priced s", "measured s",
               "meas/priced", "after: meas s", "% of timed", "after: priced s"]
    cells = [[r["workload"], r["allocator"], r["purpose"] or "-", Path(r["source"]).name,
              cell(r["rank"], "d"), f"{r['memory_fraction']:.4f}" if r["capped"] else "no", str(r["calls"]),
              cell(r["priced_s"], ".4f"), cell(r["busy_s"], ".4f"), cell(r["ratio"], ".2f"),
              cell(r["busy_after_s"], ".4f"), cell(r["share_after_pct"], ".2f"), cell(r["priced_after_s"], ".4f")]
             for r in table]
    share = ("no uncapped run" if not s["uncapped_n"] else f"{s['uncapped_share_after_pct_min']:.2f}-"
             f"{s['uncapped_share_after_pct_max']:.2f} % over {s['uncapped_n']} uncapped runs/ranks")
    return (render_table("driver time: gmlake's price table (priced) against the GPU (measured inside the calls)",
                         columns, cells, left=("workload", "allocator", "purpose", "source"))
            + f"measured / priced over whole runs: median {s['ratio_median']:.2f} (quartiles "
            f"{s['ratio_q1']:.2f}-{s['ratio_q3']:.2f}, range {s['ratio_min']:.2f}-{s['ratio_max']:.2f}), n = "
            f"{s['n']}; {s['skipped_without_busy']} gmlake runs/ranks without driver_busy_s skipped. Driver time "
            f"after warm-up, share of step time: {share}")


def main(argv: list[str] | None = None, prog: str = "bench report prices") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, help="write the rows and the summary here")
    args = parser.parse_args(argv)
    if args.json and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: no such folder: {args.json.parent}")
    try:
        table, skipped = rows(load(args.results))
    except (OSError, ValueError, KeyError, TypeError, tarfile.TarError) as err:
        parser.error(error_line(err) if not isinstance(err, KeyError) else f"missing key {err} in the results")
    s = summarize(table, skipped)
    print(render(table, s))
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "summary": s}, indent=1))
    return 0
