"""torch.empty + del latency under gmlake against PyTorch's native caching allocator, in one run.

    python bench/torch_latency.py [--out FILE]

Each allocator runs in its own process (the allocator is chosen before CUDA starts); sizes cover the small pool,
a large block and a block that gmlake serves from a cached stitched block.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

from gmlake.cli import OneLineParser

SIZES = {"4KiB": 4096, "1MiB": 1 << 20, "64MiB": 64 << 20}


def inner(iterations: int) -> dict:
    import time

    import torch

    out = {}
    keep = torch.empty(1, device="cuda")
    for label, n in SIZES.items():
        for _ in range(1000):
            del_me = torch.empty(n, dtype=torch.uint8, device="cuda")
            del del_me
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(iterations):
                t = torch.empty(n, dtype=torch.uint8, device="cuda")
                del t
            best = min(best, (time.perf_counter() - t0) / iterations * 1e6)
        out[label] = best
    del keep
    return out


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--out")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(inner(args.iterations)))
        return
    results = {}
    for name, cmd in (("native", [sys.executable, __file__]),
                      ("gmlake", [sys.executable, "-m", "gmlake", "run", __file__])):
        proc = subprocess.run(cmd + ["--inner", "--iterations", str(args.iterations)], capture_output=True,
                              text=True, check=True, env=os.environ.copy())
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    import torch

    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "command": " ".join(sys.argv),
        "us_per_empty_del": results,
        "ratio": {k: results["gmlake"][k] / results["native"][k] for k in SIZES},
    }
    text = json.dumps(record, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
