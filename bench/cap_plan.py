"""Probes that check replay's thresholds on the GPU: per workload and allocator, replay's smallest device and
smallest cap from the workload's trace, and the probes just above and below each, as `bench cap probe` takes them.

    python -m bench cap plan [--out bench/plans/edge-probes.json] [--margin 0.003] [--resolution 1e-4]
        [--pairs WORKLOAD=TRACE ...] [--allocators gmlake gmlake-paper expandable]

A probe at threshold x (1 + margin) should fit and one at x (1 - margin) should not; gmlake's pairs and the next
allocator's come first, so that a deadline in `bench cap probe` cuts the others. Output: the thresholds per pair and
two lists of WORKLOAD:ALLOCATOR@BYTES, `device` (for --device-limit) and `cap`, each item with its `expect`.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench import cap_search
from bench.cli import OneLineParser

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "results" / "traces"
# The training suite's workloads with a 20-step trace of the probes' own shapes (seed 0, the suite's batch range),
# captured by bench cap search --capture: what the probes replay.
PAIRS = {"opt1.3b-lora-ckpt": TRACES / "opt1.3b-lora-ckpt-20steps-expandable-capped.gmtrace",
         "gpt2xl-lora-ckpt": TRACES / "gpt2xl-lora-ckpt-20steps-expandable.gmtrace",
         "opt1.3b-ckpt": TRACES / "opt1.3b-ckpt-20steps-gmlake-nocap.gmtrace"}
MARGIN = 0.003
RESOLUTION = 1e-4


def thresholds(workload: str, trace_path: Path, allocator: str, resolution: float) -> dict:
    """Replay's smallest device and smallest cap of `workload`'s trace under `allocator`'s replay policy."""
    from gmlake.sim.cap import limits
    from gmlake.sim.trace import load

    policy = cap_search.replay_policy(allocator)
    row = limits(load(trace_path), policy, resolution=resolution)
    return {"workload": workload, "allocator": allocator, "policy": policy,
            "trace": str(trace_path.relative_to(ROOT) if trace_path.is_relative_to(ROOT) else trace_path),
            **{k: row[k] for k in ("peak_allocated", "uncapped_peak_reserved", "smallest_device_memory",
                                   "largest_failing_device_memory", "smallest_cap", "largest_failing_cap")}}


def probes(rows: list[dict], margin: float, limit: str) -> list[dict]:
    """Per pair, in the rows' order, a probe just above replay's threshold (expected to fit) and one just below
    (expected to run out of memory), for `limit` "device" (smallest_device_memory) or "cap" (smallest_cap)."""
    key = "smallest_device_memory" if limit == "device" else "smallest_cap"
    out = []
    for row in rows:
        for expect, factor in (("fit", 1 + margin), ("oom", 1 - margin)):
            size = math.ceil(row[key] * factor) if expect == "fit" else math.floor(row[key] * factor)
            out.append({"probe": f"{row['workload']}:{row['allocator']}@{size}", "expect": expect,
                        "threshold": row[key]})
    return out


def ordered(rows: list[dict], allocators: list[str]) -> list[dict]:
    """The rows by priority: workload by workload, gmlake's and the first other allocator's; then, workload by
    workload, the other allocators' in the order given."""
    rank = {a: i for i, a in enumerate(sorted(allocators, key=lambda a: a != "gmlake"))}
    return sorted(rows, key=lambda r: (rank[r["allocator"]] > 1, list(PAIRS).index(r["workload"])
                                       if r["workload"] in PAIRS else 0, rank[r["allocator"]]))


def parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", metavar="WORKLOAD=TRACE",
                        help="workloads and their traces (default: " + ", ".join(PAIRS) + ")")
    parser.add_argument("--allocators", nargs="+", default=["gmlake", "gmlake-paper", "expandable"],
                        choices=cap_search.ALLOCATORS)
    parser.add_argument("--margin", type=float, default=MARGIN, help="relative distance of each probe from the "
                        f"threshold (default {MARGIN})")
    parser.add_argument("--resolution", type=float, default=RESOLUTION,
                        help=f"replay's bisection, relative (default {RESOLUTION})")
    parser.add_argument("--out", default=str(ROOT / "bench" / "plans" / "edge-probes.json"))
    args = parser.parse_args(argv)
    if not 0 < args.margin < 0.5 or not 0 < args.resolution < args.margin:
        parser.error("need 0 < --resolution < --margin < 0.5")
    pairs = {}
    for item in args.pairs or [f"{w}={p}" for w, p in PAIRS.items()]:
        workload, sep, path = item.partition("=")
        if not sep or workload not in cap_search.WORKLOADS:
            parser.error(f"--pairs takes WORKLOAD=TRACE with a workload of bench cap search, got {item!r}")
        if not Path(path).is_file():
            parser.error(f"--pairs {workload}: no such file: {path}")
        pairs[workload] = Path(path).resolve()
    args.pairs = pairs
    args.allocators = list(dict.fromkeys(args.allocators))
    for workload in pairs:
        for allocator in args.allocators:
            if allocator not in cap_search.SUITES[workload].ALLOCATORS:
                parser.error(f"workload {workload} takes no allocator {allocator!r}")
    try:
        for allocator in args.allocators:
            cap_search.replay_policy(allocator)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None, prog: str = "bench cap plan") -> None:
    args = parse_args(argv, prog)
    rows = ordered([thresholds(w, p, a, args.resolution) for w, p in args.pairs.items() for a in args.allocators],
                   args.allocators)
    plan = {"made_by": f"python -m bench cap plan --margin {args.margin} --resolution {args.resolution}",
            "margin": args.margin, "resolution": args.resolution, "thresholds": rows,
            "device": probes(rows, args.margin, "device"), "cap": probes(rows, args.margin, "cap")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(plan, indent=1) + "\n")
    for row in rows:
        p = row["peak_allocated"]
        print(f"{row['workload']:<20} {row['allocator']:<13} device {row['smallest_device_memory']:>15,} B "
              f"({row['smallest_device_memory'] / p:.4f} P)  cap {row['smallest_cap']:>15,} B "
              f"({row['smallest_cap'] / p:.4f} P)")
    print(f"wrote {out}: {len(plan['device'])} device-limit probes, {len(plan['cap'])} cap probes")
