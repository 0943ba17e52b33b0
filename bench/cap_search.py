"""The cap search: per workload and allocator, the smallest memory cap at which training completes, and the step
time near it (docs/benchmarks.md, "Under a memory cap", holds the method).

    python -m bench cap search [--workloads vit bert t5 cnn] [--allocators expandable gmlake] [--steps 20]
        [--resolution 0.01] [--deadline S] [--bounds-from SUMMARY_JSON] [--predict W=TRACE ...] [--capture [W ...]]

Each probe is a fresh process of the workload's script started as its suite starts it, plus `--memory-fraction f`;
it fits on exit 0 and fails on an out-of-memory exit (3, or an FSDP rank's `oom` summary); any other failure ends
that pair's search as an error. Per pair: a reference run, geometric bisection (replay's bracket first under
--predict/--capture), one timed run at 1.05x the smallest fit, then settling probes (Note [Settling probes]).
Output: DIR/probes/*.json and DIR/cap.json, rewritten after every probe, and a table.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TypeVar

from bench import RESULTS, harness, speed_suite, train_suite
from bench.cli import OneLineParser, render_table
from bench.harness import GIB, device_total_memory, environment, expected_duration, outcome_line
from gmlake.sim.cap import (  # noqa: F401
    FLOOR,
    WIDEN,
    Bisection,
    Search,
    bisect_fraction,
    drive,
    step_until,
)

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
PREDICTED_WIDEN = 1.01  # a replayed bound that turns out wrong moves by 1 % per probe (replay is usually closer)
SETTLE_RESOLUTION = 1e-4    # replay's thresholds for settling probes, relative
SETTLE_MARGIN = 2e-4    # a settling probe of a lies at least this far above a's replayed threshold (replay and the
                        # GPU differed by up to 0.024 % in session 13)
CAPTURE_MIN_S = 30      # no capture starts with less time than this before the deadline

T = TypeVar("T")
Request = tuple[str, "float | None"]          # (purpose, fraction; None: uncapped)


class ProbeError(Exception):
    """A probe failed other than by running out of memory under its cap: the pair's search stops."""


def as_probes(purpose: str, search: Search[T], answers: list[tuple[float, bool]] | None = None,
              ) -> Generator[Request, dict, tuple[T, dict | None]]:
    """A fraction search as probe requests: each fraction it asks for is a `purpose` probe, each probe's fit its
    answer (appended to `answers` as (fraction, fit) when given). Returns the search's result and the record of the
    last probe that fit (the smallest, as fits only shrink in a bisection)."""
    last_fit = None
    try:
        fraction = next(search)
        while True:
            probe = yield purpose, fraction
            if "error" in probe:
                raise ProbeError(probe["error"])
            last_fit = probe if probe["fit"] else last_fit
            if answers is not None:
                answers.append((fraction, probe["fit"]))
            fraction = search.send(probe["fit"])
    except StopIteration as stop:
        return stop.value, last_fit


def pair_search(outcome: dict, total: int, resolution: float, bound: float | None,
                predicted: tuple[float, float] | None = None) -> Generator[Request, dict, None]:
    """One pair's probes as a coroutine: yields requests, is sent each probe's record, and keeps `outcome` up to
    date as it goes (so a pair stopped by the deadline keeps what it learnt). `bound`: a fraction from another run
    that likely fits (--bounds-from), else None for an uncapped reference run. `predicted`: replay's bracket
    (a fraction that fails, one that fits; --predict), probed first."""
    try:
        failed = None
        if bound is None:
            reference = yield "reference", None
            if "error" in reference:
                raise ProbeError(reference["error"])
        else:
            (fit, failed), reference = yield from as_probes("reference", step_until(min(bound, 1.0), WIDEN, 1.0,
                                                                                         True))
            if fit is None:
                outcome.update(status="no fit", largest_fail=failed)
                return
        lo = max(reference["max_memory_allocated"] / total, failed or 0.0)
        hi = (reference["max_memory_reserved"] + SLACK) / total
        if reference["fraction"] is not None:       # a capped reference: its cap fit; a failed one below it bounds lo
            hi = min(hi, reference["fraction"]) if hi > lo else reference["fraction"]
        outcome.update(reference={k: reference.get(k) for k in ("fraction", "timed_s", "max_memory_allocated",
                                                                "max_memory_reserved", "driver_busy_after_s")},
                       floor=lo, upper_bound=hi, smallest_fit=hi)
        if predicted is not None and lo < predicted[1] and predicted[0] < hi:
            result = yield from predicted_bisection(outcome, lo, hi, predicted, resolution)
        else:
            result, _ = yield from as_probes("bisect", bisect_fraction(lo, hi, resolution))
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


def predicted_bisection(outcome: dict, lo: float, hi: float, predicted: tuple[float, float], resolution: float,
                        ) -> Generator[Request, dict, Bisection]:
    """The bisection from replay's bracket: its two ends probed first, each moved by PREDICTED_WIDEN while wrong
    (never past what the reference showed: `lo` fails, `hi` fits), then geometric bisection. Notes the prediction
    and whether both ends held in `outcome`."""
    fail_at, fit_at = max(predicted[0], lo), min(predicted[1], hi)
    outcome["predicted"] = {"largest_fail": predicted[0], "smallest_fit": predicted[1]}
    answers: list[tuple[float, bool]] = []
    search = bisect_fraction(fail_at, fit_at, resolution, lo_fails=fail_at <= lo, hi_fits=fit_at >= hi, ceiling=hi,
                             floor=lo, widen=PREDICTED_WIDEN)
    result, _ = yield from as_probes("bisect", search, answers)
    said = dict(answers)
    outcome["prediction_held"] = said.get(fit_at, True) and not said.get(fail_at, False)
    return result


def note_probe(outcome: dict, probe: dict) -> None:
    """A pair's bracket from its capped reference, bisection and settling probes: the smallest fraction that fit in
    a probe and the largest that failed (out of memory)."""
    outcome["probes"] += 1
    if probe["purpose"] == "timed" or probe["fraction"] is None or "error" in probe:
        return
    if probe["fit"]:
        outcome["smallest_fit_probed"] = min(probe["fraction"], outcome.get("smallest_fit_probed") or 1.0)
    else:
        outcome["largest_fail"] = max(probe["fraction"], outcome.get("largest_fail") or 0.0)


def smallest_fit_shown(outcome: dict) -> float | None:
    """The smallest fraction a pair fit under: its search's result or any probe below it (a settling probe's)."""
    return min((f for f in (outcome.get("smallest_fit"), outcome.get("smallest_fit_probed")) if f is not None),
               default=None)


ProbeRunner = Callable[[str, str, str, "float | None", float], dict]   # workload, allocator, purpose, fraction, timeout


def search(workloads: list[str], allocators: list[str], total: int, resolution: float,
           bounds: dict[tuple[str, str], float], run_probe: ProbeRunner, time_left: Callable[[], float | None],
           timeout: float, record: dict, save: Callable[[], None],
           predictions: dict[tuple[str, str], tuple[float, float]] | None = None,
           thresholds: dict[tuple[str, str], float] | None = None) -> None:
    """Every pair's search, workloads in turn and each workload's allocators alternating (A B, B A, ...), probes
    appended to record["probes"], outcomes in record["pairs"], `save` called after every probe. Stops starting
    probes when `time_left()` (None: no deadline) is shorter than a probe of that workload likely takes.
    `predictions`: per pair, replay's bracket as fractions (see predict_brackets). `thresholds`: per pair,
    replay's threshold to SETTLE_RESOLUTION (replay_thresholds): once a workload's searches end, the settling
    probes of `settle_plan` run, and record["verdicts"] says which allocator the GPU showed below which."""
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
        plans = {a: pair_search(outcomes[workload, a], total, resolution, bounds.get((workload, a)),
                                (predictions or {}).get((workload, a)))
                 for a in allocators}
        pending = {a: next(plan) for a, plan in plans.items()}
        turn = 0
        while pending:
            for allocator in (list(pending) if turn % 2 == 0 else list(pending)[::-1]):
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
        mine = {a: outcomes[workload, a] for a in allocators}
        replayed = {a: t for (w, a), t in (thresholds or {}).items() if w == workload}
        for cap, allocators_there, a, b in settle_plan(mine, replayed):
            print(f"   settling {a} against {b}: replay has {a} fit at {cap:.6f} and {b} fail there", flush=True)
            for allocator in allocators_there:
                if probe_once(workload, allocator, "settle", cap) is None:
                    return
                save()
        record["verdicts"] += verdicts(workload, mine)
        save()


def stop(record: dict, why: str) -> None:
    """Note why the search stopped early."""
    record["stopped"] = why
    print(why + "; not starting more probes", flush=True)


def probe_command(workload: str, allocator: str, settings: argparse.Namespace,
                  json_path: Path) -> tuple[list[str], dict]:
    """The command line and environment of a probe, without its cap: the workload's script started as its suite
    starts that allocator (PYTORCH_CUDA_ALLOC_CONF, or `python -m gmlake run FLAGS`), --steps, --warmup and --seed
    from `settings`, its summary to `json_path`, and no profiled steps after the run unless `settings` asks for
    some (`gpu_time_steps`, bench cap edge-time's: the kernels' own time, which the host's noise leaves alone)."""
    if SUITES[workload] is train_suite:
        # train_suite.py's run of the workload at its default batch range; cap_gib 0: without the max-batch search
        run = argparse.Namespace(gpus=None, steps=settings.steps, min_batch=train_suite.MIN_BATCH,
                                 max_batch=train_suite.MAX_BATCH, cap_gib=0)
        cmd, env = train_suite.command(workload, allocator, run, str(json_path))
        cmd += ["--warmup", str(settings.warmup)]
        if workload not in train_suite.FSDP_WORKLOADS:      # FSDP ranks draw their shapes from their rank
            cmd += ["--seed", str(settings.seed)]
    else:
        cmd, env = speed_suite.command(workload, allocator, settings, json_path)
    return [*cmd, "--gpu-time-steps", str(getattr(settings, "gpu_time_steps", 0))], env


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
    if measured.get("gpu_time"):
        probe["gpu_time"] = measured["gpu_time"]
    # under a device limit (bench cap probe --device-limit): the filler and the bytes taken outside the allocator,
    # at the end or at the out-of-memory, and after each step that completed
    probe.update({k: measured[k] for k in DEVICE_LIMIT_KEYS if k in measured})
    by_step = [step.get("outside_allocator_bytes") for step in measured.get("per_step") or ()]
    if any(value is not None for value in by_step):
        probe["outside_by_step"] = by_step
    if not probe["fit"] and measured.get("oom"):
        probe["oom"] = True
    elif not probe["fit"]:
        probe["error"] = harness.output_tail(proc, 2000)
        probe["killed"] = killed
    return probe


DEVICE_LIMIT_KEYS = ("leave_free", "filler_bytes", "free_after_filler", "reserved_at_filler", "warmed",
                     "outside_allocator_bytes", "outside_allocator_error")     # workloads/common.device_limit_fields


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


def read_bounds(path: str, total: int) -> dict[tuple[str, str], float]:
    """Per (workload, allocator), the largest peak reserved among the finished runs of a speed-suite summary or a
    train-suite results JSON, as a fraction of `total` (at most 1). An FSDP run records its peaks per rank; each
    rank is capped alike, so its largest rank's counts."""
    bounds: dict[tuple[str, str], float] = {}
    for run in json.loads(Path(path).read_text())["runs"]:
        reserved = run.get("max_memory_reserved") or max(
            (rank.get("max_memory_reserved") or 0 for rank in run.get("ranks") or ()), default=0)
        if "error" not in run and reserved:
            key = (run["workload"], run["allocator"])
            bounds[key] = min(max(bounds.get(key, 0.0), (reserved + SLACK) / total), 1.0)
    return bounds


def replay_policy(allocator: str) -> str:
    """The replay policy that models a suite allocator: torch's two by gmlake's models of them, gmlake's by the
    policy its `gmlake run` flags choose (with --chunk-size as a knob)."""
    if allocator in ("native", "expandable"):
        return {"native": "caching", "expandable": "expandable"}[allocator]
    run_flags = {name: flags for name, flags in harness.ALLOCATORS.items() if isinstance(flags, list)}
    if allocator not in run_flags:
        raise ValueError(f"no replay policy for allocator {allocator!r}")
    flags = run_flags[allocator]
    options = dict(zip(flags[::2], flags[1::2], strict=True))
    policy = options.pop("--policy", "gmlake")
    knobs = {"--chunk-size": "chunk_size"}
    extra = [f"{knobs[flag]}={value}" for flag, value in options.items() if flag in knobs]
    if len(extra) != len(options) or ("[" in policy and extra):
        raise ValueError(f"no replay policy for allocator {allocator!r} (flags {flags})")
    return f"{policy}[{','.join(extra)}]" if extra else policy


def refine_cap(trace, policy, failed: int, fit: int, resolution: float = 1e-4, event_lag: int = 0) -> tuple[int, int]:
    """A bracket of `smallest_cap` (a cap in bytes that fails, one that fits) narrowed by replay to a relative
    `resolution`: (smallest cap that fit, largest that failed). A few replays where a whole search from the floor
    would take a dozen: what the cap search uses to place a probe between two allocators' thresholds."""
    from gmlake.sim.replay import replay

    fits = lambda cap: replay(trace, policy, cap=math.ceil(cap), samples=0, event_lag=event_lag).ooms == 0
    result, _ = drive(bisect_fraction(failed, fit, resolution, floor=failed), fits)
    return math.ceil(result.smallest_fit), math.ceil(result.largest_fail)


def predict_brackets(traces: dict[str, list[str]], allocators: list[str], total: int,
                     ) -> tuple[dict[tuple[str, str], tuple[float, float]], list[dict]]:
    """Replay's bracket per (workload, allocator): `gmlake.sim.cap.smallest_cap` of the workload's trace under the
    allocator's replay policy, as fractions of `total` (the fitting end with SLACK, so f * total never rounds
    below it). A workload of several traces (FSDP's ranks, each under the same cap) takes its largest rank's
    bracket: the job fails as soon as one rank does. Also the rows recorded in cap.json (bytes and policy, one per
    trace)."""
    from gmlake.sim.cap import smallest_cap
    from gmlake.sim.trace import load

    brackets: dict[tuple[str, str], tuple[float, float]] = {}
    rows = []
    for workload, paths in traces.items():
        loaded = [(path, load(path)) for path in paths]
        for allocator in allocators:
            policy = replay_policy(allocator)
            fit = fail = 0              # the job's: a cap fits once every rank fits, fails where any rank fails
            for path, trace in loaded:
                rank_fit, rank_fail, _ = smallest_cap(trace, policy)
                fit, fail = max(fit, rank_fit), max(fail, rank_fail)
                # the threshold itself, to 0.01 %, for settling probes placed between two allocators' thresholds
                threshold, _ = refine_cap(trace, policy, rank_fail, rank_fit, SETTLE_RESOLUTION)
                rows.append({"workload": workload, "allocator": allocator, "trace": path, "policy": policy,
                             "largest_fail": rank_fail, "smallest_fit": rank_fit, "threshold": threshold})
            brackets[workload, allocator] = (fail / total, min((fit + SLACK) / total, 1.0))
    return brackets, rows


def replay_thresholds(rows: list[dict], total: int) -> dict[tuple[str, str], float]:
    """Per (workload, allocator), replay's threshold (the smallest cap that fit, to SETTLE_RESOLUTION) as a fraction
    of `total`, from predict_brackets' rows: a workload of several rank traces takes its largest rank's."""
    out: dict[tuple[str, str], float] = {}
    for row in rows:
        if row.get("threshold") is not None:
            key = (row["workload"], row["allocator"])
            out[key] = max(out.get(key, 0.0), row["threshold"] / total)
    return out


def settle_plan(outcomes: dict[str, dict], thresholds: dict[str, float]) -> list[tuple[float, list[str], str, str]]:
    """Note [Settling probes]: per ordered pair of one workload's allocators (a, b) whose searches ended without
    showing a below b while replay puts a's threshold below b's, one cap that tells them apart: b's largest failure
    where replay has a fit there with room to spare (only a probed), else the midpoint of the two replayed
    thresholds (both probed). Returns (cap, allocators to probe there, a, b) as fractions. A 0.2 % bisection cannot
    separate thresholds 0.1 % apart; replay places them to 0.01 %, and one or two probes settle the order."""
    plan = []
    for a, oa in outcomes.items():
        for b, ob in outcomes.items():
            if a == b or oa.get("status") != "done" or ob.get("status") != "done":
                continue
            ta, tb, fit_a = thresholds.get(a), thresholds.get(b), smallest_fit_shown(oa)
            if ta is None or tb is None or ta >= tb or fit_a is None:
                continue
            fail_a, fail_b = oa.get("largest_fail") or 0.0, ob.get("largest_fail") or 0.0
            if fit_a <= fail_b:
                continue                                    # already shown: a fit where b ran out of memory
            cap = fail_b if fail_b >= ta * (1 + SETTLE_MARGIN) else min((ta + tb) / 2, fit_a)
            if cap >= tb or cap <= fail_a or cap < ta * (1 + SETTLE_MARGIN):
                continue        # replay has b fit there or a too close to failing, or a already failed there
            probes = ([a] if cap < fit_a else []) + ([b] if cap > fail_b else [])
            plan.append((cap, probes, a, b))
    return plan


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


def capture_traces(workloads: list[str], settings: argparse.Namespace, out: Path, timeout_s: float,
                   time_left: Callable[[], float | None]) -> tuple[dict[str, list[str]], list[dict]]:
    """--capture: per workload, one uncapped run under torch's native allocator with `--snapshot`, started as its
    probes are (`probe_command`: same script, seed and steps, so the same requests), its snapshot (one per FSDP
    rank) kept as OUT/traces/WORKLOAD*.gmtrace for `predict_brackets`. A capture that fails, or that the deadline
    leaves no time for, only leaves its workload unpredicted (its record says why)."""
    from gmlake.sim.trace import load, save_compact

    folder = out / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    traces: dict[str, list[str]] = {}
    records = []
    for workload in workloads:
        # No dot in the name: FSDP's rank r writes NAME.rank<r>.pickle.gz, split at the first dot
        name = workload.replace(".", "_")
        snapshot = folder / f"{name}.pickle.gz"
        record: dict = {"workload": workload, "allocator": "native"}
        records.append(record)
        left = time_left()
        if left is not None and left < CAPTURE_MIN_S:
            record["error"] = f"deadline: {left:.0f} s left"
            continue
        cmd, env = probe_command(workload, "native", settings, folder / f"{name}.json")
        cmd += ["--snapshot", str(snapshot)]
        print(f"== capture {workload} (native, uncapped, --snapshot)", flush=True)
        started = time.perf_counter()
        proc, _ = harness.run_process(cmd, env, timeout_s if left is None else min(timeout_s, left))
        returncode, why = proc.returncode, harness.output_tail(proc, 500)
        record.update(returncode=returncode, wall_s=round(time.perf_counter() - started, 1))
        snapshots = [p for p in [snapshot, *sorted(folder.glob(f"{name}.rank*.pickle.gz"))] if p.exists()]
        if returncode != 0 or not snapshots:
            record["error"] = why if returncode != 0 else "the run wrote no snapshot"
            print(f"   capture failed: {record['error'][-200:]}", flush=True)
            continue
        try:
            paths = [str(save_compact(load(p), p.with_name(p.name.removesuffix(".pickle.gz") + ".gmtrace")))
                     for p in snapshots]
        except (OSError, ValueError) as exc:        # TraceError is a ValueError
            record["error"] = f"unreadable snapshot: {exc}"
            continue
        for p in snapshots:
            p.unlink()
        record["traces"] = traces[workload] = paths
        print(f"   {len(paths)} trace(s) in {record['wall_s']:.0f} s", flush=True)
    return traces, records


def table(record: dict) -> str:
    """The final table: per pair, the smallest fraction that fit (and in GiB), the uncapped peak reserved, and the
    time at 1.05 x that cap over the uncapped time."""
    total = record["device_total_memory"]
    columns = ("workload", "allocator", "status", "probes", "floor GiB", "smallest fit", "fit GiB",
               "largest OOM GiB", "replay OOM / fit GiB", "uncapped resv GiB", "time at 1.05x / uncapped",
               "driver s added")

    def gib(fraction: float | None) -> str:
        return "-" if fraction is None else f"{fraction * total / GIB:.3f}"

    rows = []
    for p in record["pairs"]:
        ref = p.get("reference") or {}
        fit = smallest_fit_shown(p)
        predicted = p.get("predicted")
        replayed = "-" if predicted is None else (
            f"{gib(predicted['largest_fail'])} / {gib(predicted['smallest_fit'])}"
            + ("" if p.get("prediction_held", True) else " (missed)"))
        rows.append((p["workload"], p["allocator"], p["status"], str(p["probes"]), gib(p.get("floor")),
                     "-" if fit is None else f"{fit:.5f}", gib(fit), gib(p.get("largest_fail")), replayed,
                     "-" if not ref.get("max_memory_reserved") else f"{ref['max_memory_reserved'] / GIB:.2f}",
                     f"{p['time_ratio']:.3f}" if "time_ratio" in p else "-",
                     f"{p['driver_added_s']:+.3f}" if "driver_added_s" in p else "-"))
    title = (f"smallest memory fraction at which {record['settings']['steps']} steps complete (device "
             f"{total / GIB:.1f} GiB, resolution {record['settings']['resolution']})")
    return render_table(title, columns, rows, left=("workload", "allocator", "status"))


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of how each run goes (its steps, warm-up, seed, model size, timeout) and of the deadline, shared
    with bench cap time; `check_run_options` checks them."""
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, help="steps not timed (default: the first quarter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=("full", "small"), default="full", help="the dynamic workloads' models")
    parser.add_argument("--deadline", type=float, default=0, help="seconds from the start (0: none)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one run may take")


def check_run_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad run options in one line (exit 2), and fill in the default warm-up."""
    args.warmup = args.steps // 4 if args.warmup is None else args.warmup
    if args.steps < 1 or not 0 <= args.warmup < args.steps:
        parser.error("need --steps >= 1 and 0 <= --warmup < --steps")
    if not args.deadline >= 0 or not args.timeout > 0:
        parser.error("need --deadline >= 0 and --timeout > 0")
    args.device = "cuda"              # for speed_suite.command: a fraction only means something on a CUDA device


def parse_args(argv: list[str] | None = None, prog: str = "bench cap search") -> argparse.Namespace:
    """The command line, checked: any bad value is one line on stderr and exit 2."""
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(speed_suite.WORKLOADS))
    parser.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=["expandable", "gmlake"])
    parser.add_argument("--resolution", type=float, default=0.01, help="stop bisecting at hi / lo <= 1 + this")
    add_run_options(parser)
    parser.add_argument("--bounds-from", metavar="SUMMARY_JSON",
                        help="a speed-suite summary.json or a train-suite results JSON (see above)")
    parser.add_argument("--predict", nargs="+", metavar="WORKLOAD=TRACE", default=[],
                        help="replay TRACE (a snapshot or .gmtrace of the workload's run) under each allocator's "
                             "policy first and probe its bracket first (see above)")
    parser.add_argument("--capture", nargs="*", metavar="WORKLOAD",
                        help="capture each WORKLOAD's trace first (no names: every workload without --predict) in "
                             "one uncapped native run with --snapshot, then predict from it as --predict does")
    parser.add_argument("--out", default=str(RESULTS / "train" / "cap"))
    args = parser.parse_args(argv)
    check_run_options(parser, args)
    if not 0 < args.resolution < 1:
        parser.error(f"--resolution needs a number in (0, 1), got {args.resolution}")
    if args.bounds_from and not Path(args.bounds_from).is_file():
        parser.error(f"--bounds-from: no such file: {args.bounds_from}")
    args.workloads = list(dict.fromkeys(args.workloads))
    args.allocators = list(dict.fromkeys(args.allocators))
    args.predict_traces = {}
    for item in args.predict:
        workload, sep, path = item.partition("=")
        if not sep or workload not in args.workloads:
            parser.error(f"--predict takes WORKLOAD=TRACE with WORKLOAD one of --workloads, got {item!r}")
        if not Path(path).is_file():
            parser.error(f"--predict {workload}: no such file: {path}")
        args.predict_traces.setdefault(workload, []).append(path)      # FSDP: one trace per rank
    if args.capture is not None:
        args.capture = list(dict.fromkeys(args.capture or [w for w in args.workloads if w not in args.predict_traces]))
        for workload in args.capture:
            if workload not in args.workloads or workload in args.predict_traces:
                parser.error(f"--capture {workload}: not one of --workloads, or already given to --predict")
        if not args.capture:
            parser.error("--capture: every workload already has a --predict trace")
    if args.predict_traces or args.capture:
        try:
            for allocator in args.allocators:
                replay_policy(allocator)
        except ValueError as exc:
            parser.error(f"--predict: {exc}")
    return args


def main(argv: list[str] | None = None, prog: str = "bench cap search") -> None:
    args = parse_args(argv, prog)
    started = time.perf_counter()
    try:
        total = device_total_memory()
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"{prog}: cannot read the CUDA device's total memory: {exc}")
    try:
        bounds = read_bounds(args.bounds_from, total) if args.bounds_from else {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{prog}: --bounds-from {args.bounds_from}: not a speed-suite summary ({exc!r})",
              file=sys.stderr)
        sys.exit(2)
    try:                                        # the traces given first: a bad one costs no device time
        predictions, predicted_rows = predict_brackets(args.predict_traces, args.allocators, total)
    except (OSError, ValueError) as exc:        # TraceError is a ValueError
        print(f"{prog}: --predict: {exc}", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"environment": environment(), "settings": vars(args), "device_total_memory": total,
                    "predictions": predicted_rows, "probes": [], "pairs": []}

    def save() -> None:
        record["search_wall_s"] = round(time.perf_counter() - started, 1)
        (out / "cap.json").write_text(json.dumps(record, indent=1) + "\n")

    def time_left() -> float | None:
        return args.deadline - (time.perf_counter() - started) if args.deadline else None

    if args.capture:
        captured, record["captures"] = capture_traces(args.capture, args, out, args.timeout, time_left)
        more, rows = predict_brackets(captured, args.allocators, total)     # each trace just loaded fine
        predictions.update(more)
        record["predictions"] += rows
        save()

    def runner(workload: str, allocator: str, purpose: str, fraction: float | None, timeout_s: float) -> dict:
        return run_probe(workload, allocator, purpose, fraction, timeout_s, settings=args, out=out,
                         index=len(record["probes"]))

    print(f"{len(args.workloads) * len(args.allocators)} pairs, {args.steps} steps ({args.warmup} warm-up), device "
          f"{total / GIB:.1f} GiB, resolution {args.resolution}, deadline {args.deadline or 'none'}"
          + (f", bounds from {args.bounds_from}" if args.bounds_from else ""), flush=True)
    search(args.workloads, args.allocators, total, args.resolution, bounds, runner, time_left, args.timeout, record,
           save, predictions, replay_thresholds(record["predictions"], total))
    save()
    print(f"\ncap search: {len(record['probes'])} probes in {record['search_wall_s']:.0f} s; results in {out}")
    print(table(record))
    for verdict in record["verdicts"]:
        print(f"{verdict['workload']}: {verdict['below']} below {verdict['above']}, shown: it fit "
              f"{verdict['fit'] * total / GIB:.3f} GiB where {verdict['above']} ran out of memory at "
              f"{verdict['other_failed'] * total / GIB:.3f}")
