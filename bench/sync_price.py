"""The price of a context synchronize on the GPU: what a cut at reuse (Note [Fine pages at reuse]), each stage of
memory pressure relief and empty_cache call, and what replay prices each synchronize at (the driver cost table's
per_call.synchronize, gmlake/sim/data/driver_costs_h200.json).

    python -m bench sync-price [--iterations N] [--steps N] [--rounds N] [--size N] [--out FILE]

idle: one synchronize with nothing queued, the call's own time (median of --iterations).
queued: a synchronize called right after a few short kernels are queued: the CPU's wait, their drain included.
loaded: a training-like loop (a chain of matmuls, the CPU running ahead of the GPU) with one synchronize in the
  middle of each step against none: the step time one synchronize costs, the GPU's idle bubble while the CPU queues
  the next kernels included (median over --rounds rounds, each timed A B B A). This is the price the table takes: a
  synchronize costs a training step what the GPU waits, not what the CPU waits (the CPU would have waited anyway).

torch.cuda.synchronize() is cudaDeviceSynchronize, the primary context's synchronize: the call gmlake's CUDA driver
makes (cuCtxSynchronize) on the same context. Writes JSON (to --out, else stdout); needs CUDA.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from bench.cli import OneLineParser


def _stats(values_us: list[float]) -> dict:
    ordered = sorted(values_us)
    return {"median": statistics.median(ordered), "p10": ordered[len(ordered) // 10],
            "p90": ordered[(9 * len(ordered)) // 10], "n": len(ordered)}


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
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=4096, help="the matmuls' side")
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
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    print(f"synchronize: idle {result['idle_us']['median']:.1f} us, queued {result['queued_us']['median']:.1f} us, "
          f"in a training-like loop {result['price_us']:.1f} us of step time", file=sys.stderr)
    return 0
