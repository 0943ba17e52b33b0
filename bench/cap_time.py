#!/usr/bin/env python3
"""Time under a cap, with the rounds the cap search's single timed probe lacks.

    python -m bench cap time --workload W --allocator A --fraction F [--rounds 3]
    python -m bench cap time --from-cap bench/results/train/cap-.../cap.json [--rounds 3]

Uncapped and capped runs of one pair (cap-search probes) in A B B A order per round; the capped runs' summed time over
the uncapped runs', with each side's spread: a ratio within the spreads is not resolved. --from-cap takes every pair
of a cap search at TIMED_MARGIN x its smallest fit. docs/benchmarks.md, "Under a memory cap", holds the method.
Output: DIR/cap-time.json and a line per pair.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import RESULTS, cap_search
from bench.cli import OneLineParser, add_run_options, check_run_options
from bench.harness import Results, environment, outcome_line


def pairs_from_cap(path: Path) -> list[tuple[str, str, float]]:
    """(workload, allocator, fraction to time at) for every pair of a cap search that found a smallest fit."""
    record = json.loads(path.read_text())
    found = []
    for pair in record["pairs"]:
        fit = cap_search.smallest_fit_shown(pair)
        if fit is not None:
            found.append((pair["workload"], pair["allocator"], min(cap_search.TIMED_MARGIN * fit, 1.0)))
    return found


def spread(values: list[float]) -> float:
    """max / min - 1 of a side's run times (0 for one run)."""
    return max(values) / min(values) - 1 if values else 0.0


def summarize(runs: list[dict]) -> dict:
    """A pair's sums, ratio (capped / uncapped) and each side's spread, from its runs that fit."""
    side = {name: [r["timed_s"] for r in runs if r["fit"] and r.get("timed_s") and (r["fraction"] is None) == uncapped]
            for name, uncapped in (("uncapped", True), ("capped", False))}
    out = {f"{name}_s": [round(v, 4) for v in values] for name, values in side.items()}
    out.update({f"{name}_spread": round(spread(values), 4) for name, values in side.items()})
    out["out_of_memory"] = sum(bool(r.get("oom")) for r in runs)
    out["errors"] = sum(not r["fit"] and not r.get("oom") for r in runs)
    if side["uncapped"] and side["capped"]:
        uncapped = sum(side["uncapped"]) / len(side["uncapped"])
        capped = sum(side["capped"]) / len(side["capped"])
        out["ratio"] = round(capped / uncapped, 4)
        out["resolved"] = abs(out["ratio"] - 1) > max(out["uncapped_spread"], out["capped_spread"])
    return out


def parse_args(argv: list[str] | None = None, prog: str = "bench cap time") -> argparse.Namespace:
    """The command line, checked: any bad value is one line on stderr and exit 2."""
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=cap_search.WORKLOADS)
    parser.add_argument("--allocator", choices=cap_search.ALLOCATORS)
    parser.add_argument("--fraction", type=float, help="the cap to time at, a fraction of the device's memory")
    parser.add_argument("--from-cap", metavar="CAP_JSON", help="a cap search's cap.json: time every pair it fit")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of uncapped, capped, capped, uncapped")
    add_run_options(parser, steps=20)
    parser.add_argument("--out", default=str(RESULTS / "train" / "cap-time"))
    args = parser.parse_args(argv)
    check_run_options(parser, args)
    args.device = "cuda"              # the probes' workloads run capped on the GPU
    if args.rounds < 1:
        parser.error("need --rounds >= 1")
    if args.from_cap:
        if args.workload or args.allocator or args.fraction is not None:
            parser.error("give either --from-cap or --workload, --allocator and --fraction")
        try:
            args.pairs = pairs_from_cap(Path(args.from_cap))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--from-cap {args.from_cap}: not a cap search's cap.json ({type(exc).__name__}: {exc})")
        if not args.pairs:
            parser.error(f"--from-cap {args.from_cap}: no pair found a smallest fit")
    else:
        if not (args.workload and args.allocator and args.fraction is not None):
            parser.error("need --workload, --allocator and --fraction (or --from-cap)")
        if not 0 < args.fraction <= 1:
            parser.error(f"--fraction needs a number in (0, 1], got {args.fraction}")
        args.pairs = [(args.workload, args.allocator, args.fraction)]
    return args


def main(argv: list[str] | None = None, prog: str = "bench cap time") -> None:
    args = parse_args(argv, prog)
    out = Path(args.out)
    results = Results(out, "cap-time.json", {"environment": environment(), "settings": vars(args), "runs": [],
                                             "pairs": []}, args.deadline)
    record, save = results.record, results.save

    for workload, allocator, fraction in args.pairs:
        runs = []
        for round_ in range(args.rounds):
            for capped in (False, True, True, False):
                left = args.timeout if results.left() is None else results.left()
                walls = sorted(r.get("wall_s", 0.0) for r in runs if r["fit"])
                if left < (walls[len(walls) // 2] if walls else 1.0):     # a run stopped at the deadline tells nothing
                    record["stopped"] = f"deadline: {left:.0f} s left"
                    break
                run = cap_search.run_probe(workload, allocator, "capped" if capped else "uncapped",
                                           fraction if capped else None, min(args.timeout, left), settings=args,
                                           out=out, index=len(record["runs"]))
                run["round"] = round_
                runs.append(run)
                record["runs"].append(run)
                cap = f"capped at {fraction:.5f}" if capped else "uncapped"
                print(f"{workload} / {allocator} round {round_} {cap}: {outcome_line(run)}", flush=True)
                save()
            if "stopped" in record:
                break
        summary = {"workload": workload, "allocator": allocator, "fraction": fraction, **summarize(runs)}
        record["pairs"].append(summary)
        save()
        print(f"== {workload} / {allocator}: capped / uncapped "
              + (f"{summary['ratio']:.3f}" if "ratio" in summary else "-")
              + f" (spread uncapped {summary['uncapped_spread']:.1%}, capped {summary['capped_spread']:.1%}; "
              + ("resolved" if summary.get("resolved") else "not resolved") + ")", flush=True)
    print(f"results in {out / 'cap-time.json'}")
