"""The replay goals of a policy, by replay without a limit: its memory and priced driver time against the two
references, on the tuning traces and on held-out validation traces, reported separately.

    python -m bench plan-goals [--policy SPEC] [--sets tuning|validation|all] [--jobs N] [--json OUT]
                               [--references FILE] [--save-references FILE] [--edge-json FILE]

Per trace, each of the candidate, expandable and gmlake-paper is replayed uncapped. Memory goal: the candidate's
peak reserved exceeds min(expandable's, gmlake-paper's) by at most MEMORY_EXCESS_PCT percent. Time goal: its priced
driver time is at most expandable's plus TIME_SHARE of (gmlake-paper's minus expandable's), the budget. The edge-fit
goal is `bench edge`'s own (its FIT_SLACK), summarised from `python -m bench edge --policy SPEC --policy expandable
--policy gmlake-paper --json FILE` given as --edge-json. The references do not change with the candidate: --json
keeps their figures, and --references reuses them from such a file (a trace whose bytes changed is replayed again).

The validation traces are held out: a default's settings are chosen on the tuning set only, never on these, so that
their figures tell how the choice carries to programs it was not fitted to.
"""
from __future__ import annotations

import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench import ROOT, edge
from bench.cli import error_line, json_object, render_table
from bench.cli import parser as command_parser
from gmlake.policies import choice_of
from gmlake.sim.replay import bundled_traces
from gmlake.sim.trace import TraceError, load

# The trace sets, declared once. TUNING: the traces the default's settings were and may be chosen on (the bundled
# ones, and the training runs kept as fixtures). VALIDATION: programs no setting was chosen on -- the edge programs
# (bert, moe, rl, sage, t5: moe's and sage's multi-GiB blocks change size every step, rl alternates generation and
# training) and the runs of the stall calibration -- held out of every tuning decision, so that they show whether a
# choice made on the tuning set carries over. A trace in both would make the split meaningless
# (bench/tests/test_plan_goals.py).
TUNING = (ROOT / "tests" / "data" / "results" / "traces", "*.gmtrace")            # and bundled_traces()
VALIDATION = ((ROOT / "tests" / "data" / "edge", "*.gmtrace"),
              (ROOT / "tests" / "data" / "results" / "train" / "stall-2026-11-30", "*.gmtrace"))
REFERENCES = ("expandable", "gmlake-paper")
MEMORY_EXCESS_PCT = 0.5     # memory goal: peak reserved <= min(references) + this percent
TIME_SHARE = 0.1            # time goal: driver time <= expandable's + this share of (paper's - expandable's)
GIB = 1 << 30


def trace_sets() -> dict[str, list[Path]]:
    """Each set's trace files, in a fixed order."""
    return {"tuning": [*bundled_traces(), *sorted(TUNING[0].glob(TUNING[1]))],
            "validation": [p for folder, pattern in VALIDATION for p in sorted(folder.glob(pattern))]}


def trace_key(path: Path) -> str:
    """Where a trace is, as the references file names it: relative to the repository where it lies inside it."""
    path = Path(path).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def replay_one(path: str, policy: str) -> dict:
    """One uncapped replay's figures (bench edge's), plus the trace's name and request count."""
    trace = load(path)
    return {"trace": trace.name, "requests": len(trace.requests()), **edge.run(trace, policy)}


def judge(candidate: dict, expandable: dict, paper: dict) -> dict:
    """The memory and time goals of one trace, with the figures they were judged on."""
    best = min(expandable["peak_reserved"], paper["peak_reserved"])
    excess = 100.0 * (candidate["peak_reserved"] - best) / best if best else 0.0
    budget = expandable["driver_seconds"] + TIME_SHARE * (paper["driver_seconds"] - expandable["driver_seconds"])
    ok = not candidate["ooms"]
    return {"best_reference_reserved": best, "excess_pct": excess, "time_budget": budget,
            "memory_met": ok and excess <= MEMORY_EXCESS_PCT, "time_met": ok and candidate["driver_seconds"] <= budget}


def read_json(path: str, what: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{what} {error_line(exc)}") from exc
    return json_object(text, f"{what} {path}")


def edge_summary(record: dict, label: str, sets: dict[str, list[Path]]) -> dict:
    """`bench edge`'s fit goal (device and cap) for the candidate per trace of an edge record, counted by set."""
    if label not in {r.get("policy") for r in record.get("rows", [])}:
        raise ValueError(f"the edge record has no rows for the policy {label!r}")
    judged = edge.goals(record["rows"], default=label)
    if not judged:
        raise ValueError("the edge record judges no trace: it needs rows of the candidate, expandable, gmlake-paper")
    names = {name: [load(p).name for p in paths] for name, paths in sets.items()}
    per_trace = [{"trace": g["trace"], "met": g["smallest_device"]["met"] and g["smallest_cap"]["met"],
                  "set": next((s for s, n in names.items() if g["trace"] in n), "other"),
                  "device": g["smallest_device"], "cap": g["smallest_cap"]} for g in judged]
    return {"fit_slack": edge.FIT_SLACK, "traces": per_trace}


def table(name: str, rows: list[dict]) -> str:
    def x(ok: bool) -> str:
        return "" if ok else " x"

    cells = [[r["trace"], f"{r['expandable']['peak_reserved'] / GIB:.2f}", f"{r['paper']['peak_reserved'] / GIB:.2f}",
              f"{r['candidate']['peak_reserved'] / GIB:.2f}", f"{r['excess_pct']:+.2f}{x(r['memory_met'])}",
              f"{r['candidate']['driver_seconds']:.3f}{x(r['time_met'])}", f"{r['time_budget']:.3f}",
              f"{1000 * r['candidate']['driver_calls'] / max(r['candidate']['requests'], 1):.1f}"] for r in rows]
    title = (f"{name}: peak reserved GiB without a limit, the candidate's excess % over the better reference, its "
             f"priced driver s and the budget, its driver calls per 1000 requests (x: a goal missed)")
    return render_table(title, ["trace", "exp", "paper", "cand", "excess", "s", "budget", "calls"],
                        cells, left=("trace",), fold=("trace",), width=80)


def main(argv: list[str] | None = None, prog: str = "bench plan-goals") -> int:
    parser = command_parser(prog, __doc__)
    parser.add_argument("--policy", default="gmlake", help="the candidate (default: gmlake)")
    parser.add_argument("--sets", choices=("tuning", "validation", "all"), default="all")
    parser.add_argument("--jobs", type=int, default=1, help="replays at once, each in a process of its own")
    parser.add_argument("--json", metavar="OUT", help="write every figure, the references' too, here")
    parser.add_argument("--references", metavar="FILE", help="reuse the references' figures from a --json file")
    parser.add_argument("--save-references", metavar="FILE", help="write only the references' figures here")
    parser.add_argument("--edge-json", metavar="FILE", help="summarise the edge-fit goal from a bench edge --json")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    for out in filter(None, (args.json, args.save_references)):
        if not Path(out).resolve().parent.is_dir():
            parser.error(f"{out}: no such folder to write into")
    from bench.harness import environment, source_digest

    try:
        label = choice_of(args.policy).label
        sets = trace_sets()
        chosen = {s: paths for s, paths in sets.items() if args.sets in (s, "all")}
        for paths in chosen.values():
            for path in paths:
                load(path)          # a trace that cannot be read is refused before any replay
        known = read_json(args.references, "--references").get("references", {}) if args.references else {}
        if not isinstance(known, dict) or not all(isinstance(r, dict) for r in known.values()):
            raise TypeError(f"--references {args.references}: no references as plan-goals --json writes them")
        edge_record = read_json(args.edge_json, "--edge-json") if args.edge_json else None
        summary = edge_summary(edge_record, label, sets) if edge_record is not None else None
    except (TraceError, ValueError, TypeError, KeyError, AttributeError, OSError) as exc:
        parser.error(error_line(exc) if not isinstance(exc, KeyError) else f"--edge-json: no figure {exc}")
    digest = source_digest()
    if known and any(r.get("source") != digest for r in known.values()):
        print(f"{prog}: some references were replayed from other gmlake sources than these ({digest}); reused as "
              f"they are (leave out --references to replay them)", file=sys.stderr)
    refs, tasks = {}, []
    for path in (p for paths in chosen.values() for p in paths):
        key, sha = trace_key(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()
        old = known.get(key, {})
        if old.get("sha256") == sha and all(p in old for p in REFERENCES):
            refs[key] = old
        else:
            refs[key] = {"sha256": sha, "source": digest}
            tasks += [(key, str(path), policy) for policy in REFERENCES]
        tasks.append((key, str(path), args.policy))
    if args.jobs == 1 or not tasks:
        results = [replay_one(path, policy) for _, path, policy in tasks]
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(replay_one, *zip(*[(path, policy) for _, path, policy in tasks])))
    candidate = {}
    for (key, _, policy), figures in zip(tasks, results):
        if policy in REFERENCES and policy not in refs[key]:
            refs[key][policy] = figures
        else:
            candidate[key] = figures
    record = {"environment": environment(), "policy": label, "spec": args.policy,
              "goals": {"memory_excess_pct": MEMORY_EXCESS_PCT, "time_share": TIME_SHARE}, "sets": {},
              "edge": summary, "references": refs}
    lines = []
    for name, paths in chosen.items():
        rows = []
        for path in paths:
            key = trace_key(path)
            e, p, c = refs[key]["expandable"], refs[key]["gmlake-paper"], candidate[key]
            rows.append({"trace": c["trace"], "path": key, "candidate": c, "expandable": e, "paper": p,
                         **judge(c, e, p)})
        print(table(name, rows), end="")
        memory, time = sum(r["memory_met"] for r in rows), sum(r["time_met"] for r in rows)
        both = sum(r["memory_met"] and r["time_met"] for r in rows)
        lines.append(f"{name}: memory goal {memory}/{len(rows)}, time goal {time}/{len(rows)}, "
                     f"both {both}/{len(rows)}")
        record["sets"][name] = {"traces": rows, "memory_met": memory, "time_met": time, "both_met": both}
    if summary is not None:
        fit = {s: [t["met"] for t in summary["traces"] if t["set"] == s] for s in (*sets, "other")}
        every = [t["met"] for t in summary["traces"]]
        lines.append(f"edge fit (device and cap within {100 * edge.FIT_SLACK:g} % of P of the better reference): "
                     + ", ".join(f"{s} {sum(m)}/{len(m)}" for s, m in fit.items() if m)
                     + f"; all {sum(every)}/{len(every)}")
    print("\n".join(lines))
    record["summary"] = lines
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.save_references:
        Path(args.save_references).write_text(json.dumps(
            {"environment": record["environment"], "references": refs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
