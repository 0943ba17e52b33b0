"""The price of exportable chunks (Note [Exporting a chunk]): cuMemCreate with and without the POSIX handle type.

    python -m bench ipc-price [--driver cuda|host] [--rounds N] [--calls N] [--out FILE]

In each round, alternating which goes first, for each chunk size: `--calls` chunks created, then released, by a
driver whose chunks are plain and by one whose chunks are exportable (timed per call), every exportable chunk
exported once (cuMemExportToShareableHandle and closing the descriptor), and an allocator's grow-and-release step
(Allocator over each driver: malloc of the sizes a step asks, free, empty_cache) so the allocator's own path is
priced too. The same on training steps, interleaved: `python -m bench speed --allocators gmlake gmlake-ipc`.
Medians over rounds, in microseconds per call and milliseconds per step; `ratio` is exportable / plain.
Writes JSON (to --out, or $OUT/ipc_price.json where $OUT is set) and prints a table.
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

MiB = 1 << 20
SIZES_MIB = (2, 20)
# One step's requests (MiB): what a small training step asks of new memory once the cache is emptied.
STEP_MIB = (6, 20, 64, 2, 40, 128, 20, 8)


def make_drivers(kind: str) -> dict:
    if kind == "cuda":
        from gmlake.drivers._cuda_driver import CudaDriver

        return {"plain": CudaDriver(0, False), "exportable": CudaDriver(0, True)}
    return {"plain": gmlake.HostDriver(), "exportable": gmlake.HostDriver()}


def time_calls(driver, size: int, calls: int, export: bool) -> dict:
    """us per create, release and (where `export`) export+close, over `calls` chunks of `size`."""
    handles = []
    started = time.perf_counter_ns()
    for _ in range(calls):
        handles.append(driver.create(size))
    created = time.perf_counter_ns()
    out = {"create_us": (created - started) / calls / 1e3}
    if export:
        started = time.perf_counter_ns()
        for handle in handles:
            os.close(driver.export(handle))
        out["export_us"] = (time.perf_counter_ns() - started) / calls / 1e3
    started = time.perf_counter_ns()
    for handle in handles:
        driver.release(handle, size)
    out["release_us"] = (time.perf_counter_ns() - started) / calls / 1e3
    return out


def time_step(driver) -> float:
    """ms of one grow-and-release step of an allocator over `driver` (a fresh allocator: every request grows)."""
    alloc = Allocator(driver)
    started = time.perf_counter_ns()
    ptrs = [alloc.malloc(mib * MiB) for mib in STEP_MIB]
    for ptr in ptrs:
        alloc.free(ptr)
    alloc.empty_cache()
    elapsed = (time.perf_counter_ns() - started) / 1e6
    alloc.close()
    return elapsed


def measure(kind: str, rounds: int, calls: int) -> dict:
    drivers = make_drivers(kind)
    samples: dict = {}
    for r in range(rounds):
        order = ("plain", "exportable") if r % 2 == 0 else ("exportable", "plain")
        for name in order:
            driver = drivers[name]
            for mib in SIZES_MIB:
                got = time_calls(driver, mib * MiB, calls, export=name == "exportable")
                for key, value in got.items():
                    samples.setdefault(f"{mib}MiB", {}).setdefault(name, {}).setdefault(key, []).append(value)
            samples.setdefault("step", {}).setdefault(name, []).append(time_step(driver))
    result: dict = {}
    for mib in SIZES_MIB:
        row = {name: {k: statistics.median(v) for k, v in calls_.items()}
               for name, calls_ in samples[f"{mib}MiB"].items()}
        row["create_ratio"] = row["exportable"]["create_us"] / row["plain"]["create_us"]
        result[f"{mib}MiB"] = row
    step = {name: statistics.median(v) for name, v in samples["step"].items()}
    step["ratio"] = step["exportable"] / step["plain"]
    step["samples"] = samples["step"]
    result["step_ms"] = step
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
        print(f"{prog}: {error_line(exc)}", file=sys.stderr)
        sys.exit(1)
    result = {"environment": environment(driver_kind=args.driver, rounds=args.rounds, calls=args.calls), **measured}
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    rows = [[f"{mib} MiB", f"{result[f'{mib}MiB']['plain']['create_us']:.1f}",
             f"{result[f'{mib}MiB']['exportable']['create_us']:.1f}", f"{result[f'{mib}MiB']['create_ratio']:.2f}x",
             f"{result[f'{mib}MiB']['exportable']['export_us']:.1f}"] for mib in SIZES_MIB]
    print(render_table("cuMemCreate plain against exportable (us per call, medians)",
                       ["chunk", "plain", "exportable", "ratio", "export+close"], rows))
    step = result["step_ms"]
    print(f"grow-and-release step: plain {step['plain']:.2f} ms, exportable {step['exportable']:.2f} ms "
          f"({step['ratio']:.2f}x)")
