"""The price of exportable chunks (Note [Exporting a chunk]): cuMemCreate with and without the POSIX handle type.

Rounds alternate which goes first: per chunk size, chunks created and released by a plain and an exportable driver,
each exportable one exported (and closed), and an allocator's grow-and-release step over each. Medians, `ratio`
exportable / plain; JSON to --out or $OUT/ipc_price.json. Training steps, interleaved: `python -m bench speed-ab
--allocators gmlake-noipc gmlake`.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import gmlake
from bench.cli import OneLineParser, error_line, render_table
from bench.harness import environment
from gmlake import Allocator

MiB, SIZES_MIB = 1 << 20, (2, 20)
STEP_MIB = (6, 20, 64, 2, 40, 128, 20, 8)


def time_calls(driver, size: int, calls: int, export: bool) -> dict:
    """us per create, release and (where `export`) export+close, over `calls` chunks of `size`."""
    t0 = time.perf_counter_ns()
    handles = [driver.create(size) for _ in range(calls)]
    t1 = time.perf_counter_ns()
    for handle in handles if export else ():
        os.close(driver.export(handle))
    t2 = time.perf_counter_ns()
    for handle in handles:
        driver.release(handle, size)
    out = {"create_us": (t1 - t0) / calls / 1e3, "release_us": (time.perf_counter_ns() - t2) / calls / 1e3}
    return {**out, "export_us": (t2 - t1) / calls / 1e3} if export else out


def time_step(driver) -> float:
    """ms of one grow-and-release step (STEP_MIB MiB) of a fresh allocator over `driver`: every request grows."""
    alloc = Allocator(driver)
    started = time.perf_counter_ns()
    for ptr in [alloc.malloc(mib * MiB) for mib in STEP_MIB]:
        alloc.free(ptr)
    alloc.empty_cache()
    alloc.close()
    return (time.perf_counter_ns() - started) / 1e6


def measure(kind: str, rounds: int, calls: int) -> dict:
    drivers = ({"plain": gmlake.cuda_driver(0, False), "exportable": gmlake.cuda_driver(0, True)} if kind == "cuda"
               else {"plain": gmlake.HostDriver(), "exportable": gmlake.HostDriver()})
    samples: dict = {"step": {"plain": [], "exportable": []}}
    for r in range(rounds):
        for name in ("plain", "exportable")[::1 if r % 2 == 0 else -1]:
            for mib in SIZES_MIB:
                for key, value in time_calls(drivers[name], mib * MiB, calls, name == "exportable").items():
                    samples.setdefault(f"{mib}MiB", {}).setdefault(name, {}).setdefault(key, []).append(value)
            samples["step"][name].append(time_step(drivers[name]))
    result: dict = {}
    for mib in SIZES_MIB:
        row = {name: {k: statistics.median(v) for k, v in by_call.items()}
               for name, by_call in samples[f"{mib}MiB"].items()}
        result[f"{mib}MiB"] = {**row, "create_ratio": row["exportable"]["create_us"] / row["plain"]["create_us"]}
    step = {name: statistics.median(v) for name, v in samples["step"].items()}
    result["step_ms"] = {**step, "ratio": step["exportable"] / step["plain"], "samples": samples["step"]}
    return result


def main(argv: list[str] | None = None, prog: str = "bench ipc-price") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=["cuda", "host"], default="cuda")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.calls < 1:
        parser.error("need --rounds >= 2 (the order alternates) and --calls >= 1")
    out = args.out or (Path(os.environ["OUT"]) / "ipc_price.json" if os.environ.get("OUT") else None)
    try:
        measured = measure(args.driver, args.rounds, args.calls)
    except RuntimeError as exc:                 # no CUDA driver or device, or a driver call refused
        sys.exit(f"{prog}: {error_line(exc)}")
    result = {"environment": environment(driver_kind=args.driver, rounds=args.rounds, calls=args.calls), **measured}
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    rows = [[f"{mib} MiB", *(f"{result[f'{mib}MiB'][k]['create_us']:.1f}" for k in ("plain", "exportable")),
             f"{result[f'{mib}MiB']['create_ratio']:.2f}x", f"{result[f'{mib}MiB']['exportable']['export_us']:.1f}"]
            for mib in SIZES_MIB]
    print(render_table("cuMemCreate plain against exportable (us per call, medians)",
                       ["chunk", "plain", "exportable", "ratio", "export+close"], rows))
    print("grow-and-release step (ms): {plain:.2f} plain, {exportable:.2f} exportable ({ratio:.2f}x)".format(
        **result["step_ms"]))
