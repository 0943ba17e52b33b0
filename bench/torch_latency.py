"""torch.empty + del latency under gmlake against PyTorch's native caching allocator, in one run.

    python -m bench latency [--rounds N] [--iterations N] [--repeats N] [--out FILE]

Each allocator in its own process pinned to one CPU, rounds alternating the order, the best of --repeats loops per
run, with a fixed Python loop (`probe_us`) showing the host's load. Per size the goal (gmlake / native <= GOAL,
1.1) is met or missed only by the runs' extremes, else not resolved (docs/benchmarks.md, "Latency through PyTorch").
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

from bench import child_env
from bench.cli import OneLineParser

SIZES = {"4KiB": 4096, "1MiB": 1 << 20, "64MiB": 64 << 20}
ALLOCATORS = ("native", "gmlake")
GOAL = 1.1          # gmlake / native at most this, per size


def run_order(rounds: int) -> list[str]:
    """The allocators in the order they run: native, gmlake, then gmlake, native, and so on."""
    return [name for r in range(rounds) for name in (ALLOCATORS if r % 2 == 0 else ALLOCATORS[::-1])]


def summarize(runs: list[dict], goal: float = GOAL) -> dict:
    """Per size: each allocator's median µs and spread ((max - min) / median), gmlake's median over native's, the
    range the runs allow for that ratio (gmlake's fastest over native's slowest, its slowest over native's fastest)
    and the verdict on `goal`: "met", "missed" or "not resolved" where the range straddles it."""
    out = {}
    for label in SIZES:
        row, times = {}, {}
        for name in ALLOCATORS:
            times[name] = [r["us_per_empty_del"][label] for r in runs if r["allocator"] == name]
            median = statistics.median(times[name])
            row[name] = {"median_us": median, "spread": (max(times[name]) - min(times[name])) / median}
        row["ratio"] = row["gmlake"]["median_us"] / row["native"]["median_us"]
        low = min(times["gmlake"]) / max(times["native"])
        high = max(times["gmlake"]) / min(times["native"])
        row["ratio_range"] = [low, high]
        row["verdict"] = "met" if high <= goal else "missed" if low > goal else "not resolved"
        out[label] = row
    return out


def verdict_lines(summary: dict, goal: float) -> list[str]:
    """One line per size for the terminal: the ratio, the range the runs allow, and the verdict on `goal`."""
    return [f"{label}: gmlake / native {row['ratio']:.3f} (runs allow {row['ratio_range'][0]:.3f}-"
            f"{row['ratio_range'][1]:.3f}): {row['verdict']} (goal <= {goal:g})" for label, row in summary.items()]


def probe_us(repeats: int) -> float:
    """Best of `repeats` timings of a fixed pure-Python loop: the host's speed during the run, not the allocator's."""
    import time

    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        total = 0
        for i in range(20_000):
            total += i
        best = min(best, (time.perf_counter() - t0) * 1e6)
    return best


def inner(iterations: int, repeats: int, cpu: int) -> dict:
    import time

    import torch

    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    out = {}
    keep = torch.empty(1, device="cuda")
    for label, n in SIZES.items():
        for _ in range(1000):
            del_me = torch.empty(n, dtype=torch.uint8, device="cuda")
            del del_me
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(iterations):
                t = torch.empty(n, dtype=torch.uint8, device="cuda")
                del t
            best = min(best, (time.perf_counter() - t0) / iterations * 1e6)
        out[label] = best
    del keep
    out["probe_us"] = probe_us(repeats)
    return out


def main(argv: list[str] | None = None, prog: str = "bench latency") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000, help="requests per timed loop (default 20,000)")
    parser.add_argument("--repeats", type=int, default=20, help="timed loops per size; the best counts (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="each round runs both allocators once (default 2)")
    parser.add_argument("--out")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.rounds < 1 or args.repeats < 1:
        parser.error("--iterations, --repeats and --rounds must be at least 1")
    if args.inner:
        print(json.dumps(inner(args.iterations, args.repeats, args.cpu)))
        return
    try:
        import torch
    except ImportError:
        parser.error("needs torch (it times torch's allocators)")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (it times torch's allocators on one)")
    # Each run a process of its own, started as `python -m bench latency --inner` (under `gmlake run` for gmlake).
    inner_run = ["-m", "bench", "latency"]
    commands = {"native": [sys.executable, *inner_run], "gmlake": [sys.executable, "-m", "gmlake", "run", *inner_run]}
    cpu = max(os.sched_getaffinity(0))    # every run on the same CPU: a move between cores is noise, not allocator
    runs = []
    for name in run_order(args.rounds):
        proc = subprocess.run(commands[name] + ["--inner", "--iterations", str(args.iterations), "--repeats",
                                                str(args.repeats), "--cpu", str(cpu)],
                              capture_output=True, text=True, check=False, env=child_env())
        if proc.returncode != 0:        # not the command line's fault: one line, exit 1
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            sys.exit(f"{parser.prog}: the {name} run failed (exit {proc.returncode}): {last}")
        timings = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append({"allocator": name, "probe_us": timings.pop("probe_us"), "us_per_empty_del": timings})
    summary = summarize(runs, GOAL)
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "command": " ".join(sys.argv),
        "cpu": cpu, "iterations": args.iterations, "repeats": args.repeats, "goal": GOAL, "runs": runs,
        "summary": summary, "ratio": {k: v["ratio"] for k, v in summary.items()},
        "verdict": {k: v["verdict"] for k, v in summary.items()},
    }
    text = json.dumps(record, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    print("\n".join(verdict_lines(summary, GOAL)))
