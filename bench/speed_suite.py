"""The speed suite: dynamic-shape training under each allocator, interleaved.

    python -m bench speed [--workloads vit bert t5 cnn] [--allocators native expandable gmlake gmlake-paper]
        [--rounds 2] [--steps 60] [--warmup N] [--deadline S] [--out DIR] [--device cuda|cpu] [--size full|small]

Each run is a fresh process of bench/workloads/dynamic.py (same seed, same shapes); rounds alternate A B C D and
D C B A (harness.interleaved). The measure is the sum of the step times after warm-up, against native's median; the
table and its reading are in docs/benchmarks.md, "Speed suite: shapes that change every step". Output:
DIR/runs/*.json and DIR/summary.json, rewritten after every run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench import RESULTS
from bench.cli import OneLineParser, add_run_options, cell, check_run_options, render_table
from bench.harness import (
    ALLOCATORS,
    GIB,
    Results,
    environment,
    expected_duration,
    finished_runs,
    launch,
    measured_run,
    run_in_order,
    run_order,
)

WORKLOAD_MODULE = "bench.workloads.dynamic"
WORKLOADS = ("vit", "bert", "t5", "cnn", "rl", "sage")      # rl and sage: the edge programs
DEFAULT_WORKLOADS = ("vit", "bert", "t5", "cnn")
DEFAULT_ALLOCATORS = ("native", "expandable", "gmlake", "gmlake-paper")


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (without creating a context here)."""
    import torch

    return torch.cuda.is_available()


def command(workload: str, allocator: str, args: argparse.Namespace, json_path: Path) -> tuple[list[str], dict]:
    """The command line and environment of one run."""
    return launch(allocator, [sys.executable], [
        "-m", WORKLOAD_MODULE, "--workload", workload, "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--seed", str(args.seed), "--device", args.device, "--size", args.size, "--json", str(json_path)])


def run_one(index: int, round_: int, workload: str, allocator: str, args: argparse.Namespace,
            timeout_s: float) -> dict:
    """One run in a fresh process; its measurements merged with the command, return code and wall time."""
    json_path = Path(args.out) / "runs" / f"{index:02d}-{workload}-{allocator}.json"
    cmd, env = command(workload, allocator, args, json_path)
    run = measured_run(cmd, env, json_path, timeout_s,
                       {"index": index, "round": round_, "workload": workload, "allocator": allocator})
    json_path.write_text(json.dumps(run, indent=1) + "\n")
    return run


def spread_pct(values: list[float]) -> float:
    """(max - min) over the median, in %."""
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


def gpu_ms(run: dict, kind: str = "total_ms") -> float | None:
    """The device time of a run's profiled extra steps (the workloads' `gpu_time`, Note [GPU time]), summed over
    those steps, in ms: all kernels, or one class ("copy", "gemm", "other"). None where the run has none."""
    steps = run.get("gpu_time") or []
    if not steps or any("error" in s or not s.get("kernels") for s in steps):   # a profiler that saw no kernel
        return None
    return sum(s[kind] for s in steps)


def table_rows(runs: list[dict], workloads: list[str], allocators: list[str]) -> list[dict]:
    """One row per workload and allocator that finished at least one run: the suite's figures (see the docstring)."""
    rows = []
    for workload in workloads:
        native_runs = [r for r in runs if r["workload"] == workload and r["allocator"] == "native" and "error" not in r]
        native = [r["timed_s"] for r in native_runs]
        native_median = statistics.median(native) if native else None
        native_gpu = [g for g in map(gpu_ms, native_runs) if g is not None]
        for allocator, done, failed in finished_runs(runs, "workload", workload, allocators, rows):
            times = [r["timed_s"] for r in done]
            row = {"workload": workload, "allocator": allocator, "runs": len(done), "failed": failed,
                   "timed_s": times, "spread_pct": spread_pct(times),
                   "samples_per_s": statistics.median(r["samples_per_s"] for r in done),
                   "tokens_per_s": statistics.median(r["tokens_per_s"] for r in done) if done[0]["tokens_per_s"]
                   else None,
                   "schedules": sorted({r["schedule_sha256"] for r in done})}
            if native_median:
                row.update(vs_native=statistics.median(times) / native_median,
                           vs_native_min=min(times) / native_median, vs_native_max=max(times) / native_median)
            if "max_memory_reserved" in done[0]:
                row.update(peak_reserved_gib=statistics.median(r["max_memory_reserved"] for r in done) / GIB,
                           peak_allocated_gib=statistics.median(r["max_memory_allocated"] for r in done) / GIB,
                           utilization=statistics.median(r["utilization"] for r in done))
            gpu = [g for g in map(gpu_ms, done) if g is not None]
            if gpu and native_gpu:      # kernel time, free of the host's noise: comparable at a finer grain
                row.update(gpu_ms=gpu, gpu_spread_pct=spread_pct(gpu),
                           gpu_vs_native=statistics.median(gpu) / statistics.median(native_gpu))
            after = [r["gmlake_after_warmup"] for r in done if r.get("gmlake_after_warmup")]
            if after:
                row.update(stitches_after_warmup=statistics.median(a["stitches"] for a in after),
                           driver_calls_after_warmup=statistics.median(a["driver_calls"] for a in after))
                measured = [a["driver_busy_s"] for a in after if "driver_busy_s" in a]
                if measured:            # seconds inside the driver's calls, measured (replay prices the same calls)
                    row.update(driver_busy_s_after_warmup=statistics.median(measured))
            rows.append(row)
    return rows


def format_table(rows: list[dict], warmup: int, steps: int) -> str:
    """The table printed at the end, and native's run-to-run spread under it."""
    title = (f"time = sum of step times after {warmup} warm-up steps of {steps}, median over runs, relative to "
             f"native's median; min-max = each run's ratio; spread = (max - min) / median of the allocator's own runs; "
             f"GPU time = the kernels' own time over the profiled extra steps against native's, and its spread")
    columns = ["workload", "allocator", "runs", "vs native", "min-max", "spread", "samples/s", "resv GiB", "util",
               "stitches", "drv calls", "GPU time", "spread", "note"]
    cells = []
    for row in rows:
        if not row["runs"]:
            cells.append([row["workload"], row["allocator"], "0", *[""] * 10, f"failed {row['failed']} time(s)"])
            continue
        ratio_range = (f"{row['vs_native_min']:.3f}-{row['vs_native_max']:.3f}" if "vs_native" in row else "-")
        notes = ([f"({row['failed']} failed)"] if row["failed"] else []) + (
            ["(SHAPES DIFFER between runs)"] if len(row["schedules"]) > 1 else [])
        cells.append([row["workload"], row["allocator"], str(row["runs"]), cell(row.get("vs_native"), ".3f", "x"),
                      ratio_range, f"{row['spread_pct']:.1f}%", f"{row['samples_per_s']:.1f}",
                      cell(row.get("peak_reserved_gib"), ".2f"), cell(row.get("utilization"), ".3f"),
                      cell(row.get("stitches_after_warmup"), ".0f"), cell(row.get("driver_calls_after_warmup"), ".0f"),
                      cell(row.get("gpu_vs_native"), ".3f", "x"), cell(row.get("gpu_spread_pct"), ".1f", "%"),
                      " ".join(notes)])
    table = render_table(title, columns, cells, left=("workload", "allocator", "note"), borders=False)
    return "\n".join([table.rstrip("\n"), *native_spread(rows, lambda row: row["workload"])])


def native_spread(rows: list[dict], name, of: str = "") -> list[str]:
    """The line under a suite's table: native's own run-to-run spread (`of` what) in each row `name(row)` names where
    native ran, or none."""
    native = [f"{name(r)} {r['spread_pct']:.1f}% over {r['runs']} runs" for r in rows
              if r["allocator"] == "native" and r["runs"]]
    return [f"native's own run-to-run spread{of} (a ratio closer to 1.00 than this is not resolved): "
            + ", ".join(native)] if native else []


def main(argv: list[str] | None = None, prog: str = "bench speed") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=list(DEFAULT_ALLOCATORS))
    parser.add_argument("--rounds", type=int, default=2, help="each round runs every allocator once per workload")
    add_run_options(parser, steps=60, size=None)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where present, else cpu")
    parser.add_argument("--out", default=str(RESULTS / "train" / "speed"))
    args = parser.parse_args(argv)
    check_run_options(parser, args)
    if args.rounds < 1:
        parser.error("need --rounds >= 1")
    has_cuda = cuda_available()
    args.device = args.device or ("cuda" if has_cuda else "cpu")
    args.size = args.size or ("full" if args.device == "cuda" else "small")
    if args.device == "cuda" and not has_cuda:
        parser.error("--device cuda, but no CUDA device is available here")
    allocators = list(dict.fromkeys(args.allocators))
    if args.device == "cpu" and allocators != ["native"]:
        skipped = [a for a in allocators if a != "native"]
        print(f"skipping {', '.join(skipped)}: they need CUDA, and this suite runs on the CPU "
              f"({'no CUDA device here' if not has_cuda else '--device cpu'}); running native only", flush=True)
        allocators = ["native"] if "native" in allocators else []
    order = run_order(args.workloads, allocators, args.rounds)
    results = Results(Path(args.out), "summary.json", {
        "environment": environment(), "settings": vars(args), "order": [f"{w}:{a}:r{r}" for r, w, a in order],
        "runs": [], "rows": []}, args.deadline, slim=True)
    print(f"{len(order)} runs: {args.steps} steps ({args.warmup} warm-up), size {args.size}, device {args.device}, "
          f"deadline {args.deadline or 'none'}", flush=True)
    run_in_order(order, results, timeout=args.timeout,
                 run=lambda index, item, timeout_s: run_one(index, *item, args, timeout_s),
                 expected=lambda item: expected_duration(item[1], results.record["runs"]),
                 label=lambda item: f"{item[1]} / {item[2]}",
                 rows=lambda runs: table_rows(runs, args.workloads, allocators),
                 shown=("timed_s", "median_step_s", "samples_per_s", "max_memory_reserved", "utilization", "wall_s"))
    print(format_table(results.record["rows"], args.warmup, args.steps))
