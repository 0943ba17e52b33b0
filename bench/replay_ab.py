"""Replay speed, A/B: the same replay loop timed in two built checkouts of gmlake, old and new, interleaved.

    python bench/replay_ab.py OLD_CHECKOUT [NEW_CHECKOUT, default: this one] [--repeat 5] [--micro] [--json out.json]

Each checkout runs in its own long-lived worker process (its own build, imported from its root). For every repeat,
every bundled trace and every built-in policy, the old and the new worker each replay the trace once, one after the
other (never at the same time), so drifts in machine load hit both alike. The figure is the median over the repeats
of events / seconds, timed inside the nogil replay loop (`run_requests`, sampling 2000 windows in both checkouts:
`replay()` itself samples every request since the peak-growth split, which adds a little to its loop). A warm-up
replay per trace and policy runs first and is not counted. The workers also report the allocator's stats, and the
script says where old and new differ in what they did (driver calls, stitches), so a speed change is not a change
of behaviour in disguise. With --micro, bench/micro.py's cache hits (sim driver) are timed the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gmlake.cli import OneLineParser

STATS_COMPARED = ("allocs", "frees", "ooms", "stitches", "sblock_reuses", "sblock_evictions", "segments_created",
                  "peak_reserved_bytes", "calls")


def micro(iterations: int = 200_000) -> dict:
    """bench/micro.py's cache hits on the sim driver: ns per malloc+free pair inside the core, best of 3."""
    import gmlake
    from gmlake import Allocator, SimDriver, bench_cache_hits
    MiB = 1 << 20
    out = {}
    alloc = Allocator(SimDriver())
    for label, size in (("exact_4KiB", 4096), ("exact_64MiB", 64 * MiB)):
        left, middle, right = (alloc.malloc(size) for _ in range(3))
        alloc.free(middle)
        out[label] = min(bench_cache_hits(alloc, size, iterations) for _ in range(3))
        for p in (left, right):
            alloc.free(p)
    alloc.empty_cache()
    out["split_4KiB"] = min(bench_cache_hits(alloc, 4096, iterations) for _ in range(3))
    alloc.close()
    alloc = Allocator(SimDriver(), gmlake.policies.get("gmlake-paper"))
    parts = [alloc.malloc(32 * MiB) for _ in range(4)]
    for p in parts:
        alloc.free(p)
    alloc.free(alloc.malloc(128 * MiB))
    out["stitched_128MiB"] = min(bench_cache_hits(alloc, 128 * MiB, iterations) for _ in range(3))
    alloc.close()
    return out


def worker() -> None:
    """Line protocol on stdin/stdout: 'names' -> the bundled traces and built-in policies; 'TRACE POLICY' -> one
    replay's events, seconds and stats."""
    from gmlake import policies
    from gmlake.replay import bundled_traces, run_requests
    from gmlake.trace import load
    traces = {}
    for path in bundled_traces():
        trace = load(path)
        traces[trace.name] = trace
    for line in sys.stdin:
        words = line.split()
        if words == ["names"]:
            reply = {"traces": list(traces), "policies": policies.names()}
        elif words == ["micro"]:
            reply = micro()
        else:
            name, policy = words
            alloc, out = run_requests(traces[name], policy, samples=2000)
            stats = alloc.stats()
            reply = {"events": out["events"], "seconds": out["seconds"],
                     "stats": {k: stats.get(k) for k in STATS_COMPARED}}
        print(json.dumps(reply), flush=True)


class Worker:
    def __init__(self, root: Path):
        self.root = root
        env = dict(os.environ, PYTHONPATH=str(root))
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], cwd=root, env=env, text=True,
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


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", nargs="?", type=Path)
    parser.add_argument("new", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policy", action="append", help="only these policies (repeatable; default: all built-in)")
    parser.add_argument("--trace", action="append", help="only these bundled traces (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every timing here")
    parser.add_argument("--micro", action="store_true", help="also time bench/micro.py's cache hits (sim driver)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    if args.old is None:
        parser.error("the old checkout is required")
    sides = {"old": Worker(args.old.resolve()), "new": Worker(args.new.resolve())}
    names = sides["new"].ask("names")
    traces = args.trace or names["traces"]
    pols = args.policy or [p for p in names["policies"] if p in sides["old"].ask("names")["policies"]]
    rates = {(t, p, side): [] for t in traces for p in pols for side in sides}
    stats = {}
    for t in traces:                    # warm-up, and the stats
        for p in pols:
            for side, w in sides.items():
                stats[t, p, side] = w.ask(f"{t} {p}")["stats"]
    for _ in range(args.repeat):
        for t in traces:
            for p in pols:
                for side, w in sides.items():
                    r = w.ask(f"{t} {p}")
                    rates[t, p, side].append(r["events"] / r["seconds"])
    micro_ns = {side: [] for side in sides}
    for _ in range(args.repeat if args.micro else 0):
        for side, w in sides.items():
            micro_ns[side].append(w.ask("micro"))
    for w in sides.values():
        w.close()
    print(f"M events/s, median of {args.repeat} (old: {args.old}, new: {args.new})")
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
    if args.micro:
        print(f"micro (sim driver), ns per cached malloc+free, median of {args.repeat}")
        for label in micro_ns["new"][0]:
            old, new = (statistics.median(m[label] for m in micro_ns[s]) for s in ("old", "new"))
            print(f"  {label:16} old {old:6.1f}  new {new:6.1f}  new/old {new / old:.3f}")
    if args.json:
        args.json.write_text(json.dumps({f"{t}|{p}|{s}": v for (t, p, s), v in rates.items()}, indent=1))


if __name__ == "__main__":
    main()
