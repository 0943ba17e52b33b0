"""At the edge of memory, by replay: per trace and policy, where it fits and what fitting costs there.

    python -m bench edge [TRACE ...] [--policy SPEC ...] [--resolution 2e-4] [--json OUT.json] [--check EXPECTED.json]

Per trace, P is its peak allocated under the expandable model; per policy the smallest device and cap as multiples
of P, the priced driver time at 1.02x and 1.05x P, and the uncapped figures; then the goals. Traces default to every
bundled and test one. Replay is deterministic: --json writes the figures, --check compares them with a file (exit 1
on any difference). docs/benchmarks.md, "At the edge of memory, by replay", holds the method and the table.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from bench import ROOT
from bench.cli import parser as command_parser
from gmlake.policies import choice_of
from gmlake.sim.cap import smallest_cap, smallest_device_memory
from gmlake.sim.replay import bundled_traces, driver_seconds, run_requests
from gmlake.sim.trace import TraceError, load

TRACE_DIRS = [ROOT / "tests" / "data", ROOT / "tests" / "data" / "results" / "traces"]
POLICIES = ("gmlake", "expandable", "gmlake-paper")
MARGINS = (1.02, 1.05)          # the limits the speed goal is priced at, over P
UNBINDING = 2.0                 # a cap this far over P never binds
FIT_SLACK = 0.002               # the fit goal: <= min(expandable, gmlake-paper) + this much of P
SPEED_RATIO = 1.5               # the speed goal at the edge: priced driver time <= this x the expandable model's
UNCAPPED_RATIO = 2.0            # without a limit: <= this x the expandable model's priced driver time
UTILIZATION = 0.99


def default_traces() -> list[Path]:
    found = list(bundled_traces())
    for folder in TRACE_DIRS:
        found += sorted(p for p in folder.glob("*") if p.name.endswith((".gmtrace", ".pickle.gz")))
    return found


def run(trace, policy, *, device: int | None = None, cap: int = 0) -> dict:
    """One replay's figures (no timeline, no second pass to the peak: only what the table needs)."""
    alloc, out = run_requests(trace, policy, device_memory=device, samples=1, cap=cap)
    stats = alloc.stats()
    return {"ooms": out["ooms"], "peak_allocated": out["peak_allocated"], "peak_reserved": out["peak_reserved"],
            "driver_calls": sum(stats["calls"].values()), "driver_seconds": driver_seconds(stats),
            "stitches": stats["stitches"], "stitched_handles": stats["stitched_handles"],
            # unpriced: a synchronize drains the GPU's queue, a cost no per-call price holds
            "synchronizes": stats["calls"]["synchronize"], "tails_cut_at_reuse": stats["tails_cut_at_reuse"]}


def measure(trace, policy, resolution: float, peak: int) -> dict:
    """Every figure of one policy on one trace whose peak allocated is `peak` (P)."""
    label = choice_of(policy).label
    uncapped = run(trace, policy)
    if uncapped["ooms"]:
        raise RuntimeError(f"{trace.name}: {label} runs out of memory uncapped")
    row = {"trace": trace.name, "policy": label, "peak_allocated": peak, "uncapped": uncapped,
           "utilization": uncapped["peak_allocated"] / uncapped["peak_reserved"]}
    row["smallest_device"] = smallest_device_memory(trace, policy, resolution)[0]
    row["smallest_cap"] = smallest_cap(trace, policy, resolution)[0]
    for margin in MARGINS:
        row[f"cap_{margin}"] = run(trace, policy, cap=math.ceil(margin * peak))
        row[f"device_{margin}"] = run(trace, policy, device=math.ceil(margin * peak))
    row["cap_unbinding"] = run(trace, policy, cap=math.ceil(UNBINDING * peak))
    return row


def goals(rows: list[dict], default: str = "gmlake") -> list[dict]:
    """Per trace, each goal of the default policy met or not, with the figures it was judged on."""
    out = []
    by_trace: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_trace.setdefault(r["trace"], {})[r["policy"]] = r
    for name, pol in by_trace.items():
        if not {default, "expandable", "gmlake-paper"} <= pol.keys() or default in ("expandable", "gmlake-paper"):
            continue
        d, e, p = pol[default], pol["expandable"], pol["gmlake-paper"]
        peak = d["peak_allocated"]
        g = {"trace": name}
        for limit in ("smallest_device", "smallest_cap"):
            bound = min(e[limit], p[limit]) + FIT_SLACK * peak
            g[limit] = {"ratio": d[limit] / peak, "bound": bound / peak, "met": d[limit] <= bound}
        for margin in MARGINS:
            for kind in ("cap", "device"):
                k = f"{kind}_{margin}"
                ours, theirs = d[k], e[k]
                ratio = ours["driver_seconds"] / theirs["driver_seconds"] if theirs["driver_seconds"] else math.inf
                g[k] = {"ratio": None if ours["ooms"] or theirs["ooms"] else ratio,
                        "oom": bool(ours["ooms"]), "expandable_oom": bool(theirs["ooms"]),
                        # a limit the expandable model does not fit under asks only that the default fits
                        "met": not ours["ooms"] and (bool(theirs["ooms"]) or ratio <= SPEED_RATIO)}
        u, c = d["uncapped"], d["cap_unbinding"]
        g["unbinding"] = {"met": (c["driver_calls"], c["peak_reserved"]) == (u["driver_calls"], u["peak_reserved"])
                          and not c["ooms"]}
        ratio = u["driver_seconds"] / e["uncapped"]["driver_seconds"]
        g["uncapped"] = {"utilization": d["utilization"], "ratio": ratio,
                         "met": d["utilization"] >= UTILIZATION and ratio <= UNCAPPED_RATIO}
        out.append(g)
    return out


def print_tables(rows: list[dict], judged: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=250)
    t = Table(title="At the edge of memory, by replay (limits as multiples of the peak allocated P; driver time: "
                    "priced seconds; 'oom': the replay does not complete)")
    for col in ("trace", "policy", "P GiB", "device", "cap", "cap 1.02", "dev 1.02", "cap 1.05", "dev 1.05",
                "calls 2x cap / none", "resv 2x cap / none GiB", "util", "none s"):
        t.add_column(col, justify="left" if col in ("trace", "policy") else "right")

    def priced(r: dict) -> str:
        return "oom" if r["ooms"] else f"{r['driver_seconds']:.3f}"

    for r in rows:
        u, c = r["uncapped"], r["cap_unbinding"]
        p = r["peak_allocated"]
        t.add_row(r["trace"], r["policy"], f"{p / 2**30:.2f}", f"{r['smallest_device'] / p:.4f}",
                  f"{r['smallest_cap'] / p:.4f}", *(priced(r[f"{k}_{m}"]) for m in MARGINS for k in ("cap", "device")),
                  f"{c['driver_calls']} / {u['driver_calls']}",
                  f"{c['peak_reserved'] / 2**30:.3f} / {u['peak_reserved'] / 2**30:.3f}",
                  f"{r['utilization']:.4f}", f"{u['driver_seconds']:.3f}")
    console.print(t)
    g = Table(title="Goals of the default policy (x: missed; fit: ratio to P against the bound; speed: priced time "
                    "over the expandable model's)")
    for col in ("trace", "device", "cap", "cap 1.02", "dev 1.02", "cap 1.05", "dev 1.05", "2x cap", "uncapped"):
        g.add_column(col)

    def mark(ok: bool) -> str:
        return "" if ok else " x"

    for j in judged:
        cells = [j["trace"]]
        for k in ("smallest_device", "smallest_cap"):
            cells.append(f"{j[k]['ratio']:.4f} <= {j[k]['bound']:.4f}{mark(j[k]['met'])}")
        for m in MARGINS:
            for kind in ("cap", "device"):
                s = j[f"{kind}_{m}"]
                text = "oom" if s["oom"] else "exp oom" if s["expandable_oom"] else f"{s['ratio']:.2f}x"
                cells.append(text + mark(s["met"]))
        cells.append("same" if j["unbinding"]["met"] else "differs x")
        cells.append(f"{j['uncapped']['utilization']:.4f} {j['uncapped']['ratio']:.2f}x{mark(j['uncapped']['met'])}")
        g.add_row(*cells)
    console.print(g)
    met = sum(all(v["met"] for k, v in j.items() if k != "trace") for j in judged)
    per_goal = ", ".join(f"{k} {sum(j[k]['met'] for j in judged)}" for k in judged[0] if k != "trace") if judged else ""
    console.print(f"{met} of {len(judged)} traces meet every goal; traces meeting each: {per_goal}")


def main(argv: list[str] | None = None, prog: str = "bench edge") -> int:
    parser = command_parser(prog, __doc__)
    parser.add_argument("traces", nargs="*", help="trace files (default: every bundled and kept trace)")
    parser.add_argument("--policy", action="append",
                        help=f"default: {' '.join(POLICIES)}; the first is judged against the goals")
    parser.add_argument("--resolution", type=float, default=2e-4, help="bisection's relative resolution")
    parser.add_argument("--json", metavar="OUT", help="write every figure here")
    parser.add_argument("--check", metavar="EXPECTED", help="compare with a file --json wrote; exit 1 on a change")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.traces] or default_traces()
    policies = args.policy or list(POLICIES)
    try:
        traces = [load(path) for path in paths]
        for policy in policies:
            choice_of(policy)
    except (TraceError, ValueError) as exc:
        parser.error(str(exc))
    rows = []
    for trace in traces:
        peak = run(trace, "expandable")["peak_allocated"]
        for policy in policies:
            started = time.perf_counter()
            rows.append(measure(trace, policy, args.resolution, peak))
            print(f"{trace.name} / {policy}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    judged = goals(rows, choice_of(policies[0]).label)
    print_tables(rows, judged)
    record = {"resolution": args.resolution, "rows": rows, "goals": judged}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.check:
        expected = json.loads(Path(args.check).read_text())
        if expected["rows"] != json.loads(json.dumps(rows)):
            print(f"{prog}: the figures differ from {args.check}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
