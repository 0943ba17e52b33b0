"""Micro benchmark of the allocator core and the driver it stands on.

    python -m bench micro --driver cuda|host|sim [--iterations N] [--cache-hits] [--out FILE]

A cached block's malloc+free inside the Cython core, each driver call's cost, stitching 512 MiB at each handle
size, the stream calls, and stitches per step of a synthetic training loop (docs/benchmarks.md, "The core and the
driver: micro benchmark").
"""
from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import gmlake
from bench.cli import OneLineParser, render_table
from bench.harness import environment
from bench.native import load as _load_native
from gmlake import Allocator

_native = _load_native()
time_cache_hits, time_driver_calls, time_stream_calls = (_native.time_cache_hits, _native.time_driver_calls,
                                                        _native.time_stream_calls)

MiB = 1 << 20
HANDLE_SIZES_MIB = (2, 4, 8, 16, 32, 64)


def make_driver(kind: str):
    if kind == "cuda":
        return gmlake.cuda_driver(0)
    if kind == "host":
        return gmlake.HostDriver()
    return gmlake.SimDriver()


def cache_hits(driver, iterations: int) -> dict:
    """ns per malloc+free pair, timed inside the core (best of 3).

    exact: a freed block of exactly the size waits between two live neighbours (the steady state of training);
    split: the only free block is larger, so every malloc splits it and every free merges it back;
    stitched: the request is served by a cached sBlock over four pieces;
    pending300 (sim and host drivers, whose events can be held incomplete): the same as exact_4KiB while 300
    record_stream frees wait on a busy stream, as under FSDP (Note [Polling pending frees]).
    """
    out = {}
    alloc = Allocator(driver)
    for label, size in (("exact_4KiB", 4096), ("exact_64MiB", 64 * MiB)):
        left, middle, right = (alloc.malloc(size) for _ in range(3))
        alloc.free(middle)
        out[label] = min(time_cache_hits(alloc, size, iterations) for _ in range(3))
        alloc.free(left)
        alloc.free(right)
    alloc.empty_cache()
    out["split_4KiB"] = min(time_cache_hits(alloc, 4096, iterations) for _ in range(3))
    alloc.close()
    if hasattr(driver, "auto_complete"):
        driver.auto_complete = False
        alloc = Allocator(driver)
        waiting = [alloc.malloc(64 * 1024) for _ in range(300)]
        left, middle, right = (alloc.malloc(4096) for _ in range(3))
        alloc.free(middle)
        for p in waiting:
            alloc.record_stream(p, 7)                   # stream 7 never completes while timed
            alloc.free(p)
        out["pending300_4KiB"] = min(time_cache_hits(alloc, 4096, iterations) for _ in range(3))
        assert alloc.stats()["pending_frees"] == 300
        driver.complete_all()
        driver.auto_complete = True
        alloc.free(left)
        alloc.free(right)
        alloc.close()
    # A cached sBlock of four pieces: the paper's policy stitches these at once (the default would grow instead).
    alloc = Allocator(driver, gmlake.policies.get("gmlake-paper"))
    parts = [alloc.malloc(32 * MiB) for _ in range(4)]
    for p in parts:
        alloc.free(p)
    s = alloc.malloc(128 * MiB)
    alloc.free(s)
    assert alloc.stats()["stitches"] == 1
    out["stitched_128MiB"] = min(time_cache_hits(alloc, 128 * MiB, iterations) for _ in range(3))
    assert alloc.stats()["stitches"] == 1, "the benchmark must reuse the cached sBlock"
    alloc.close()
    return out


def driver_costs(driver) -> dict:
    """Each VMM call's cost at each handle size, over 512 MiB of handles."""
    out = {}
    for mib in HANDLE_SIZES_MIB:
        runs = [time_driver_calls(driver, mib * MiB, 512 // mib) for _ in range(3)]
        out[f"{mib}MiB"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return out


def stitch_costs(driver, costs: dict, repeats: int = 3) -> dict:
    """Time to stitch 512 MiB out of 8 free 64 MiB segments, per handle size, against its driver calls' cost."""
    out = {}
    for mib in HANDLE_SIZES_MIB:
        policy = gmlake.policies.get("gmlake-paper", chunk_size=mib * MiB)   # the stitch mechanics, per handle
        times, reuse = [], []
        for _ in range(repeats):
            alloc = Allocator(driver, policy)
            parts = [alloc.malloc(64 * MiB) for _ in range(8)]
            for p in parts:
                alloc.free(p)
            before = alloc.stats()
            t0 = time.perf_counter()
            s = alloc.malloc(512 * MiB)
            times.append((time.perf_counter() - t0) * 1e6)
            after = alloc.stats()
            assert after["stitches"] == before["stitches"] + 1
            assert after["reserved_bytes"] == before["reserved_bytes"], "a stitch must not add memory"
            handles = after["stitched_handles"] - before["stitched_handles"]
            alloc.free(s)
            t0 = time.perf_counter()
            s = alloc.malloc(512 * MiB)
            reuse.append((time.perf_counter() - t0) * 1e6)
            alloc.free(s)
            alloc.close()
        c = costs[f"{mib}MiB"]
        floor = c["reserve"] + handles * (c["map"] + c["set_access_per_handle"])
        out[f"{mib}MiB"] = {
            "handles": handles,
            "stitch_us": statistics.median(times),
            "driver_floor_us": floor,
            "ratio_to_driver_calls": statistics.median(times) / floor if floor else None,
            "reuse_us": statistics.median(reuse),
        }
    return out


def synthetic_training(driver, steps: int = 200, warmup: int = 50, seed: int = 0) -> dict:
    """A transformer-like step with a sequence length that varies per step: parameters and optimizer state persist;
    activations are allocated layer by layer and freed in reverse while gradients come and go. Reports stitches
    and new segments per step after warm-up. (Real training traces are the replay tool's input.)"""
    rng = random.Random(seed)
    alloc = Allocator(driver)
    hidden, layers, vocab = 2048, 24, 50257
    params = [alloc.malloc(12 * hidden * hidden * 2) for _ in range(layers)]
    params.append(alloc.malloc(vocab * hidden * 2))
    optim = [alloc.malloc(alloc.block_size(p) * 2) for p in params]
    per_step = []
    for step in range(steps):
        before = alloc.stats()
        tokens = rng.choice([8, 12, 16]) * rng.choice([256, 384, 512, 768, 1024])
        acts = []
        for _ in range(layers):
            acts.append(alloc.malloc(tokens * hidden * 2))              # checkpointed layer input
            acts.append(alloc.malloc(tokens * hidden * 4 * 2))          # MLP activation
        logits = alloc.malloc(tokens * vocab * 2)
        alloc.free(logits)
        grads = []
        for _ in range(layers):
            tmp = alloc.malloc(tokens * hidden * 4 * 2)                 # recomputation
            grads.append(alloc.malloc(12 * hidden * hidden * 2))
            alloc.free(tmp)
            alloc.free(acts.pop())
            alloc.free(acts.pop())
        for g in grads:
            alloc.free(g)
        after = alloc.stats()
        per_step.append({
            "stitches": after["stitches"] - before["stitches"],
            "segments": after["segments_created"] - before["segments_created"],
            "reserved_MiB": after["reserved_bytes"] / MiB,
            "peak_allocated_MiB": after["peak_allocated_bytes"] / MiB,
        })
    stats = alloc.stats()
    for p in params + optim:
        alloc.free(p)
    alloc.close()
    steady = per_step[warmup:]
    return {
        "steps": steps,
        "warmup": warmup,
        "stitches_per_step_after_warmup": statistics.mean(s["stitches"] for s in steady),
        "segments_per_step_after_warmup": statistics.mean(s["segments"] for s in steady),
        "stitches_in_warmup": sum(s["stitches"] for s in per_step[:warmup]),
        "stitches_by_step": [s["stitches"] for s in per_step],
        "peak_reserved_MiB": stats["peak_reserved_bytes"] / MiB,
        "peak_allocated_MiB": stats["peak_allocated_bytes"] / MiB,
        "utilization": stats["peak_allocated_bytes"] / stats["peak_reserved_bytes"],
    }


def main(argv: list[str] | None = None, prog: str = "bench micro") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=["cuda", "host", "sim"], default="sim")
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cache-hits", action="store_true",
                        help="time only the cache hits and print them as one JSON line (scripts/gpu-ab.sh)")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    driver = make_driver(args.driver)
    if args.cache_hits:
        print(json.dumps(cache_hits(driver, args.iterations)))
        return
    result = {"environment": environment(driver_kind=args.driver)}
    result["cache_hit_ns"] = cache_hits(driver, args.iterations)
    result["driver_call_us"] = driver_costs(driver)
    result["stitch_512MiB"] = stitch_costs(driver, result["driver_call_us"])
    # Stream ordering's calls on the default stream, best of 3 (unpriced in replay until measured on a GPU).
    runs = [time_stream_calls(driver, 0, min(args.iterations, 10_000)) for _ in range(3)]
    result["stream_call_us"] = {k: min(r[k] for r in runs) for k in runs[0] if k != "iterations"}
    result["synthetic_training"] = synthetic_training(driver)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print_tables(result)


def print_tables(result: dict) -> None:
    env = result["environment"]
    print(f"gmlake micro benchmark {env.get('gpu', env['driver_kind'])} driver {env.get('nvidia_driver', '-')} "
          f"{env['date']}")
    hits, calls = result["cache_hit_ns"], result["stream_call_us"]
    cols = ["create_chunk", "reserve", "map", "set_access_per_handle", "set_access_one_handle", "unmap_per_handle",
            "free_va", "release_chunk"]
    tables = [
        ("malloc+free of a cached block (ns, in the Cython core)", list(hits), [[f"{v:.0f}" for v in hits.values()]]),
        ("driver calls (µs; per handle where charged per handle), 512 MiB of handles", ["handle", *cols],
         [[size, *(f"{row[c]:.2f}" for c in cols)] for size, row in result["driver_call_us"].items()]),
        ("stitch 512 MiB from 8 free 64 MiB segments",
         ["handle", "handles", "stitch µs", "driver floor µs", "ratio", "reuse µs"],
         [[size, str(row["handles"]), f"{row['stitch_us']:.0f}", f"{row['driver_floor_us']:.0f}",
           f"{row['ratio_to_driver_calls']:.3f}" if row["ratio_to_driver_calls"] else "-", f"{row['reuse_us']:.1f}"]
          for size, row in result["stitch_512MiB"].items()]),
        ("stream ordering's calls (µs per call, default stream; events queried once complete)", list(calls),
         [[f"{v:.3f}" for v in calls.values()]])]
    for title, columns, rows in tables:
        print(render_table(title, columns, rows, left=("handle",)), end="")
    print("synthetic training:", {k: v for k, v in result["synthetic_training"].items() if k != "stitches_by_step"})
