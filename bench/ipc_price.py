"""The price of exportable chunks (Note [Exporting a chunk]): each VMM call per handle, and an allocator's step.

Chunks plain, exportable (the POSIX handle type, never exported: every chunk, by default) and exported (exported, its
descriptor closed: a shared chunk). Steps first, before any export: per round, --steps grow-and-release steps of a
fresh allocator over a plain and an exportable driver, interleaved A B B A, the first kind alternating by round. Then
per round, bench._bench.time_driver_calls over --calls chunks of each size and kind, the kinds' order alternating.
Samples as JSON to --out or $OUT/ipc_price.json; docs/benchmarks.md's generator judges them and prints the verdict.
--price-table RECORD writes a record's extra per exportable handle into replay's cost table instead.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import gmlake
from bench.cli import OneLineParser, error_line
from bench.harness import environment
from gmlake import Allocator

MiB, SIZES_MIB, KINDS = 1 << 20, (2, 20), ("plain", "exportable", "exported")
STEP_MIB = (6, 20, 64, 2, 40, 128, 20, 8)
# time_driver_calls' names -> the cost table's per_handle names (gmlake/sim/data/driver_costs_h200.json)
CALLS = {"create_chunk": "create_chunk", "map": "map", "set_access_per_handle": "set_access",
         "unmap_per_handle": "unmap", "release_chunk": "release_chunk"}


def time_step(driver) -> float:
    """ms of one grow-and-release step (STEP_MIB MiB) of a fresh allocator over `driver`: every request grows."""
    alloc = Allocator(driver)
    started = time.perf_counter_ns()
    for ptr in [alloc.malloc(mib * MiB) for mib in STEP_MIB]:
        alloc.free(ptr)
    alloc.empty_cache()
    alloc.close()
    return (time.perf_counter_ns() - started) / 1e6


def measure(kind: str, rounds: int, calls: int, steps: int) -> dict:
    from bench.native import load
    drivers = ({"plain": gmlake.cuda_driver(0, False), "exportable": gmlake.cuda_driver(0, True)} if kind == "cuda"
               else {"plain": gmlake.HostDriver(), "exportable": gmlake.HostDriver()})
    for name in ("plain", "exportable"):
        time_step(drivers[name])                                # untimed: first touches of each driver
    taken: dict = {"plain": [[] for _ in range(rounds)], "exportable": [[] for _ in range(rounds)]}
    for r in range(rounds):
        order = ("plain", "exportable")[::1 if r % 2 == 0 else -1]
        for i in range(steps):
            for name in order[::1 if i % 2 == 0 else -1]:
                taken[name][r].append(time_step(drivers[name]))
    result = {"steps": {"samples_ms": taken}, "per_handle": {f"{mib}MiB": {k: {} for k in KINDS} for mib in SIZES_MIB}}
    time_driver_calls = load().time_driver_calls
    for r in range(rounds):
        for chunks in KINDS[::1 if r % 2 == 0 else -1]:
            for mib in SIZES_MIB:
                us = time_driver_calls(drivers["plain" if chunks == "plain" else "exportable"], mib * MiB, calls,
                                       export=chunks == "exported", copies=False)
                for key, name in [*CALLS.items(), *([("export", "export")] if chunks == "exported" else [])]:
                    result["per_handle"][f"{mib}MiB"][chunks].setdefault(name, []).append(us[key])
    return result


def main(argv: list[str] | None = None, prog: str = "bench ipc-price") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=["cuda", "host"], default="cuda")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=128, help="chunks per size, kind and round")
    parser.add_argument("--steps", type=int, default=20, help="grow-and-release steps per kind and round")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--price-table", type=Path, metavar="RECORD", help="write RECORD into replay's cost table")
    args = parser.parse_args(argv)
    if args.price_table:
        try:
            from bench.report_docs.benchmarks import write_table
            print(f"per_handle_exportable_extra = {write_table(args.price_table)} (µs per 2 MiB handle)")
        except (OSError, ValueError) as exc:        # no such file, not JSON, or an older record
            parser.error(error_line(exc))
        return
    if args.rounds < 2 or args.calls < 1 or args.steps < 1:
        parser.error("need --rounds >= 2 (the order alternates), --calls >= 1 and --steps >= 1")
    out = args.out or (Path(os.environ["OUT"]) / "ipc_price.json" if os.environ.get("OUT") else None)
    try:
        measured = measure(args.driver, args.rounds, args.calls, args.steps)
    except (RuntimeError, ImportError) as exc:      # no CUDA driver or device, a driver call refused, or no build
        sys.exit(f"{prog}: {error_line(exc)}")
    result = {"environment": environment(driver_kind=args.driver, rounds=args.rounds, calls=args.calls,
                                         steps=args.steps), **measured}
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    try:
        from bench.report_docs.benchmarks import ipc_section  # needs the sim extra (numpy)
        print(ipc_section(result, str(out or "(not written)")))
    except ImportError as exc:
        print(f"{prog}: {out or 'nothing'} written; the verdict needs {error_line(exc)}")
