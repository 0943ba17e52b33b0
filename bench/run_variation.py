"""How many runs resolving a speed difference would take, from the runs' own variation.

    python -m bench report variation [RESULTS_DIR]

Groups the finished runs of every results JSON under RESULTS_DIR by file, workload and allocator and takes each
group's coefficient of variation `cv` of its speed; a gap `g` (1 % and 2 %) at two standard errors takes about
8 cv^2 / g^2 runs of each allocator.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from bench import RESULTS
from bench.cli import OneLineParser

GAPS = (0.01, 0.02)     # the speed gaps the runs needed are shown for


def variations(root: Path) -> list[float]:
    """The coefficient of variation of every group of repeated runs under `root`."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for path in sorted(root.rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        runs = record.get("runs") if isinstance(record, dict) else None
        for run in runs if isinstance(runs, list) else ():
            if not isinstance(run, dict) or run.get("error") or not run.get("workload") or not run.get("allocator"):
                continue
            speed = run.get("tokens_per_s") or (1 / run["timed_s"] if run.get("timed_s") else None)
            if speed:
                groups.setdefault((str(path), run["workload"], run["allocator"]), []).append(speed)
    return sorted(statistics.stdev(v) / statistics.mean(v) for v in groups.values() if len(v) >= 2)


def runs_needed(cv: float, gap: float) -> int:
    """Runs of each allocator to resolve a relative `gap` at two standard errors, at coefficient of variation cv."""
    return math.ceil(round(8 * cv * cv / (gap * gap), 6))      # round: 8 * 0.05**2 / 0.01**2 is 200.00000000000003


def main(argv: list[str] | None = None, prog: str = "bench report variation") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=RESULTS / "train")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"no such results folder: {args.results}")
    cvs = variations(args.results)
    if not cvs:
        parser.error(f"no repeated runs under {args.results}")
    quartiles = statistics.quantiles(cvs, n=4) if len(cvs) > 1 else [cvs[0]] * 3
    print(f"{len(cvs)} groups of repeated runs; coefficient of variation {cvs[0]:.1%}-{cvs[-1]:.1%}, "
          f"quartiles {quartiles[0]:.1%} / {quartiles[1]:.1%} / {quartiles[2]:.1%}")
    for gap in GAPS:
        print(f"runs of each allocator to resolve a {gap:.0%} gap: "
              + ", ".join(f"{runs_needed(cv, gap)} at {cv:.1%}" for cv in quartiles))
    return 0
