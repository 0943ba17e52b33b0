#!/usr/bin/env python3
"""Fixed-cap probes: does each WORKLOAD under ALLOCATOR complete its steps at exactly this cap?

    python -m bench cap probe bert:gmlake@22420000000 vit:expandable@0.15201 [--steps 20] [--deadline S] [--out DIR]
    python -m bench cap probe --device-limit opt1.3b-lora-ckpt:gmlake@7640216268 [--outside W=BYTES ...] [--warm]

A CAP is a fraction of the device (at most 1) or bytes (above 1); each probe is a cap-search probe
(`cap_search.run_probe`). With --device-limit the device itself is the limit: a filler leaves CAP + O bytes free, O
being the bytes the process takes outside its allocator (Note [Memory outside the allocator] in
workloads/common.py), measured per workload by a calibration run (--outside gives it, --no-calibrate takes 0); a
probe whose own bytes outside differ from O by more than OUTSIDE_TOLERANCE is flagged. docs/benchmarks.md ("The
device itself as the limit, on the H200") holds the method. Output: DIR/cap-probe.json and a line per probe.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import RESULTS, cap_search
from bench.cli import OneLineParser, named_bytes
from bench.harness import GIB, Results, device_total_memory, environment, expected_duration

LEAVE_FREE_ENV = "GMLAKE_BENCH_LEAVE_FREE"     # workloads/common.py's: not imported from there, which imports torch
WARM_ENV = "GMLAKE_BENCH_WARM"                 # workloads/common.py's, likewise
OUTSIDE_TOLERANCE = 32 << 20    # a probe whose bytes outside the allocator differ from the calibration's by more is
                                # flagged: its allocator had that much more or less than CAP


def leave_free(allocator_bytes: int, outside: int) -> int:
    """The bytes a device-limit probe leaves free after its filler: what its allocator may have, plus what the
    process will take outside the allocator (the calibration's O; a negative O, noise, counts as 0)."""
    return int(allocator_bytes) + max(0, int(outside))


def outside_check(probe: dict, outside: int, tolerance: int = OUTSIDE_TOLERANCE) -> dict:
    """How a probe's own bytes outside the allocator compare with the calibration's O: the difference, whether it is
    within `tolerance`, and the bytes its allocator could have had (free after the filler and what it held then,
    less the bytes outside).
    {} where the probe recorded none (it crashed before, or an old workload)."""
    own = probe.get("outside_allocator_bytes")
    if own is None:
        return {}
    out = {"outside_drift": own - outside, "calibration_held": abs(own - outside) <= tolerance}
    if probe.get("free_after_filler") is not None:
        out["allocator_had"] = probe["free_after_filler"] + (probe.get("reserved_at_filler") or 0) - own
    return out


# workload, allocator, purpose, fraction, environment to add -> the run's record, or None where it was not started
# (the deadline)
Runner = Callable[[str, str, str, float, "dict[str, str]"], "dict | None"]


@contextmanager
def added_env(env: dict[str, str]) -> Iterator[None]:
    """`env` added to this process's environment for the block alone (the suites' command() reads it)."""
    kept = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in kept.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def device_env(warm: bool) -> dict[str, str]:
    """The environment of a device-limit run or calibration: eager module loading (CUDA_MODULE_LOADING=LAZY where
    startup time matters more), and the libraries warmed before the filler with --warm."""
    return {"CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING", "EAGER"), **({WARM_ENV: "1"} if warm else {})}


def limit_request(cap: float, total: int, device_limit: bool, outside: int | None = None,
                  warm: bool = False) -> tuple[float, dict[str, str], dict]:
    """A run whose allocator is limited to `cap` (a fraction, or bytes above 1; bytes under --device-limit): the
    memory fraction to start it at, the environment to add, and the fields its record gets (`limited`). A cap is
    set_per_process_memory_fraction; a device limit runs at fraction 1 with a filler that leaves `cap` + `outside`
    (the calibration's O) free. ValueError for a cap over the device."""
    if device_limit:
        leave = leave_free(int(cap), outside or 0)
        return 1.0, {**device_env(warm), LEAVE_FREE_ENV: str(leave)}, {
            "cap_bytes": int(cap), "limit": "device", "outside_calibrated": outside, "leave_free": leave}
    fraction = as_fraction(cap, total)
    return fraction, {}, {"cap_bytes": int(fraction * total), "limit": "cap"}


def limited(probe: dict, fields: dict) -> dict:
    """A limited run's record with `fields` (limit_request's) and, under a device limit, how its bytes outside the
    allocator compare with the calibration's (outside_check)."""
    probe.update(fields)
    if fields["limit"] == "device":
        probe.update(outside_check(probe, fields["outside_calibrated"]))
    return probe


def calibrate(workload: str, allocator: str, total: int, warm: bool, runner: Runner) -> tuple[dict | None, int | None]:
    """O for `workload`: a run under `allocator` with no filler (it leaves the whole device free) that records the
    bytes it took outside its allocator. Returns the run (None where the runner did not start it: the deadline) and
    O (None where the run failed or recorded none)."""
    cal = runner(workload, allocator, "calibrate", 1.0, {**device_env(warm), LEAVE_FREE_ENV: str(total)})
    if cal is None:
        return None, None
    return cal, cal.get("outside_allocator_bytes") if cal["fit"] else None


def calibration_line(workload: str, cal: dict, outside: int | None, allocator: str, warm: bool) -> str:
    """What a calibration found, in a line: O, or why its workload's runs are skipped."""
    if outside is None:
        why = cal.get("error") or cal.get("outside_allocator_error") or "it recorded no bytes outside"
        return f"{workload}: calibration under {allocator} failed, its probes are skipped: {why[-300:]}"
    steps = [b for b in cal.get("outside_by_step") or () if b is not None]
    return (f"{workload}: {outside:,} B outside the allocator (calibration under {allocator}"
            f"{', warmed' if warm else ''}, {cal['wall_s']:.0f} s" + (f"; after step 1: {steps[0]:,} B" if steps else "")
            + ")")


def parse_outside(item: str, workloads: set[str]) -> tuple[str, int]:
    """--outside WORKLOAD=BYTES -> (workload, bytes); ValueError with the reason."""
    return named_bytes(item, "--outside", workloads, "WORKLOAD one of the probes'", 0)


def parse_probe(item: str) -> tuple[str, str, float]:
    """WORKLOAD:ALLOCATOR@CAP -> (workload, allocator, cap as given); ValueError with the reason."""
    pair, at, cap = item.rpartition("@")
    workload, colon, allocator = pair.partition(":")
    if not at or not colon:
        raise ValueError(f"expected WORKLOAD:ALLOCATOR@CAP, got {item!r}")
    if workload not in cap_search.WORKLOADS:
        raise ValueError(f"{item!r}: no such workload {workload!r} (one of {', '.join(cap_search.WORKLOADS)})")
    if allocator not in cap_search.ALLOCATORS:
        raise ValueError(f"{item!r}: no such allocator {allocator!r}")
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
                        help="no cap: the device itself is the limit, and each CAP is the bytes the allocator can "
                             "have (the filler leaves CAP + the bytes the process takes outside its allocator free)")
    parser.add_argument("--calibrate-with", default="native", metavar="ALLOCATOR", choices=cap_search.ALLOCATORS,
                        help="--device-limit: the allocator of each workload's calibration run (default native)")
    parser.add_argument("--outside", action="append", default=[], metavar="WORKLOAD=BYTES",
                        help="--device-limit: the bytes WORKLOAD takes outside its allocator, known: no calibration")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="--device-limit: no calibration, the bytes outside taken as 0 (CAP is then shared)")
    parser.add_argument("--warm", action="store_true",
                        help="--device-limit: warm CUDA's libraries before the filler, in every run")
    parser.add_argument("--calibrate-only", action="store_true",
                        help="--device-limit: run the calibrations of the probes' workloads, not the probes")
    cap_search.add_run_options(parser)
    parser.add_argument("--out", default=str(RESULTS / "train" / "cap-probe"))
    args = parser.parse_args(argv)
    cap_search.check_run_options(parser, args)
    try:
        args.requests = [parse_probe(item) for item in args.probes]
    except ValueError as exc:
        parser.error(str(exc))
    device_only = [flag for flag, given in (("--outside", args.outside), ("--no-calibrate", args.no_calibrate),
                                            ("--warm", args.warm), ("--calibrate-only", args.calibrate_only),
                                            ("--calibrate-with", args.calibrate_with != "native")) if given]
    if device_only and not args.device_limit:
        parser.error(f"{device_only[0]} goes with --device-limit")
    if args.device_limit and any(cap <= 1 for _, _, cap in args.requests):
        parser.error("--device-limit takes each CAP in bytes (the bytes the allocator can have)")
    workloads = {workload for workload, _, _ in args.requests}
    try:
        args.outside = dict(parse_outside(item, workloads) for item in args.outside)
    except ValueError as exc:
        parser.error(str(exc))
    if args.no_calibrate and (args.outside or args.calibrate_only):
        parser.error("--no-calibrate takes neither --outside nor --calibrate-only")
    calibrated = sorted(workloads - set(args.outside)) if args.device_limit and not args.no_calibrate else []
    if args.calibrate_only and not calibrated:
        parser.error("--calibrate-only: every workload already has --outside")
    return args


def main(argv: list[str] | None = None, prog: str = "bench cap probe") -> None:
    args = parse_args(argv, prog)
    try:
        total = device_total_memory()
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"{prog}: cannot read the CUDA device's total memory: {exc}")
    try:
        fractions = [as_fraction(cap, total) for _, _, cap in args.requests]
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out)
    results = Results(out, "cap-probe.json", {"environment": environment(), "settings": vars(args),
                                              "device_total_memory": total, "probes": [], "calibrations": []},
                      args.deadline)
    record, save = results.record, results.save
    outside: dict[str, int | None] = dict(args.outside)         # per workload: O, or None where calibration failed
    record["outside"] = {w: {"bytes": o, "from": "--outside"} for w, o in outside.items()}

    def run(workload: str, allocator: str, purpose: str, fraction: float, env: dict[str, str]) -> dict | None:
        """One run with `env` added to this process's environment for it alone; None where the deadline leaves no
        time for it."""
        why = results.no_time_for(expected_duration(workload, record["probes"] + record["calibrations"]))
        if why:
            results.stop(why)
            return None
        left = results.left()
        with added_env(env):
            return cap_search.run_probe(workload, allocator, purpose, fraction,
                                        args.timeout if left is None else min(args.timeout, left), settings=args,
                                        out=out, index=len(record["probes"]) + len(record["calibrations"]))

    def calibrate_workload(workload: str) -> bool:
        """O for `workload` (calibrate), noted in the record. False where the deadline stopped it."""
        if args.no_calibrate:
            outside[workload] = 0
            record["outside"][workload] = {"bytes": 0, "from": "--no-calibrate"}
            return True
        cal, outside[workload] = calibrate(workload, args.calibrate_with, total, args.warm, run)
        if cal is None:
            return False
        record["calibrations"].append(cal)
        record["outside"][workload] = {"bytes": outside[workload], "from": "calibration",
                                       "calibration": len(record["calibrations"]) - 1}
        save()
        print(calibration_line(workload, cal, outside[workload], args.calibrate_with, args.warm), flush=True)
        return True

    for (workload, allocator, cap), fraction in zip(args.requests, fractions):
        if args.device_limit and workload not in outside and not calibrate_workload(workload):
            break                                   # the deadline
        if args.calibrate_only:
            continue
        if args.device_limit and outside[workload] is None:
            record.setdefault("skipped", []).append({"workload": workload, "allocator": allocator, "cap_bytes":
                                                     int(cap), "why": "the workload's calibration failed"})
            save()
            continue
        fraction, env, fields = limit_request(cap if args.device_limit else fraction, total, args.device_limit,
                                              outside.get(workload), args.warm)
        probe = run(workload, allocator, "device" if args.device_limit else "fixed", fraction, env)
        if probe is None:
            break
        limited(probe, fields)
        record["probes"].append(probe)
        save()
        outcome = "fit" if probe["fit"] else "OOM" if probe.get("oom") else "ERROR"
        reserved = probe.get("max_memory_reserved")
        where = (f"with {probe['cap_bytes']:,} B for the allocator (+ {outside[workload]:,} outside)"
                 if args.device_limit else f"at {fraction:.6f} ({probe['cap_bytes']:,} B, "
                                           f"{probe['cap_bytes'] / GIB:.3f} GiB)")
        drift = ""
        if "outside_drift" in probe:
            drift = (f"; outside {probe['outside_allocator_bytes']:,} B, {probe['outside_drift'] / 2**20:+.1f} MiB "
                     f"against the calibration" + ("" if probe["calibration_held"] else
                                                    f" (OFF by more than {OUTSIDE_TOLERANCE >> 20} MiB)"))
        print(f"{workload} / {allocator} {where}: {outcome}"
              + (f", peak reserved {reserved:,} B" if reserved else "")
              + (f" (OOM at step {probe['oom_step']})" if probe.get("oom_step") is not None else "") + drift
              + (f": {probe['error'][-300:]}" if "error" in probe else ""), flush=True)
    save()
    print(f"results in {out / 'cap-probe.json'}")
