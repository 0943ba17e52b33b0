"""The cap search: per workload and allocator, the smallest memory cap at which training completes, and the step
time near it (docs/benchmarks.md, "Under a memory cap", holds the method).

    python -m bench cap search [--workloads vit bert t5 cnn] [--allocators expandable gmlake] [--steps 20]
        [--resolution 0.01] [--deadline S]

Each probe is a fresh process of the workload's script started as its suite starts it, plus `--memory-fraction f`;
it fits on exit 0 and fails on an out-of-memory exit (3, or an FSDP rank's `oom` summary); any other failure ends
that pair's search as an error. Per pair: an uncapped reference run, geometric bisection between its peak allocated
and its peak reserved, then one timed run at 1.05x the smallest fit. Output: DIR/probes/*.json and DIR/cap.json,
rewritten after every probe, and a table.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TypeVar

from bench import RESULTS, harness, speed_suite, train_suite
from bench.cli import OneLineParser, add_run_options, check_run_options, render_table
from bench.harness import GIB, alternate, device_total_memory, environment, expected_duration, outcome_line
from gmlake.sim.cap import Search, bisect_fraction

# workload -> the suite whose script runs it (and whose allocators it takes): dynamic.py's or train_hf.py's
SUITES = {**dict.fromkeys(speed_suite.WORKLOADS, speed_suite), **dict.fromkeys(train_suite.WORKLOADS, train_suite),
          **dict.fromkeys(train_suite.FSDP_WORKLOADS, train_suite)}
WORKLOADS = tuple(SUITES)
ALLOCATORS = tuple(harness.ALLOCATORS)
# the workloads' exit status when a step runs out of memory under --memory-fraction (common.OOM_EXIT; not imported
# from there, which imports torch: the search itself runs without it)
OOM_EXIT = 3
TIMED_MARGIN = 1.05     # the timed run's cap, over the smallest fraction that fit
SLACK = 4096            # bytes over a peak, so that f * total never rounds below it

T = TypeVar("T")
Request = tuple[str, "float | None"]          # (purpose, fraction; None: uncapped)


class ProbeError(Exception):
    """A probe failed other than by running out of memory under its cap: the pair's search stops."""


def as_probes(purpose: str, search: Search[T]) -> Generator[Request, dict, T]:
    """A fraction search as probe requests: each fraction it asks for is a `purpose` probe, each probe's fit its
    answer. Returns the search's result."""
    try:
        fraction = next(search)
        while True:
            probe = yield purpose, fraction
            if "error" in probe:
                raise ProbeError(probe["error"])
            fraction = search.send(probe["fit"])
    except StopIteration as stop:
        return stop.value


def pair_search(outcome: dict, total: int, resolution: float) -> Generator[Request, dict, None]:
    """One pair's probes as a coroutine: yields requests, is sent each probe's record, and keeps `outcome` up to
    date as it goes (so a pair stopped by the deadline keeps what it learnt): the uncapped reference run, the
    bisection between its peak allocated (which no cap below can fit) and its peak reserved (which fits), then the
    timed run."""
    try:
        reference = yield "reference", None
        if "error" in reference:
            raise ProbeError(reference["error"])
        lo = reference["max_memory_allocated"] / total
        hi = (reference["max_memory_reserved"] + SLACK) / total
        outcome.update(reference={k: reference.get(k) for k in ("timed_s", "max_memory_allocated",
                                                                "max_memory_reserved", "driver_busy_after_s")},
                       floor=lo, upper_bound=hi, smallest_fit=hi)
        result = yield from as_probes("bisect", bisect_fraction(lo, hi, resolution))
        outcome["smallest_fit"] = result.smallest_fit
        timed = yield "timed", min(TIMED_MARGIN * result.smallest_fit, 1.0)
        outcome.update(timed_fraction=timed["fraction"], timed_fit=timed["fit"], timed_s=timed.get("timed_s"))
        if timed["fit"] and timed.get("timed_s") and reference.get("timed_s"):
            outcome["time_ratio"] = timed["timed_s"] / reference["timed_s"]
            if timed.get("driver_busy_after_s") is not None and reference.get("driver_busy_after_s") is not None:
                # what the allocator's own calls added to the timed steps at the cap: beside the ratio, it bounds
                # how much of a slower capped run can be the allocator's (the rest is the machine's noise)
                outcome["driver_added_s"] = timed["driver_busy_after_s"] - reference["driver_busy_after_s"]
        outcome["status"] = "done"
    except ProbeError as exc:
        outcome.update(status="error", error=str(exc)[-500:])


def note_probe(outcome: dict, probe: dict) -> None:
    """A pair's bracket from its bisection: the smallest fraction that fit in a probe and the largest that failed
    (out of memory)."""
    outcome["probes"] += 1
    if probe["purpose"] == "timed" or probe["fraction"] is None or "error" in probe:
        return
    if probe["fit"]:
        outcome["smallest_fit_probed"] = min(probe["fraction"], outcome.get("smallest_fit_probed") or 1.0)
    else:
        outcome["largest_fail"] = max(probe["fraction"], outcome.get("largest_fail") or 0.0)


def smallest_fit_shown(outcome: dict) -> float | None:
    """The smallest fraction a pair fit under: its search's result or any probe below it."""
    return min((f for f in (outcome.get("smallest_fit"), outcome.get("smallest_fit_probed")) if f is not None),
               default=None)


ProbeRunner = Callable[[str, str, str, "float | None", float], dict]   # workload, allocator, purpose, fraction, timeout


def search(workloads: list[str], allocators: list[str], total: int, resolution: float, run_probe: ProbeRunner,
           time_left: Callable[[], float | None], timeout: float, record: dict, save: Callable[[], None]) -> None:
    """Every pair's search, workloads in turn and each workload's allocators alternating (A B, B A, ...), probes
    appended to record["probes"], outcomes in record["pairs"], `save` called after every probe. Stops starting
    probes when `time_left()` (None: no deadline) is shorter than a probe of that workload likely takes. Once a
    workload's searches end, record["verdicts"] says which allocator the GPU showed below which."""
    outcomes = {(w, a): {"workload": w, "allocator": a, "status": "not started", "probes": 0}
                for w in workloads for a in allocators}
    record["pairs"] = list(outcomes.values())
    record["verdicts"] = []

    def probe_once(workload: str, allocator: str, purpose: str, fraction: float | None) -> dict | None:
        """One probe, noted in the pair's outcome and the record; None (the search stopped) at the deadline."""
        left, expected = time_left(), expected_duration(workload, record["probes"])
        if left is not None and left < max(expected, 1.0):
            stop(record, f"deadline: {left:.0f} s left, a {workload} probe takes about {expected:.0f} s")
            save()
            return None
        outcome = outcomes[workload, allocator]
        limit = timeout if left is None else min(timeout, left)
        print(f"== [{len(record['probes']) + 1}] {workload} / {allocator}: {purpose} at "
              f"{'no cap' if fraction is None else f'{fraction:.5f} ({fraction * total / GIB:.3f} GiB)'}",
              flush=True)
        probe = run_probe(workload, allocator, purpose, fraction, limit)
        record["probes"].append(probe)
        note_probe(outcome, probe)
        print("   " + outcome_line(probe), flush=True)
        if probe.get("killed") and left is not None and limit < timeout:
            stop(record, f"deadline: a {workload} / {allocator} probe was stopped at it")
            save()
            return None
        return probe

    for workload in workloads:
        plans = {a: pair_search(outcomes[workload, a], total, resolution) for a in allocators}
        pending = {a: next(plan) for a, plan in plans.items()}
        turn = 0
        while pending:
            for allocator in alternate(list(pending), turn):
                outcomes[workload, allocator]["status"] = "unfinished"
                probe = probe_once(workload, allocator, *pending[allocator])
                if probe is None:
                    return
                try:
                    pending[allocator] = plans[allocator].send(probe)
                except StopIteration:
                    del pending[allocator]
                save()
            turn += 1
        record["verdicts"] += verdicts(workload, {a: outcomes[workload, a] for a in allocators})
        save()


def stop(record: dict, why: str) -> None:
    """Note why the search stopped early."""
    record["stopped"] = why
    print(why + "; not starting more probes", flush=True)


def probe_command(workload: str, allocator: str, settings: argparse.Namespace,
                  json_path: Path) -> tuple[list[str], dict]:
    """The command line and environment of a probe, without its cap: the workload's script started as its suite
    starts that allocator (PYTORCH_CUDA_ALLOC_CONF, or `python -m gmlake run FLAGS`), --steps, --warmup and --seed
    from `settings`, its summary to `json_path`, and no profiled steps after the run."""
    if SUITES[workload] is train_suite:
        # train_suite.py's run of the workload at its default batch range; cap_gib 0: without the max-batch search
        run = argparse.Namespace(steps=settings.steps, min_batch=train_suite.MIN_BATCH,
                                 max_batch=train_suite.MAX_BATCH, cap_gib=0)
        cmd, env = train_suite.command(workload, allocator, run, str(json_path))
        cmd += ["--warmup", str(settings.warmup)]
        if workload not in train_suite.FSDP_WORKLOADS:      # FSDP ranks draw their shapes from their rank
            cmd += ["--seed", str(settings.seed)]
    else:
        cmd, env = speed_suite.command(workload, allocator, settings, json_path)
    return [*cmd, "--gpu-time-steps", "0"], env


def run_probe(workload: str, allocator: str, purpose: str, fraction: float | None, timeout_s: float, *,
              settings: argparse.Namespace, out: Path, index: int) -> dict:
    """One probe in a fresh process: fit (exit 0), out of memory under the cap (exit 3), or an error."""
    # No dot before the suffix: FSDP's ranks r > 0 write NAME.rank<r>.json beside it (fsdp_train.rank_path).
    json_path = out / "probes" / (f"{index:03d}-{workload}-{allocator}-{purpose}".replace(".", "_") + ".json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    for stale in rank_summaries(json_path):
        stale.unlink()
    cmd, env = probe_command(workload, allocator, settings, json_path)
    if fraction is not None:
        cmd += ["--memory-fraction", repr(fraction)]
    started = time.perf_counter()
    proc, killed = harness.run_process(cmd, env, timeout_s)
    measured = (json.loads(json_path.read_text()) if proc.returncode == 0 and json_path.exists()
                else out_of_memory_summary(json_path) or {})
    probe = {"index": index, "workload": workload, "allocator": allocator, "purpose": purpose, "fraction": fraction,
             "fit": proc.returncode == 0 and bool(measured), "returncode": proc.returncode,
             "wall_s": round(time.perf_counter() - started, 1),
             **{k: measured.get(k) for k in ("timed_s", "max_memory_allocated", "max_memory_reserved", "oom_step",
                                             "allocator_ooms")},
             "driver_busy_after_s": driver_busy_after_warmup(measured)}
    if not probe["fit"] and measured.get("oom"):
        probe["oom"] = True
    elif not probe["fit"]:
        probe["error"] = harness.output_tail(proc, 2000)
        probe["killed"] = killed
    return probe


def driver_busy_after_warmup(summary: dict) -> float | None:
    """Seconds measured inside gmlake's driver calls over the timed steps (the largest rank's under FSDP), or None
    under torch's allocators and in runs from before it was recorded."""
    parts = [part.get("gmlake_after_warmup") or {} for part in (summary.get("ranks") or [summary])]
    busy = [p["driver_busy_s"] for p in parts if "driver_busy_s" in p]
    return max(busy) if busy else None


def rank_summaries(json_path: Path) -> list[Path]:
    """The summary files a probe left: its own (where it exists) and those of FSDP's ranks r > 0."""
    own = [json_path] if json_path.exists() else []
    return own + sorted(json_path.parent.glob(f"{json_path.stem}.rank*{json_path.suffix}"))


def out_of_memory_summary(json_path: Path) -> dict | None:
    """The summary of a probe, or of one of its ranks, that ran out of memory under the cap (`"oom": true`), else
    None. A single process says so with exit status OOM_EXIT; an FSDP job ends with torchrun's status, and the
    rank's file is what tells an out-of-memory stop from a crash."""
    for path in rank_summaries(json_path):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and summary.get("oom") is True:
            return summary
    return None


def verdicts(workload: str, outcomes: dict[str, dict]) -> list[dict]:
    """Per ordered pair of a workload's allocators, where the GPU showed a below b: a completed under a cap at
    or below one at which b ran out of memory."""
    out = []
    for a, oa in outcomes.items():
        fit = smallest_fit_shown(oa)
        for b, ob in outcomes.items():
            if a != b and fit is not None and ob.get("largest_fail") is not None and fit <= ob["largest_fail"]:
                out.append({"workload": workload, "below": a, "above": b, "fit": fit,
                            "other_failed": ob["largest_fail"]})
    return out


def table(record: dict) -> str:
    """The final table: per pair, the smallest fraction that fit (and in GiB), the uncapped peak reserved, and the
    time at 1.05 x that cap over the uncapped time."""
    total = record["device_total_memory"]
    columns = ("workload", "allocator", "status", "probes", "floor GiB", "smallest fit", "fit GiB",
               "largest OOM GiB", "uncapped resv GiB", "time at 1.05x / uncapped",
               "driver s added")

    def gib(fraction: float | None) -> str:
        return "-" if fraction is None else f"{fraction * total / GIB:.3f}"

    rows = []
    for p in record["pairs"]:
        ref = p.get("reference") or {}
        fit = smallest_fit_shown(p)
        rows.append((p["workload"], p["allocator"], p["status"], str(p["probes"]), gib(p.get("floor")),
                     "-" if fit is None else f"{fit:.5f}", gib(fit), gib(p.get("largest_fail")),
                     "-" if not ref.get("max_memory_reserved") else f"{ref['max_memory_reserved'] / GIB:.2f}",
                     f"{p['time_ratio']:.3f}" if "time_ratio" in p else "-",
                     f"{p['driver_added_s']:+.3f}" if "driver_added_s" in p else "-"))
    title = (f"smallest memory fraction at which {record['settings']['steps']} steps complete (device "
             f"{total / GIB:.1f} GiB, resolution {record['settings']['resolution']})")
    return render_table(title, columns, rows, left=("workload", "allocator", "status"))


def parse_args(argv: list[str] | None = None, prog: str = "bench cap search") -> argparse.Namespace:
    """The command line, checked: any bad value is one line on stderr and exit 2."""
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(speed_suite.DEFAULT_WORKLOADS))
    parser.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=["expandable", "gmlake"])
    parser.add_argument("--resolution", type=float, default=0.01, help="stop bisecting at hi / lo <= 1 + this")
    add_run_options(parser, steps=20)
    parser.add_argument("--out", default=str(RESULTS / "train" / "cap"))
    args = parser.parse_args(argv)
    check_run_options(parser, args)
    args.device = "cuda"              # for speed_suite.command: a fraction only means something on a CUDA device
    if not 0 < args.resolution < 1:
        parser.error(f"--resolution needs a number in (0, 1), got {args.resolution}")
    args.workloads = list(dict.fromkeys(args.workloads))
    args.allocators = list(dict.fromkeys(args.allocators))
    return args


def main(argv: list[str] | None = None, prog: str = "bench cap search") -> None:
    args = parse_args(argv, prog)
    started = time.perf_counter()
    try:
        total = device_total_memory()
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"{prog}: cannot read the CUDA device's total memory: {exc}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"environment": environment(), "settings": vars(args), "device_total_memory": total,
                    "probes": [], "pairs": []}

    def save() -> None:
        record["search_wall_s"] = round(time.perf_counter() - started, 1)
        (out / "cap.json").write_text(json.dumps(record, indent=1) + "\n")

    def time_left() -> float | None:
        return args.deadline - (time.perf_counter() - started) if args.deadline else None

    def runner(workload: str, allocator: str, purpose: str, fraction: float | None, timeout_s: float) -> dict:
        return run_probe(workload, allocator, purpose, fraction, timeout_s, settings=args, out=out,
                         index=len(record["probes"]))

    print(f"{len(args.workloads) * len(args.allocators)} pairs, {args.steps} steps ({args.warmup} warm-up), device "
          f"{total / GIB:.1f} GiB, resolution {args.resolution}, deadline {args.deadline or 'none'}", flush=True)
    search(args.workloads, args.allocators, total, args.resolution, runner, time_left, args.timeout, record, save)
    save()
    print(f"\ncap search: {len(record['probes'])} probes in {record['search_wall_s']:.0f} s; results in {out}")
    print(table(record))
    for verdict in record["verdicts"]:
        print(f"{verdict['workload']}: {verdict['below']} below {verdict['above']}, shown: it fit "
              f"{verdict['fit'] * total / GIB:.3f} GiB where {verdict['above']} ran out of memory at "
              f"{verdict['other_failed'] * total / GIB:.3f}")
