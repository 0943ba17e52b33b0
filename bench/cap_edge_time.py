"""Step time at the edge of memory, on the GPU: gmlake against expandable segments at 1.02x and 1.05x the peak
allocated P, as a cap and as the device's free memory, interleaved.

    python -m bench cap edge-time [--workloads W ...] [--limits 1.02 1.05] [--kinds cap device] [--rounds 2]
        [--peak W=BYTES ...] [--plan bench/plans/edge-probes.json] [--outside W=BYTES ...] [--gpu-time-steps N]
        [--deadline S] [--dry-run]

docs/benchmarks.md ("The device itself as the limit, on the H200") holds the method. P comes from `bench cap plan`'s
file or --peak; a device point leaves L x P + O bytes free, O calibrated per workload (`cap_probe.calibrate`). Each
run is a cap-search probe (`cap_search.run_probe`); per point the allocators alternate A B, B A. B / A is resolved
where it differs from 1 by more than both spreads. Output: DIR/edge-time.json, rewritten after every run,
DIR/probes/, and a table.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from bench import RESULTS, ROOT, cap_probe, cap_search
from bench.cap_time import spread
from bench.cli import OneLineParser, named_bytes, render_table
from bench.harness import GIB, alternate, device_total_memory, environment, expected_duration, outcome_line

PLAN = ROOT / "bench" / "plans" / "edge-probes.json"
KINDS = ("cap", "device")
LIMITS = (1.02, 1.05)
# Seconds per run on the H200 where no run of the workload and kind has finished yet: (cap run, device-limit run,
# calibration), from the cap searches of 2026-12-01 (capped runs, lazy module loading) and the device-limit probes of
# bench/results/h200-2026-12-02b (eager loading), rounded up. For the deadline's first runs and --dry-run's estimate.
TYPICAL_S = {"opt1.3b-lora-ckpt": (22, 33, 40), "gpt2xl-lora-ckpt": (22, 43, 42), "opt1.3b-ckpt": (24, 33, 26)}
UNKNOWN_S = (30, 45, 45)        # any other workload
START_S = 15                    # reading the device's total memory in a child process, before the first run


# ------------------------------------------------------------------------------------------------ the plan

def plan(workloads: list[str], kinds: list[str], limits: list[float], allocators: list[str], rounds: int,
         calibrated: set[str] = frozenset()) -> list[dict]:
    """The steps in the order they run: per workload, a calibration before its first device point (unless its O is
    `calibrated`, known), then per (kind, limit) point `rounds` rounds of the allocators, in the given order in even
    rounds and reversed in odd ones."""
    steps = []
    for workload in workloads:
        for kind in kinds:
            if kind == "device" and workload not in calibrated:
                steps.append({"step": "calibrate", "workload": workload})
                calibrated = {*calibrated, workload}
            for limit in limits:
                for round_ in range(rounds):
                    for allocator in alternate(allocators, round_):
                        steps.append({"step": "run", "workload": workload, "kind": kind, "limit_p": limit,
                                      "round": round_, "allocator": allocator})
    return steps


def label(step: dict) -> str:
    """A step in a few words: `opt1.3b-lora-ckpt calibrate`, `opt1.3b-lora-ckpt cap 1.02x P r0 expandable`."""
    if step["step"] == "calibrate":
        return f"{step['workload']} calibrate"
    return f"{step['workload']} {step['kind']} {step['limit_p']:g}x P r{step['round']} {step['allocator']}"


def typical(step: dict) -> float:
    """TYPICAL_S's seconds for a step."""
    cap_s, device_s, calibrate_s = TYPICAL_S.get(step["workload"], UNKNOWN_S)
    return calibrate_s if step["step"] == "calibrate" else cap_s if step["kind"] == "cap" else device_s


def estimate(step: dict, record: dict) -> float:
    """How long `step` will likely take: the longest finished step of its workload and kind (calibrations apart),
    else TYPICAL_S's."""
    if step["step"] == "calibrate":
        done = record["calibrations"]
    else:
        done = [r for r in record["runs"] if r.get("kind") == step["kind"] and not r.get("cut")]
    same = [r for r in done if r["workload"] == step["workload"]]
    return expected_duration(step["workload"], same) if same else typical(step)


def dry_run(steps: list[dict], peaks: dict[str, int], deadline: float) -> str:
    """--dry-run's text: the steps, each with its bytes, and when it would likely end (TYPICAL_S), and where a
    deadline would cut them."""
    lines, clock, cut = [], float(START_S), None
    for index, step in enumerate(steps):
        clock += typical(step)
        if deadline and cut is None and clock > deadline:
            cut = index
            lines.append(f"-- the deadline ({deadline:g} s) likely cuts here: {len(steps) - index} steps not started")
        where = "" if step["step"] == "calibrate" else f" ({math.ceil(step['limit_p'] * peaks[step['workload']]):,} B)"
        lines.append(f"[{index + 1:>3}] {label(step)}{where}, ends at about {clock:.0f} s")
    runs = sum(s["step"] == "run" for s in steps)
    per = {w: sum(typical(s) for s in steps if s["workload"] == w) for w in dict.fromkeys(s["workload"] for s in steps)}
    lines.append(f"{runs} runs and {len(steps) - runs} calibrations: about {clock:.0f} s ({clock / 60:.1f} min, "
                 f"{START_S} s of it starting); per workload: " + ", ".join(f"{w} {t:.0f} s" for w, t in per.items()))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the summary

def kernel_ms(run: dict) -> float | None:
    """The kernels' own time of a run's profiled steps (--gpu-time-steps), in ms summed over those steps, or None
    where it profiled none or a profiled step failed (ran out of memory under the limit)."""
    profiled = run.get("gpu_time") or []
    if not profiled or any("error" in step for step in profiled):
        return None
    return sum(step["total_ms"] for step in profiled)


def allocator_summary(runs: list[dict]) -> dict:
    """One allocator's runs at one point: counts, the times of those that fit, their sum and spread, what they held."""
    fit = [r for r in runs if r["fit"]]
    times = [r["timed_s"] for r in fit if r.get("timed_s")]
    busy = [r["driver_busy_after_s"] for r in fit if r.get("driver_busy_after_s") is not None]
    kernel = [k for r in fit if (k := kernel_ms(r)) is not None]
    out = {"runs": len(runs), "fit": len(fit), "out_of_memory": sum(bool(r.get("oom")) for r in runs),
           "errors": sum(not r["fit"] and not r.get("oom") for r in runs),
           "times_s": [round(t, 4) for t in times], "sum_s": round(sum(times), 4), "spread": round(spread(times), 4)}
    out["oom_steps"] = [r.get("oom_step") for r in runs if r.get("oom")]
    if busy:
        out["driver_busy_s"] = [round(b, 4) for b in busy]
    if kernel:
        out["kernel_ms"] = [round(k, 2) for k in kernel]
    reserved = [r["max_memory_reserved"] for r in runs if r.get("max_memory_reserved")]
    if reserved:
        out["peak_reserved"] = max(reserved)
    drift = [r["outside_drift"] for r in runs if r.get("outside_drift") is not None]
    if drift:
        out["outside_drift"] = drift
        out["calibration_off"] = sum(not r.get("calibration_held", True) for r in runs)
    return out


def summarize(runs: list[dict], allocators: list[str], rounds: int) -> dict:
    """One point's comparison of B (allocators[1]) with A (allocators[0]) from its runs (those a deadline cut left
    out): per allocator allocator_summary; B / A as the ratio of their mean times where both fit every run;
    `resolved` where |ratio - 1| is over both spreads (two timed runs a side at least); `goal` (B's time <= A's): met
    where the ratio is resolved below 1 or only A ran out of memory, missed where it is resolved above 1 or only B
    ran out of memory, not resolved where the ratio is within the spreads (either side of 1: a timing that cannot
    resolve the goal is no pass), None where the runs say nothing (errors, none yet); `complete` where each
    allocator ran every round."""
    a, b = allocators
    kept = [r for r in runs if not r.get("cut")]
    sides = {x: allocator_summary([r for r in kept if r["allocator"] == x]) for x in allocators}
    out: dict = {"allocators": sides, "complete": all(s["runs"] >= rounds for s in sides.values())}
    oom = {x: sides[x]["out_of_memory"] > 0 for x in allocators}
    times = {x: sides[x]["times_s"] for x in allocators}
    if oom[a] or oom[b]:
        out["verdict"] = ("both out of memory" if oom[a] and oom[b] else f"{a if oom[a] else b} out of memory")
        out["goal"] = None if oom[a] and oom[b] else "met" if oom[a] else "missed"
    elif times[a] and times[b]:
        out["ratio"] = round((sum(times[b]) / len(times[b])) / (sum(times[a]) / len(times[a])), 4)
        enough = min(len(times[a]), len(times[b])) >= 2
        out["resolved"] = enough and abs(out["ratio"] - 1) > max(sides[a]["spread"], sides[b]["spread"])
        out["verdict"] = (("faster" if out["ratio"] < 1 else "slower") if out["resolved"]
                          else "within the spread" if enough else "one run a side")
        out["goal"] = ("met" if out["ratio"] <= 1 else "missed") if out["resolved"] else "not resolved"
    else:
        out["verdict"], out["goal"] = ("errors" if any(sides[x]["errors"] for x in allocators) else "no runs"), None
    return out


def points(record: dict) -> list[dict]:
    """Every planned point's summary, in the plan's order, from the runs so far (a point with no run: 'no runs')."""
    settings, peaks = record["settings"], record["peaks"]
    allocators, out = settings["allocators"], []
    for step in record["plan"]:
        if step["step"] != "run" or step["round"] != 0 or step["allocator"] != allocators[0]:
            continue
        key = (step["workload"], step["kind"], step["limit_p"])
        runs = [r for r in record["runs"] if (r["workload"], r["kind"], r["limit_p"]) == key]
        out.append({"workload": key[0], "kind": key[1], "limit_p": key[2],
                    "limit_bytes": math.ceil(key[2] * peaks[key[0]]["bytes"]),
                    **summarize(runs, allocators, settings["rounds"])})
    return out


def table_rows(record: dict) -> tuple[list[str], list[list[str]]]:
    """The table's columns and a row per point, as text: this command's table and report docs' `edge-time`."""
    a, b = record["settings"]["allocators"]

    def side(s: dict) -> str:
        if s["out_of_memory"]:
            steps = ", ".join(str(x) for x in s["oom_steps"] if x is not None)
            return f"OOM in {s['out_of_memory']} of {s['runs']}" + (f" (step {steps})" if steps else "")
        if not s["times_s"]:
            return f"{s['errors']} errors" if s["errors"] else "-"
        return " / ".join(f"{t:.2f}" for t in s["times_s"]) + (f" ({s['errors']} errors)" if s["errors"] else "")

    def peak(s: dict) -> str:
        return f"{s['peak_reserved'] / GIB:.2f}" if s.get("peak_reserved") else "-"

    columns = ["workload", "kind", "limit", "GiB", f"{a} s", f"{a} spread", f"{b} s", f"{b} spread", f"{b} / {a}",
               "verdict", f"{b} <= {a}", f"{b} driver s", "peak reserved GiB", "outside drift MiB"]
    listed = points(record) if "plan" in record and "runs" in record else record["points"]
    profiled = any(s.get("kernel_ms") for p in listed for s in p["allocators"].values())
    if profiled:            # --gpu-time-steps: the profiled steps' kernel time, A's runs / B's runs
        columns.append("kernel ms")
    rows = []
    # summaries from the runs themselves where the record has them: a verdict is never read back from a file
    for p in listed:
        sa, sb = p["allocators"][a], p["allocators"][b]
        drift = [d for s in (sa, sb) for d in s.get("outside_drift", ())]
        off = sum(s.get("calibration_off", 0) for s in (sa, sb))
        rows.append([p["workload"], p["kind"], f"{p['limit_p']:g}x P", f"{p['limit_bytes'] / GIB:.3f}",
                     side(sa), f"{sa['spread']:.1%}" if len(sa["times_s"]) > 1 else "-",
                     side(sb), f"{sb['spread']:.1%}" if len(sb["times_s"]) > 1 else "-",
                     f"{p['ratio']:.3f}" if "ratio" in p else "-",
                     p["verdict"] + ("" if p["complete"] else " (incomplete)"), p["goal"] or "-",
                     " / ".join(f"{x:.3f}" for x in sb.get("driver_busy_s", ())) or "-",
                     f"{peak(sa)} / {peak(sb)}",
                     (f"{min(drift) / 2**20:+.0f} to {max(drift) / 2**20:+.0f}" + (f" ({off} OFF)" if off else ""))
                     if drift else "-"])
        if profiled:
            rows[-1].append(" vs ".join(" / ".join(f"{k:.0f}" for k in s.get("kernel_ms", ())) or "-" for s in (sa, sb)))
    return columns, rows


def table(record: dict) -> str:
    """The final table (rich where installed, as the cap search's)."""
    columns, rows = table_rows(record)
    a, b = record["settings"]["allocators"]
    title = (f"step time at the edge: {b} against {a}, {record['settings']['steps']} steps "
             f"({record['settings']['warmup']} warm-up), {record['settings']['rounds']} rounds")
    return render_table(title, columns, rows, left=("workload", "kind", "verdict"), no_wrap=("workload", "verdict"),
                        width=240)


# ------------------------------------------------------------------------------------------------ the command line

def read_peaks(path: Path) -> dict[str, int]:
    """P per workload from a `bench cap plan` file: the peak allocated of its thresholds' rows (one trace per
    workload, so one P; two that differ are refused)."""
    peaks: dict[str, int] = {}
    for row in json.loads(path.read_text())["thresholds"]:
        peak = int(row["peak_allocated"])
        if peaks.setdefault(row["workload"], peak) != peak:
            raise ValueError(f"two peaks for {row['workload']}: {peaks[row['workload']]} and {peak}")
    return peaks


def parse_limit(text: str) -> float:
    """A --limits item: a multiple of P above 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1 < value < math.inf:                # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"each limit is a multiple of P above 1 (1.02 for 1.02x P), got {text!r}")
    return value


def parse_peak(item: str, workloads: list[str]) -> tuple[str, int]:
    """--peak WORKLOAD=BYTES -> (workload, bytes); ValueError with the reason."""
    return named_bytes(item, "--peak", workloads, "WORKLOAD one of --workloads", 1)


def parse_args(argv: list[str] | None = None, prog: str = "bench cap edge-time") -> argparse.Namespace:
    """The command line, checked: any bad value is one line on stderr and exit 2."""
    parser = OneLineParser(prog=prog, description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--workloads", nargs="+", choices=cap_search.WORKLOADS, metavar="WORKLOAD",
                        help="default: every workload of --plan")
    parser.add_argument("--allocators", nargs=2, choices=cap_search.ALLOCATORS, default=["expandable", "gmlake"],
                        metavar=("A", "B"), help="B is timed against A (default: expandable gmlake)")
    parser.add_argument("--limits", nargs="+", type=parse_limit, default=list(LIMITS), metavar="L",
                        help="multiples of P (default 1.02 1.05)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="each limit as a cap, as the device's free memory, or both (default)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per point: A B, then B A, ... (default 2)")
    parser.add_argument("--peak", action="append", default=[], metavar="WORKLOAD=BYTES",
                        help="P of WORKLOAD, instead of --plan's")
    parser.add_argument("--plan", type=Path, default=PLAN, help="a `bench cap plan` file: P per workload "
                        "(default bench/plans/edge-probes.json)")
    parser.add_argument("--outside", action="append", default=[], metavar="WORKLOAD=BYTES",
                        help="device points: the bytes WORKLOAD takes outside its allocator, known: no calibration")
    parser.add_argument("--calibrate-with", default="native", metavar="ALLOCATOR", choices=cap_search.ALLOCATORS,
                        help="device points: the allocator of each workload's calibration run (default native)")
    parser.add_argument("--warm", action="store_true",
                        help="device points: warm CUDA's libraries before the filler, in every run")
    parser.add_argument("--gpu-time-steps", type=int, default=0, metavar="N",
                        help="after each run's timed steps, profile N more (the last N shapes) and report their "
                             "kernels' own time, which the host's noise leaves alone (Note [GPU time]; default 0)")
    parser.add_argument("--dry-run", action="store_true", help="print the runs and an estimate; run nothing")
    cap_search.add_run_options(parser)
    parser.add_argument("--out", default=str(RESULTS / "train" / "edge-time"))
    args = parser.parse_args(argv)
    cap_search.check_run_options(parser, args)
    if args.rounds < 1:
        parser.error(f"need --rounds >= 1, got {args.rounds}")
    if not 0 <= args.gpu_time_steps <= args.steps:
        parser.error(f"need 0 <= --gpu-time-steps <= --steps, got {args.gpu_time_steps}")
    if args.allocators[0] == args.allocators[1]:
        parser.error(f"--allocators needs two different allocators, got {args.allocators[0]} twice")
    args.limits = list(dict.fromkeys(args.limits))
    args.kinds = list(dict.fromkeys(args.kinds))
    try:
        plan_peaks = read_peaks(args.plan) if not args.workloads or set(args.workloads) - {
            p.partition("=")[0] for p in args.peak} else {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"--plan {args.plan}: not a bench cap plan file ({type(exc).__name__}: {exc})")
    args.workloads = list(dict.fromkeys(args.workloads or [w for w in plan_peaks if w in cap_search.WORKLOADS]))
    if not args.workloads:
        parser.error(f"--plan {args.plan}: no workload of bench cap search in it; give --workloads and --peak")
    try:
        given = dict(parse_peak(item, args.workloads) for item in args.peak)
        args.outside = dict(cap_probe.parse_outside(item, set(args.workloads)) for item in args.outside)
    except ValueError as exc:
        parser.error(str(exc).replace("the probes'", "--workloads"))
    args.peaks = {}
    for workload in args.workloads:
        if workload in given:
            args.peaks[workload] = {"bytes": given[workload], "from": "--peak"}
        elif workload in plan_peaks:
            args.peaks[workload] = {"bytes": plan_peaks[workload], "from": str(args.plan)}
        else:
            parser.error(f"no peak allocated P for {workload} in {args.plan}: give --peak {workload}=BYTES")
    device_only = [flag for flag, given_ in (("--outside", args.outside), ("--warm", args.warm),
                                             ("--calibrate-with", args.calibrate_with != "native")) if given_]
    if device_only and "device" not in args.kinds:
        parser.error(f"{device_only[0]} goes with --kinds device")
    return args


# ------------------------------------------------------------------------------------------------ the runs

def main(argv: list[str] | None = None, prog: str = "bench cap edge-time") -> None:
    args = parse_args(argv, prog)
    peaks = {w: p["bytes"] for w, p in args.peaks.items()}
    steps = plan(args.workloads, args.kinds, args.limits, args.allocators, args.rounds, set(args.outside))
    if args.dry_run:
        print(dry_run(steps, peaks, args.deadline))
        return
    started = time.perf_counter()
    try:
        total = device_total_memory()
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"{prog}: cannot read the CUDA device's total memory: {exc}")
    over = [f"{w} at {limit:g}x P" for w in args.workloads for limit in args.limits if limit * peaks[w] > total]
    if over:
        print(f"{prog}: {over[0]} is more than the device's {total:,} bytes", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"environment": environment(),
                    "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    "device_total_memory": total, "peaks": args.peaks, "plan": steps, "calibrations": [], "runs": [],
                    "points": []}
    outside: dict[str, int | None] = dict(args.outside)        # per workload: O, or None where calibration failed
    record["outside"] = {w: {"bytes": o, "from": "--outside"} for w, o in outside.items()}

    def save() -> None:
        record["points"] = points(record)
        record["wall_s"] = round(time.perf_counter() - started, 1)
        (out / "edge-time.json").write_text(json.dumps(record, indent=1) + "\n")

    execute(steps, record, args, total, outside, started, save)
    save()
    print(f"\n{len(record['runs'])} runs in {record['wall_s']:.0f} s; results in {out / 'edge-time.json'}")
    print(table(record))


def execute(steps: list[dict], record: dict, args: argparse.Namespace, total: int, outside: dict[str, int | None],
            started: float, save) -> None:
    """Run `steps` in order (calibrations into record["calibrations"], runs into record["runs"], `save` after each),
    stopping where the deadline leaves too little time for the next (record["stopped"], record["not_started"])."""
    out = Path(args.out)
    done = 0

    def runner(workload: str, allocator: str, purpose: str, fraction: float, env: dict[str, str]) -> dict:
        """One run with `env` added for it alone, stopped at the deadline (then marked `cut`: it says nothing of
        the allocator)."""
        left = args.deadline - (time.perf_counter() - started) if args.deadline else None
        timeout = args.timeout if left is None else max(min(args.timeout, left), 1.0)
        with cap_probe.added_env(env):
            run = cap_search.run_probe(workload, allocator, purpose, fraction, timeout, settings=args, out=out,
                                       index=len(record["runs"]) + len(record["calibrations"]))
        if run.get("killed") and timeout < args.timeout:
            run["cut"] = True
        return run

    for index, step in enumerate(steps):
        workload = step["workload"]
        if args.deadline:
            left, expected = args.deadline - (time.perf_counter() - started), estimate(step, record)
            if left < max(expected, 1.0):
                stop(record, f"deadline: {left:.0f} s left, {label(step)} takes about {expected:.0f} s", steps[index:])
                return
        if step["step"] == "calibrate":
            cal, outside[workload] = cap_probe.calibrate(workload, args.calibrate_with, total, args.warm, runner)
            record["calibrations"].append(cal)
            record["outside"][workload] = {"bytes": outside[workload], "from": "calibration",
                                           "calibration": len(record["calibrations"]) - 1}
            save()
            print(cap_probe.calibration_line(workload, cal, outside[workload], args.calibrate_with, args.warm),
                  flush=True)
            if cal.get("cut"):
                stop(record, f"deadline: {label(step)} was stopped at it", steps[index + 1:])
                return
            continue
        kind, allocator = step["kind"], step["allocator"]
        limit_bytes = math.ceil(step["limit_p"] * record["peaks"][workload]["bytes"])
        if kind == "device" and outside.get(workload) is None:
            record.setdefault("skipped", []).append({**step, "why": "the workload's calibration failed"})
            save()
            continue
        fraction, env, fields = cap_probe.limit_request(limit_bytes, total, kind == "device", outside.get(workload),
                                                        args.warm)
        done += 1
        print(f"== [{done}/{sum(s['step'] == 'run' for s in steps)}] {label(step)}: {limit_bytes:,} B"
              + (f" (+ {outside[workload]:,} outside)" if kind == "device" else f", fraction {fraction:.6f}"),
              flush=True)
        run = cap_probe.limited(runner(workload, allocator, f"{kind}-{step['limit_p']:g}x", fraction, env), fields)
        del run["limit"]                # cap_probe's name for the kind
        run.update(kind=kind, limit_p=step["limit_p"], round=step["round"])
        record["runs"].append(run)
        save()
        print("   " + outcome_line(run)
              + (f"; {run['allocator_ooms']} out-of-memory answers" if run.get("allocator_ooms") else "")
              + (f"; outside {run['outside_drift'] / 2**20:+.1f} MiB against the calibration"
                 if "outside_drift" in run else ""), flush=True)
        if run.get("cut"):
            stop(record, f"deadline: {label(step)} was stopped at it", steps[index + 1:])
            return


def stop(record: dict, why: str, left: list[dict]) -> None:
    """Note why the runs stopped early, and the steps not started."""
    record["stopped"] = why
    record["not_started"] = [label(s) for s in left]
    print(f"{why}; not starting the last {len(left)} steps", flush=True)
