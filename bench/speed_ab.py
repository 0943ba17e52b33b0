"""Warm step time of allocators or of two builds of gmlake, interleaved, with a verdict that can say "cannot decide".

    python -m bench speed-ab [--workloads t5 bert sage] [--allocators expandable gmlake gmlake-paper ...]
        [--rounds 2] [--pool 6] [--warmup 8] [--timed 24] [--tolerance 2] [--device cuda|cpu] [--out DIR]

An allocator is a bench allocator's name or a gmlake policy, optionally with @TREE: another build of gmlake (a
checkout built in place), run with that gmlake and this checkout's workloads. The first allocator is the baseline.
docs/benchmarks.md ("Speed to 2 %") gives the measures and the verdict; per-step numbers go to DIR/speed-ab.json.

Note [Warm steps from a pool of shapes]: in the earlier speed runs a step of a shape new to the process took 3-7x a
step of a shape seen before (cuDNN's plans and the libraries' other first calls for a shape: host work that follows
the host's load), and with shapes drawn afresh nearly every timed step was such a first, so runs of one allocator
spread 8-35 %, while steps of a repeated shape matched across runs to the millisecond. So each run draws a pool of
distinct shapes, runs each once in the warm-up, then times steps drawn from the pool, never one shape twice in a row:
every timed step is warm, and sizes still change every step. Python's collector runs between steps, not in one.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import RESULTS, ROOT
from bench.cli import cell, render_table
from bench.cli import parser as make_parser
from bench.harness import ALLOCATORS, Results, environment, launch, measured_run, run_in_order, run_order, source_digest

WORKLOADS = ("vit", "bert", "t5", "cnn", "rl", "sage", "moe")
DEFAULT_WORKLOADS = ("t5", "bert", "sage")
DEFAULT_ALLOCATORS = ("expandable", "gmlake", "gmlake-paper")
# A run's length on an H100, read off the speed suites' runs there: (seconds to start the process and build the
# model, a step of a shape new to the run, a warm step). The first estimate of a call's length; the deadline then
# goes by the runs' own wall times.
RUN_COST = {"vit": (12, 0.2, 0.07), "bert": (12, 0.25, 0.12), "t5": (12, 0.45, 0.28), "cnn": (10, 0.2, 0.05),
            "rl": (12, 1.4, 1.4), "sage": (10, 0.05, 0.04), "moe": (12, 0.3, 0.15)}
CPU_RUN_COST = (4, 0.05, 0.02)


def expected_run_s(workload: str, args: argparse.Namespace) -> float:
    """How long one run of `workload` will likely take (RUN_COST)."""
    start, first, warm = CPU_RUN_COST if args.device == "cpu" else RUN_COST[workload]
    return start + first * args.pool + warm * (args.warmup - args.pool + args.timed)
WORKLOAD_MODULE = "bench.workloads.dynamic"     # the tests put a stand-in here
# what a tree's build must hold itself (check_build)
BUILT_MODULES = ("gmlake", "gmlake.core._allocator", "gmlake.core._driver", "gmlake.drivers._cuda_driver",
                 "gmlake.torch._torch_bridge")


# ---- allocators and builds ------------------------------------------------------------------------------------

def parse_spec(spec: str) -> tuple[str, Path | None]:
    """`NAME` or `NAME@TREE` -> (NAME, TREE resolved or None); ValueError saying why for a bad one."""
    name, at, tree = spec.partition("@")
    if not name or (at and not tree):
        raise ValueError(f"allocator {spec!r} has no name before '@'" if not name else f"allocator {spec!r} names no "
                         "tree after '@'")
    if not at:
        return name, None
    path = Path(tree).expanduser().resolve()
    if not (path / "gmlake" / "__init__.py").is_file():
        raise ValueError(f"allocator {spec!r}: {path} holds no gmlake/__init__.py (a checkout of gmlake, built in place)")
    return name, path


def short_name(spec: str) -> str:
    """`spec` for a table: a tree by its last path component (the record's "builds" has the whole path)."""
    name, _, tree = spec.partition("@")
    return f"{name}@{Path(tree).expanduser().resolve().name}" if tree else name


def spec_command(spec: str, script: list[str], links: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run `script` (python arguments) under the allocator `spec`. A tree's
    gmlake comes from a directory under `links` that holds only a link to it, first on PYTHONPATH, so that bench and
    its workloads still come from this checkout; -P keeps the working directory (this checkout) off the path."""
    name, tree = parse_spec(spec)
    cmd, env = launch(name, [sys.executable] + (["-P"] if tree else []), script)
    if tree is not None:
        target = links / source_digest(tree)
        target.mkdir(parents=True, exist_ok=True)
        if not (target / "gmlake").exists():
            (target / "gmlake").symlink_to(tree / "gmlake", target_is_directory=True)
        env["PYTHONPATH"] = os.pathsep.join([str(target), env["PYTHONPATH"]])
    return cmd, env


def check_build(spec: str, links: Path) -> str | None:
    """Why `spec`'s gmlake cannot run (its tree's gmlake not the one imported, or its core not built), else None."""
    tree = parse_spec(spec)[1]
    if tree is None:
        return None
    _, env = spec_command(spec, [], links)
    # every compiled module too: where the tree lacks one, an editable install of this checkout would supply its own
    probe = ("import importlib; print('\\n'.join(importlib.import_module(m).__file__ for m in "
             f"{BUILT_MODULES!r}))")
    proc = subprocess.run([sys.executable, "-P", "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout or "no output").strip().splitlines()[-1]
        return f"allocator {spec!r}: its gmlake does not import ({last}); build it in place first"
    for module, file in zip(BUILT_MODULES, proc.stdout.strip().splitlines()):
        if not Path(file).resolve().is_relative_to(tree / "gmlake"):
            return (f"allocator {spec!r}: the run would import {module} from {Path(file).parent}, not from {tree} "
                    f"(build the tree in place: python setup.py build_ext --inplace)")
    return None


# ---- statistics ---------------------------------------------------------------------------------------------

def spread_pct(values: list[float]) -> float | None:
    """(max - min) / median, in %; None for fewer than two values."""
    return 100.0 * (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def warm_figures(per_step: list[dict], warmup: int) -> dict:
    """One run's figures over its timed (warm) steps: the sum and median of the step times, and of the CUDA-event
    times where the steps carry them."""
    timed = per_step[warmup:]
    seconds = [r["step_s"] for r in timed]
    out = {"warm_steps": len(timed), "warm_sum_s": sum(seconds), "warm_median_s": statistics.median(seconds)}
    events = [r["event_ms"] for r in timed if "event_ms" in r]
    if timed and len(events) == len(timed):
        out.update(event_sum_ms=sum(events), event_median_ms=statistics.median(events))
    for probe in ("gpu_spin_ms", "launch_ms", "cpu_ms"):    # Note [Machine regimes]: which part of the machine moved
        values = [r[probe] for r in timed if probe in r]
        if values:
            out[f"median_{probe}"] = statistics.median(values)
    return out


def verdict(ratios: list[float], spread: float | None, tolerance: float) -> str:
    """What the rounds' ratios (allocator / baseline, one per round) say for a tolerance of `tolerance` %, given the
    spread (the largest of the allocator's, the baseline's and the ratios', in %): see the module's docstring."""
    t = tolerance / 100.0
    if len(ratios) < 2 or spread is None:
        return "cannot decide: one round"
    if spread > tolerance:
        return f"cannot decide: spread {spread:.1f}% > {tolerance:g}%"
    lo, hi = min(ratios), max(ratios)
    if lo > 1 + t:
        return f"slower by more than {tolerance:g}%"
    if hi < 1 - t:
        return f"faster by more than {tolerance:g}%"
    if hi > 1 + t:
        return f"cannot decide: rounds straddle +{tolerance:g}%"
    if lo < 1 - t:
        return f"not slower by {tolerance:g}% (maybe faster)"
    return f"within {tolerance:g}%"


def compare(runs: list[dict], workloads: list[str], specs: list[str], tolerance: float) -> list[dict]:
    """One row per workload and allocator: each round's warm sum, its spread, and against the baseline (specs[0])
    each round's ratio, their median and spread, and the verdict."""
    rows = []
    for workload in workloads:
        here = [r for r in runs if r["workload"] == workload]
        by_spec = {spec: {r["round"]: r for r in here if r["allocator"] == spec and "error" not in r} for spec in specs}
        base = by_spec[specs[0]]
        for spec in specs:
            mine = by_spec[spec]
            sums = [mine[k]["warm_sum_s"] for k in sorted(mine)]
            failed = sum(r["allocator"] == spec and "error" in r for r in here)
            row = {"workload": workload, "allocator": spec, "rounds": len(sums), "failed": failed,
                   "warm_sum_s": sums, "spread_pct": spread_pct(sums),
                   "warm_median_s": statistics.median(mine[k]["warm_median_s"] for k in mine) if mine else None}
            events = [mine[k]["event_sum_ms"] for k in sorted(mine) if "event_sum_ms" in mine[k]]
            if events:
                row.update(event_sum_ms=events, event_spread_pct=spread_pct(events))
            reserved = [mine[k]["max_memory_reserved"] for k in mine if "max_memory_reserved" in mine[k]]
            if reserved:
                row["peak_reserved_gib"] = statistics.median(reserved) / (1 << 30)
            calls = [mine[k]["gmlake_after_warmup"]["driver_calls"] / mine[k]["warm_steps"] for k in mine
                     if (mine[k].get("gmlake_after_warmup") or {}).get("driver_calls") is not None]
            if calls:           # gmlake's driver calls per timed step, median over the rounds
                row["driver_calls_per_warm_step"] = statistics.median(calls)
            if spec != specs[0]:
                paired = sorted(set(mine) & set(base))
                ratios = [mine[k]["warm_sum_s"] / base[k]["warm_sum_s"] for k in paired]
                medians = [mine[k]["warm_median_s"] / base[k]["warm_median_s"] for k in paired]
                base_spread = spread_pct([base[k]["warm_sum_s"] for k in paired])
                parts = [spread_pct(ratios), row["spread_pct"], base_spread]
                spread = None if None in parts else max(parts)
                event_ratios = [mine[k]["event_sum_ms"] / base[k]["event_sum_ms"] for k in paired
                                if "event_sum_ms" in mine[k] and "event_sum_ms" in base[k]]
                if event_ratios:    # the same ratio from CUDA events: the device's view of each step
                    row.update(event_ratios=event_ratios, event_ratio=statistics.median(event_ratios))
                row.update(ratios=ratios, ratio=statistics.median(ratios) if ratios else None,
                           ratio_spread_pct=spread_pct(ratios), median_ratio=statistics.median(medians)
                           if medians else None, spread_for_verdict_pct=spread,
                           verdict=verdict(ratios, spread, tolerance))
            rows.append(row)
    return rows


def format_table(rows: list[dict], baseline: str, tolerance: float) -> str:
    """The table printed last."""
    title = (f"warm step time: sum of the timed steps per run; ratio = the rounds' median of (sum / "
             f"{short_name(baseline)}'s sum "
             f"in the same round); spread = (max - min) / median over the rounds; verdict at {tolerance:g}%")
    columns = ["workload", "allocator", "rounds", "warm sum s, each round", "spread", "vs baseline", "ratio spread",
               "median step ratio", "events ratio", "resv GiB", "drv calls/step", "verdict"]
    cells = []
    for row in rows:
        sums = " ".join(f"{s:.3f}" for s in row["warm_sum_s"]) or "-"
        note = f" ({row['failed']} failed)" if row["failed"] else ""
        cells.append([row["workload"], short_name(row["allocator"]), str(row["rounds"]), sums, cell(row["spread_pct"], ".2f", "%"),
                      cell(row.get("ratio"), ".4f", "x") if "verdict" in row else "baseline",
                      cell(row.get("ratio_spread_pct"), ".2f", "%"), cell(row.get("median_ratio"), ".4f", "x"),
                      cell(row.get("event_ratio"), ".4f", "x"), cell(row.get("peak_reserved_gib"), ".2f"),
                      cell(row.get("driver_calls_per_warm_step"), ".1f"), row.get("verdict", "") + note])
    return render_table(title, columns, cells, left=("workload", "allocator", "warm sum s, each round", "verdict"),
                        borders=False)


def markdown_table(record: dict) -> str:
    """A speed-ab record as a Markdown table for docs/benchmarks.md, with its machine, versions, date and command
    under it (for the docs generator)."""
    lines = ["| workload | allocator | warm sum s, each round | spread | vs baseline (spread) | verdict |",
             "|---|---|---|---|---|---|"]
    for row in record["rows"]:
        ratio = (f"{row['ratio']:.3f} ({row['ratio_spread_pct']:.1f} %)" if row.get("ratio") is not None
                 and row.get("ratio_spread_pct") is not None else "baseline" if "verdict" not in row else "-")
        sums = " / ".join(f"{s:.2f}" for s in row["warm_sum_s"]) or "-"
        spread = "-" if row["spread_pct"] is None else f"{row['spread_pct']:.1f} %"
        lines.append(f"| {row['workload']} | {short_name(row['allocator'])} | {sums} | {spread} | {ratio} | "
                     f"{row.get('verdict', '')} |")
    env = record["environment"]
    lines += ["", (f"{env['gpu']} (driver {env['nvidia_driver']}), torch {env['torch']}, Python {env['python']}, "
                   f"{env['date'][:10]}; `{env['command']}`.")]
    return "\n".join(lines)


# ---- the runs -----------------------------------------------------------------------------------------------

def run_one(index: int, round_: int, workload: str, spec: str, args: argparse.Namespace, scratch: Path,
            timeout_s: float) -> dict:
    """One run in a fresh process: its command, exit status, wall time, warm figures and per-step records."""
    json_path = scratch / f"{index:02d}.json"
    script = ["-m", WORKLOAD_MODULE, "--workload", workload, "--steps", str(args.warmup + args.timed),
              "--warmup", str(args.warmup), "--shape-pool", str(args.pool), "--quiet-gc", "--gpu-time-steps", "0",
              "--seed", str(args.seed), "--device", args.device, "--size", args.size, "--json", str(json_path)]
    cmd, env = spec_command(spec, script, scratch / "trees")
    run = measured_run(cmd, env, json_path, timeout_s,
                       {"index": index, "round": round_, "workload": workload, "allocator": spec})
    json_path.unlink(missing_ok=True)
    if "error" not in run:
        run.update(warm_figures(run["per_step"], run["warmup_steps"]))
        for key in ("gmlake", "config"):      # the record's bulk; the per-step records stay
            run.pop(key, None)
    return run


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a bad command line in one line (exit 2)."""
    if args.rounds < 1 or args.pool < 1 or args.timed < 1:
        parser.error("need --rounds, --pool and --timed >= 1")
    if args.warmup < args.pool:
        parser.error(f"need --warmup >= --pool ({args.pool}): the warm-up runs every shape of the pool once")
    if not 0 < args.tolerance < 100 or not args.timeout > 0 or not args.deadline >= 0:
        parser.error("need 0 < --tolerance < 100, --timeout > 0 and --deadline >= 0")
    if len(set(args.allocators)) != len(args.allocators) or len(args.allocators) < 2:
        parser.error("need two or more distinct allocators (the first is the baseline)")
    for spec in args.allocators:
        try:
            name, _ = parse_spec(spec)
        except ValueError as exc:
            parser.error(str(exc))
        if name not in ALLOCATORS and not name.startswith("gmlake"):
            parser.error(f"unknown allocator {name!r}; one of {', '.join(ALLOCATORS)} or a gmlake policy")
        if args.device == "cpu" and name != "native":
            parser.error(f"allocator {spec!r} needs CUDA; on --device cpu only native and native@TREE run")


def main(argv: list[str] | None = None, prog: str = "bench speed-ab") -> int:
    """Exit status 0 when every run finished, 1 when some failed (the table says which), 2 for bad input."""
    parser = make_parser(prog, __doc__)
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--allocators", nargs="+", default=list(DEFAULT_ALLOCATORS), metavar="NAME[@TREE]",
                        help="the first is the baseline")
    parser.add_argument("--rounds", type=int, default=2, help="A B C then C B A ...: two at least to decide")
    parser.add_argument("--pool", type=int, default=6, help="distinct shapes per run")
    parser.add_argument("--warmup", type=int, default=8, help="steps not timed (at least --pool)")
    parser.add_argument("--timed", type=int, default=24, help="warm steps timed per run")
    parser.add_argument("--tolerance", type=float, default=2.0, help="the question, in %%")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=("full", "small"), help="default: full on cuda, small on cpu")
    parser.add_argument("--deadline", type=float, default=540, help="start no run that would end after it (s; 0: none)")
    parser.add_argument("--timeout", type=float, default=150, help="seconds one run may take")
    parser.add_argument("--out", default=str(RESULTS / "speed-ab"))
    args = parser.parse_args(argv)
    check_args(parser, args)
    args.size = args.size or ("full" if args.device == "cuda" else "small")
    scratch = Path(tempfile.mkdtemp(prefix="speed-ab-"))
    try:
        for spec in args.allocators:
            why = check_build(spec, scratch / "trees")
            if why:
                parser.error(why)
        if args.device == "cuda" and not cuda_available():
            parser.error("--device cuda, but no CUDA device is available here (--device cpu for a smoke test)")
        return run_all(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def run_all(args: argparse.Namespace, scratch: Path) -> int:
    """Every run in order, the record rewritten after each, the table last; 1 where a run failed, else 0."""
    specs = list(args.allocators)
    order = run_order(args.workloads, specs, args.rounds)
    builds = {spec: {"tree": str(tree or ROOT), "gmlake_source_sha256": source_digest(tree or ROOT)}
              for spec, tree in ((s, parse_spec(s)[1]) for s in specs)}
    results = Results(Path(args.out), "speed-ab.json", {
        "environment": environment(), "settings": vars(args), "builds": builds,
        "order": [f"{w}:{a}:r{r}" for r, w, a in order], "runs": [], "rows": []}, args.deadline)
    expected = sum(expected_run_s(w, args) for _, w, _ in order)
    print(f"{len(order)} runs ({len(args.workloads)} workloads x {len(specs)} allocators x {args.rounds} rounds): "
          f"{args.warmup} warm-up steps over a pool of {args.pool} shapes, {args.timed} timed; device {args.device}, "
          f"size {args.size}; expected about {expected:.0f} s (deadline {args.deadline or 'none'})", flush=True)

    def expected_run(item: tuple) -> float:
        done = [r["wall_s"] for r in results.record["runs"] if r["workload"] == item[1] and "error" not in r]
        return max(done) if done else expected_run_s(item[1], args)

    run_in_order(order, results, timeout=args.timeout,
                 run=lambda index, item, timeout_s: run_one(index, *item, args, scratch, timeout_s),
                 expected=expected_run, label=lambda item: f"{item[1]} / {item[2]}",
                 rows=lambda runs: compare(runs, args.workloads, specs, args.tolerance),
                 shown=("warm_sum_s", "warm_median_s", "event_sum_ms", "wall_s"))
    print(format_table(results.record["rows"], specs[0], args.tolerance))
    failed = sum("error" in r for r in results.record["runs"])
    if failed:
        print(f"{failed} of {len(results.record['runs'])} runs failed: their errors are in {results.path}")
    return 1 if failed else 0
