"""The price of a context synchronize (a cut at reuse, each pressure stage, empty_cache), as replay's cost table
prices it (per_call.synchronize, gmlake/sim/data/driver_costs_h200.json).

    python -m bench sync-price [--iterations N] [--steps N] [--rounds N] [--size N] [--out FILE]

idle: the call alone; queued: right after 8 short kernels; loaded: the extra step time of a chain of matmuls with
one synchronize mid-step against none (A B B A rounds; the GPU's bubble included): `price_us`, the table's price.
torch.cuda.synchronize is the primary context's synchronize, as gmlake's CUDA driver makes it. JSON to --out.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from bench.cli import OneLineParser


def _stats(us: list[float]) -> dict:
    us = sorted(us)
    return {"median": statistics.median(us), "p10": us[len(us) // 10], "p90": us[9 * len(us) // 10], "n": len(us)}


def measure(iterations: int = 2000, steps: int = 50, rounds: int = 7, size: int = 4096) -> dict:
    import torch

    from bench.harness import environment

    sync = torch.cuda.synchronize
    torch.cuda.init()
    sync()
    idle = []
    for _ in range(iterations):
        t = time.perf_counter_ns()
        sync()
        idle.append((time.perf_counter_ns() - t) / 1e3)
    small = torch.ones(1 << 16, device="cuda")
    queued = []
    for _ in range(iterations // 4):
        for _ in range(8):
            small.mul_(1.0)
        t = time.perf_counter_ns()
        sync()
        queued.append((time.perf_counter_ns() - t) / 1e3)
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(size, size, device="cuda", dtype=torch.bfloat16) / size ** 0.5 for _ in range(8)]

    def run(with_sync: bool) -> float:
        sync()
        t = time.perf_counter_ns()
        for _ in range(steps):
            x = a
            for i, w in enumerate(weights):
                x = x @ w
                if with_sync and i == len(weights) // 2:
                    sync()
        sync()
        return (time.perf_counter_ns() - t) / 1e3

    run(False), run(True)                   # warm-up: kernels chosen, clocks up
    extra, step_us = [], []
    for _ in range(rounds):
        first, second = run(False), run(True)
        third, fourth = run(True), run(False)
        without, withs = (first + fourth) / 2, (second + third) / 2
        extra.append((withs - without) / steps)
        step_us.append(without / steps)
    return {"environment": environment(), "unit": "microseconds",
            "idle_us": _stats(idle), "queued_us": _stats(queued), "loaded_us": _stats(extra),
            "loaded_step_us": statistics.median(step_us),
            "method": {"iterations": iterations, "steps": steps, "rounds": rounds, "matmul": f"{size}x{size} bf16",
                       "matmuls_per_step": len(weights)},
            "price_us": round(statistics.median(extra), 3)}


def main(argv: list[str] | None = None, prog: str = "bench sync-price") -> int:
    parser = OneLineParser(prog=prog, description="the price of a context synchronize, idle and under load")
    for flag, default in (("--iterations", 2000), ("--steps", 50), ("--rounds", 7), ("--size", 4096)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--out", help="JSON file (default: stdout)")
    args = parser.parse_args(argv)
    if min(args.iterations, args.steps, args.rounds, args.size) < 1:
        parser.error("--iterations, --steps, --rounds and --size must be >= 1")
    try:
        import torch
    except ImportError:
        parser.error("needs PyTorch with CUDA")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (none found)")
    result = measure(args.iterations, args.steps, args.rounds, args.size)
    text = json.dumps(result, indent=2) + "\n"
    Path(args.out).write_text(text) if args.out else sys.stdout.write(text)
    return 0
