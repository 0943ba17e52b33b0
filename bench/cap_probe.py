#!/usr/bin/env python3
"""Fixed-cap probes: does each WORKLOAD under ALLOCATOR complete its steps at exactly this cap?

    python -m bench cap probe bert:gmlake@22420000000 cnn:gmlake@13540000000 cnn:expandable@13540000000
    python -m bench cap probe vit:expandable@0.15201 --steps 20 --deadline 300 --out DIR

Why: the cap search (bench cap search) bisects to a resolution, 0.2 % at best in one call; two allocators whose
thresholds lie closer than that come out as a tie. Replay (`gmlake cap`, or the search's --predict) places each
threshold to the byte, so a probe or two at caps chosen between replay's thresholds, below one allocator's GPU
failure, settle what a bisection cannot: "gmlake fit at a cap where expandable segments ran out of memory".

Each CAP is a fraction of the device's memory (at most 1) or a number of bytes (above 1). Each probe is a fresh
process started exactly as a cap-search probe (`cap_search.run_probe`: the suite's shapes, --steps, --seed), in the
order given; --deadline stops starting probes that would likely end after it.

--device-limit makes the device itself the limit instead of a cap: each CAP (bytes) is what the probe's process
finds free once its CUDA context exists; the rest of the device's free memory is taken outside any allocator
(common.limit_memory, $GMLAKE_BENCH_LEAVE_FREE), the process runs at memory fraction 1 (which caps nothing, and
turns an out-of-memory into exit 3), with CUDA_MODULE_LOADING=EAGER so that kernels loaded later take nothing from
those bytes.
Output: DIR/cap-probe.json (environment, device total, every probe with its cap in bytes) and a line per probe.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import RESULTS, cap_search
from bench.cli import OneLineParser
from bench.speed_suite import GIB, expected_duration
from bench.train_suite import environment

LEAVE_FREE_ENV = "GMLAKE_BENCH_LEAVE_FREE"     # workloads/common.py's: not imported from there, which imports torch


def parse_probe(item: str) -> tuple[str, str, float]:
    """WORKLOAD:ALLOCATOR@CAP -> (workload, allocator, cap as given); ValueError with the reason."""
    pair, at, cap = item.rpartition("@")
    workload, colon, allocator = pair.partition(":")
    if not at or not colon:
        raise ValueError(f"expected WORKLOAD:ALLOCATOR@CAP, got {item!r}")
    if workload not in cap_search.WORKLOADS:
        raise ValueError(f"{item!r}: no such workload {workload!r} (one of {', '.join(cap_search.WORKLOADS)})")
    if allocator not in cap_search.SUITES[workload].ALLOCATORS:
        raise ValueError(f"{item!r}: workload {workload} takes no allocator {allocator!r}")
    try:
        value = float(cap)
    except ValueError:
        raise ValueError(f"{item!r}: CAP must be a fraction in (0, 1] or a number of bytes, got {cap!r}") from None
    if not 0 < value < float("inf"):          # NaN fails both comparisons
        raise ValueError(f"{item!r}: CAP must be a fraction in (0, 1] or a number of bytes, got {cap!r}")
    return workload, allocator, value


def as_fraction(cap: float, total: int) -> float:
    """A CAP as given (a fraction, or bytes when above 1) as a fraction of `total`; bytes over the device refused."""
    fraction = cap if cap <= 1 else cap / total
    if fraction > 1:
        raise ValueError(f"a cap of {cap:.0f} bytes is more than the device's {total} bytes")
    return fraction


def parse_args(argv: list[str] | None = None, prog: str = "bench cap probe") -> argparse.Namespace:
    """The command line, checked: any bad value is one line on stderr and exit 2."""
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("probes", nargs="+", metavar="WORKLOAD:ALLOCATOR@CAP",
                        help="CAP: a fraction of the device's memory, or bytes (a number above 1)")
    parser.add_argument("--device-limit", action="store_true",
                        help="each CAP is the bytes left free on the device (no cap): the device is the limit")
    cap_search.add_run_options(parser)
    parser.add_argument("--out", default=str(RESULTS / "train" / "cap-probe"))
    args = parser.parse_args(argv)
    cap_search.check_run_options(parser, args)
    try:
        args.requests = [parse_probe(item) for item in args.probes]
    except ValueError as exc:
        parser.error(str(exc))
    if args.device_limit and any(cap <= 1 for _, _, cap in args.requests):
        parser.error("--device-limit takes each CAP in bytes (the bytes left free)")
    return args


def main(argv: list[str] | None = None, prog: str = "bench cap probe") -> None:
    args = parse_args(argv, prog)
    started = time.perf_counter()
    try:
        total = cap_search.device_total_memory()
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"{prog}: cannot read the CUDA device's total memory: {exc}")
    try:
        fractions = [as_fraction(cap, total) for _, _, cap in args.requests]
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"environment": environment(), "settings": {k: v for k, v in vars(args).items()},
                    "device_total_memory": total, "probes": []}

    def save() -> None:
        record["wall_s"] = round(time.perf_counter() - started, 1)
        (out / "cap-probe.json").write_text(json.dumps(record, indent=1) + "\n")

    for (workload, allocator, cap), fraction in zip(args.requests, fractions):
        left = args.deadline - (time.perf_counter() - started) if args.deadline else None
        if left is not None and left < max(expected_duration(workload, record["probes"]), 1.0):
            record["stopped"] = f"deadline: {left:.0f} s left"
            print(f"{record['stopped']}; not starting more probes", flush=True)
            break
        # the probe's environment is this process's (the suites' command()), for this probe only
        extra = {LEAVE_FREE_ENV: str(int(cap)), "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING",
                                                                                      "EAGER")} \
            if args.device_limit else {}          # CUDA_MODULE_LOADING=LAZY where startup time matters more
        kept = {name: os.environ.get(name) for name in extra}
        os.environ.update(extra)
        try:
            probe = cap_search.run_probe(workload, allocator, "device" if args.device_limit else "fixed",
                                         1.0 if args.device_limit else fraction,
                                         args.timeout if left is None else min(args.timeout, left), settings=args,
                                         out=out, index=len(record["probes"]))
        finally:
            for name, value in kept.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        probe["cap_bytes"] = int(fraction * total)
        probe["limit"] = "device" if args.device_limit else "cap"
        record["probes"].append(probe)
        save()
        outcome = "fit" if probe["fit"] else "OOM" if probe.get("oom") else "ERROR"
        reserved = probe.get("max_memory_reserved")
        print(f"{workload} / {allocator} {'with free' if args.device_limit else 'at'} {fraction:.6f} "
              f"({probe['cap_bytes']:,} B, "
              f"{probe['cap_bytes'] / GIB:.3f} GiB): {outcome}"
              + (f", peak reserved {reserved:,} B" if reserved else "")
              + (f" (OOM at step {probe['oom_step']})" if probe.get("oom_step") is not None else "")
              + (f": {probe['error'][-300:]}" if "error" in probe else ""), flush=True)
    save()
    print(f"results in {out / 'cap-probe.json'}")
