"""Do kernels run slower on VMM-mapped memory than on cudaMalloc's?

    python -m bench kernels [--rounds 3] [--iterations 20] [--out FILE]

The same kernels (a device copy, a random gather, a bf16 matmul) on one 4 GiB buffer from cudaMalloc, from gmlake's
core with 20 MiB and 2 MiB handles, and stitched from 2 MiB handles of several segments; sources interleaved by round,
medians by CUDA events, ratios against cudaMalloc's (docs/benchmarks.md, "Speed, and what the runs can resolve").
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
from pathlib import Path

from bench.cli import OneLineParser

MiB = 1 << 20
GiB = 1 << 30
BUFFER_GIB = 4
HANDLES_MIB = (20, 2)       # the VMM buffers' handle sizes: gmlake's 20 MiB chunk and the 2 MiB granularity


class _DeviceBytes:
    """Raw device memory as a CUDA array of bytes, so torch kernels read and write it in place."""

    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None}


def gmlake_buffer(torch, gmlake, driver, size: int, handle: int, stitched: bool):
    """A byte tensor over gmlake memory of `size` bytes: one segment of `handle`-sized handles, or (stitched) a range
    stitched from the handles of eight segments, each freed whole. Returns (tensor, release): release() frees the
    buffer and gives every handle back."""
    policy = dataclasses.replace(gmlake.policies.get("gmlake-paper"), chunk_size=handle)
    alloc = gmlake.Allocator(driver, policy)
    if stitched:
        parts = [alloc.malloc(size // 8) for _ in range(8)]
        for p in parts:
            alloc.free(p)
        ptr = alloc.malloc(size)
        assert alloc.stats()["stitches"] == 1, "the buffer was meant to be stitched"
    else:
        ptr = alloc.malloc(size)

    def release() -> None:
        alloc.free(ptr)
        alloc.close()
    return torch.as_tensor(_DeviceBytes(ptr, size), device="cuda"), release


def time_kernels(torch, buf, iterations: int) -> dict:
    """Median ms of each kernel over `iterations`, on views of `buf` (bytes)."""
    n = buf.numel()
    half = n // 2
    src, dst = buf[:half], buf[half:2 * half]
    floats = buf[: n // 4 * 4].view(torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(0)
    index = torch.randint(0, floats.numel(), (16 * MiB,), device="cuda", generator=gen)   # native memory
    side = 8192
    mats = buf[: 3 * side * side * 2].view(torch.bfloat16).view(3, side, side)
    mats[:2].normal_(generator=gen)
    kernels = {
        "copy": lambda: dst.copy_(src),
        "gather": lambda: floats.take(index),
        "matmul_bf16": lambda: torch.matmul(mats[0], mats[1], out=mats[2]),
    }
    out = {}
    for name, fn in kernels.items():
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        out[name] = statistics.median(times)
    return out


def main(argv: list[str] | None = None, prog: str = "bench kernels") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every source (default 3)")
    parser.add_argument("--iterations", type=int, default=20, help="timed iterations per kernel (default 20)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.iterations < 1:
        parser.error("--rounds and --iterations must be at least 1")
    try:
        import torch
    except ImportError:
        parser.error("needs torch with CUDA")
    if not torch.cuda.is_available():
        parser.error("no CUDA device")
    import gmlake

    torch.zeros(1, device="cuda")               # torch's context is the primary context gmlake's driver retains
    driver = gmlake.cuda_driver(0)
    size = BUFFER_GIB * GiB
    sources = {"cudaMalloc": None, **{f"vmm {h} MiB handles": (h * MiB, False) for h in HANDLES_MIB},
               "stitched, 2 MiB handles": (2 * MiB, True)}
    runs: dict[str, list[dict]] = {name: [] for name in sources}
    for _ in range(args.rounds):
        for name, how in sources.items():
            if how is None:
                buf, release = torch.empty(size, dtype=torch.uint8, device="cuda"), None
            else:
                buf, release = gmlake_buffer(torch, gmlake, driver, size, *how)
            runs[name].append(time_kernels(torch, buf, args.iterations))
            del buf
            torch.cuda.synchronize()
            if release is not None:
                release()
            torch.cuda.empty_cache()
    base = {k: statistics.median(r[k] for r in runs["cudaMalloc"]) for k in runs["cudaMalloc"][0]}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "gib": BUFFER_GIB,
              "handles_mib": list(HANDLES_MIB), "rounds": args.rounds, "iterations": args.iterations, "median_ms": {},
              "ratio": {}, "spread": {}}
    for name, rows in runs.items():
        result["median_ms"][name] = {k: statistics.median(r[k] for r in rows) for k in base}
        result["ratio"][name] = {k: result["median_ms"][name][k] / base[k] for k in base}
        result["spread"][name] = {k: max(r[k] for r in rows) / min(r[k] for r in rows) - 1 for k in base}
    for name in runs:
        cells = ", ".join(f"{k} {result['median_ms'][name][k]:.3f} ms ({result['ratio'][name][k]:.3f}x, spread "
                          f"{result['spread'][name][k]:.1%})" for k in base)
        print(f"{name:25} {cells}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0
