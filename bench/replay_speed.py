"""Replay speed: trace events per second through each built-in policy over the bundled traces, or the same replay
loop in two built checkouts, interleaved (an A/B of a change).

    python -m bench replay-speed [--repeat 3]
    python -m bench replay-speed --against OLD_CHECKOUT [--repeat 5] [--micro] [--json OUT]

With --against this checkout and the old one each run in its own worker (bench/_replay_worker.py), old and new in turn per trace and
policy; the figure is the median of events / s timed inside the nogil loop, and the A/B says where the two differ in
what they did, so a speed change is not a change of behaviour in disguise. --micro times the core's cache hits too.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from bench import ROOT
from bench.cli import OneLineParser, render_table

WORKER = Path(__file__).resolve().parent / "_replay_worker.py"


def table(repeat: int) -> None:
    """Best of `repeat` replays of every bundled trace under every built-in policy, in M events/s."""
    from gmlake import policies
    from gmlake.sim.replay import bundled_traces, replay
    from gmlake.sim.trace import load

    names = policies.names()
    rows, total_events, total_seconds = [], 0, 0.0
    for path in bundled_traces():
        trace = load(path)
        rows.append([trace.name])
        for name in names:
            best = min((replay(trace, name) for _ in range(repeat)), key=lambda r: r.seconds)
            rows[-1].append(f"{best.events / best.seconds / 1e6:.1f}")
            total_events += best.events
            total_seconds += best.seconds
    title = f"replay speed on {platform.processor() or platform.machine()} (M events/s, best of {repeat})"
    print(render_table(title, ["trace", *names], rows, left=("trace",), width=120), end="")
    print(f"overall: {total_events / total_seconds / 1e6:.2f} M events/s")


class Worker:
    """bench/_replay_worker.py in one checkout's root."""

    def __init__(self, root: Path):
        self.root = root
        env = dict(os.environ, PYTHONPATH=str(root))
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], cwd=root, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"worker in {self.root} died")
        return json.loads(reply)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def against(old_root: Path, new_root: Path, repeat: int, policies: list[str] | None, traces: list[str] | None,
            micro: bool, json_out: Path | None) -> None:
    sides = {"old": Worker(old_root), "new": Worker(new_root)}
    names = sides["new"].ask("names")
    traces = traces or names["traces"]
    pols = policies or [p for p in names["policies"] if p in sides["old"].ask("names")["policies"]]
    rates: dict[tuple[str, str, str], list[float]] = {(t, p, side): [] for t in traces for p in pols for side in sides}
    stats = {}
    for t in traces:                    # warm-up, and the stats
        for p in pols:
            for side, w in sides.items():
                stats[t, p, side] = w.ask(f"{t} {p}")["stats"]
    for _ in range(repeat):
        for t in traces:
            for p in pols:
                for side, w in sides.items():
                    r = w.ask(f"{t} {p}")
                    rates[t, p, side].append(r["events"] / r["seconds"])
    micro_ns: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(repeat if micro else 0):
        for side, w in sides.items():
            micro_ns[side].append(w.ask("micro"))
    for w in sides.values():
        w.close()
    print(f"M events/s, median of {repeat} (old: {old_root}, new: {new_root})")
    print(f"{'trace':30} {'policy':14} {'old':>7} {'new':>7} {'new/old':>8}")
    ratios = []
    for t in traces:
        for p in pols:
            old, new = (statistics.median(rates[t, p, s]) / 1e6 for s in ("old", "new"))
            ratios.append(new / old)
            same = "" if stats[t, p, "old"] == stats[t, p, "new"] else \
                f"  differs: old {stats[t, p, 'old']} new {stats[t, p, 'new']}"
            print(f"{t:30} {p:14} {old:7.2f} {new:7.2f} {new / old:8.3f}{same}")
    print(f"geometric mean new/old: {statistics.geometric_mean(ratios):.3f}")
    if micro:
        print(f"micro (sim driver), ns per cached malloc+free, median of {repeat}")
        for label in micro_ns["new"][0]:
            old, new = (statistics.median(m[label] for m in micro_ns[s]) for s in ("old", "new"))
            print(f"  {label:16} old {old:6.1f}  new {new:6.1f}  new/old {new / old:.3f}")
    if json_out:
        json_out.write_text(json.dumps({f"{t}|{p}|{s}": v for (t, p, s), v in rates.items()}, indent=1))


def main(argv: list[str] | None = None, prog: str = "bench replay-speed") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=None, help="replays per case (default 3; 5 with --against)")
    parser.add_argument("--against", type=Path, metavar="OLD_CHECKOUT", help="A/B against this built checkout")
    parser.add_argument("--policy", action="append", help="with --against: only these policies (repeatable)")
    parser.add_argument("--trace", action="append", help="with --against: only these bundled traces (repeatable)")
    parser.add_argument("--json", type=Path, help="with --against: also write every timing here")
    parser.add_argument("--micro", action="store_true", help="with --against: also time the core's cache hits")
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.against is None:
        if args.policy or args.trace or args.json or args.micro:
            parser.error("--policy, --trace, --json and --micro go with --against")
        table(args.repeat or 3)
        return
    if not (args.against / "gmlake").is_dir():
        parser.error(f"{args.against}: not a gmlake checkout (no gmlake/ in it)")
    against(args.against.resolve(), ROOT, args.repeat or 5, args.policy, args.trace, args.micro,
            args.json)
