"""The device as the limit, with CUDA's libraries loading lazily as they do by default: does each allocator train
every step on a device that leaves k x P + L free?

    python -m bench edge-fit --workloads rl sage t5 bert --k 1.02 1.03 1.05 --allocators expandable gmlake \\
        --rounds 2 --steps 16 --out DIR [--calibration DIR/edge-fit.json [--fresh]] [--deadline SECONDS]

Method (docs/benchmarks.md, "The device itself as the limit, libraries loading lazily"): per workload, one
calibration run under PyTorch's native allocator with nothing taken from the device records the job's peak
allocated P, the most memory it took outside its allocator after CUDA started, L (CUDA's libraries: handles,
lazily loaded kernels, workspaces; bench/workloads/common.py, Note [Memory outside the allocator]), and a trace
with those bytes sampled over the run (Note [Sampling the libraries' memory]) for replay. Then every run starts in
a fresh process which, once its CUDA context exists, takes all of the device's free memory but k x P + L outside
any allocator (cuMemAlloc), and trains the same shape schedule. A run ends as `fit` (every step), `oom` (the
allocator's torch.OutOfMemoryError) or `library` (a step failed with another error: a CUDA library that found no
memory). Runs interleave: in each round, per k and workload, the allocators go forward in even rounds and backward
in odd ones. CUDA_MODULE_LOADING is left at CUDA's default (lazy): loading kernels during the run is what this
measures. --calibration reuses an earlier call's calibrations (made with the same --steps, --seed and --size, or it
is refused) and keeps its runs, running only those it lacks, so rounds can be spread over calls. Output:
DIR/edge-fit.json and a line per run.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from bench.cli import OneLineParser
from bench.harness import launch, run_process

WORKLOAD_MODULE = "bench.workloads.dynamic"
WORKLOADS = ("rl", "sage", "t5", "bert", "vit", "cnn", "moe")    # bench/workloads/dynamic.py's BUILDERS
LEAVE_FREE_ENV = "GMLAKE_BENCH_LEAVE_FREE"      # bench/workloads/common.py's (importing it would import torch)
OOM_EXIT, LIBRARY_FAILURE_EXIT = 3, 4           # bench/workloads/common.py's exit statuses


def command(workload: str, allocator: str, args: argparse.Namespace, json_path: Path,
            snapshot: Path | None = None) -> tuple[list[str], dict]:
    """The command line and environment of one run at memory fraction 1 (which caps nothing, and makes the workload
    place the filler that $GMLAKE_BENCH_LEAVE_FREE asks for)."""
    script = ["-m", WORKLOAD_MODULE, "--workload", workload, "--steps", str(args.steps), "--seed", str(args.seed),
              "--size", args.size, "--gpu-time-steps", "0", "--memory-fraction", "1", "--json", str(json_path)]
    if snapshot is not None:
        script += ["--snapshot", str(snapshot)]
    return launch(allocator, [sys.executable], script)


def outcome(returncode: int, measured: dict) -> str:
    """fit, oom, library or error, from a run's exit status and summary."""
    if returncode == 0 and measured:
        return "fit"
    if returncode == OOM_EXIT and measured.get("oom"):
        return "oom"
    if returncode == LIBRARY_FAILURE_EXIT and measured.get("library_failure"):
        return "library"
    return "error"


def run(workload: str, allocator: str, leave: int, args: argparse.Namespace, name: str,
        snapshot: Path | None = None) -> dict:
    """One run in a fresh process with `leave` bytes left free on the device."""
    json_path = Path(args.out) / "runs" / f"{name}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.unlink(missing_ok=True)
    cmd, env = command(workload, allocator, args, json_path, snapshot)
    env[LEAVE_FREE_ENV] = str(leave)
    started = time.perf_counter()
    proc, _ = run_process(cmd, env, args.timeout)
    measured = json.loads(json_path.read_text()) if json_path.exists() else {}
    steps = measured.get("per_step") or []
    outside = [s.get("outside_allocator_bytes") for s in steps if s.get("outside_allocator_bytes") is not None]
    if measured.get("outside_allocator_bytes") is not None:
        outside.append(measured["outside_allocator_bytes"])
    record = {"workload": workload, "allocator": allocator, "leave_free": leave, "outcome": outcome(proc.returncode,
              measured), "returncode": proc.returncode, "wall_s": round(time.perf_counter() - started, 1),
              "steps_done": len(steps), "error": measured.get("error"),
              "max_memory_allocated": measured.get("max_memory_allocated"),
              "max_memory_reserved": measured.get("max_memory_reserved"), "timed_s": measured.get("timed_s"),
              "outside_max": max(outside) if outside else None, "filler_bytes": measured.get("filler_bytes"),
              "free_after_filler": measured.get("free_after_filler"), "policy": measured.get("gmlake_policy")}
    if measured.get("libraries"):
        record["libraries"] = measured["libraries"]
    if record["outcome"] == "error":
        record["stderr"] = (proc.stderr or proc.stdout or "")[-1500:]
    return record


def calibrate(workload: str, args: argparse.Namespace, total: int) -> dict:
    """P, L and a trace of `workload` under the native allocator, nothing taken from the device."""
    traces = Path(args.out) / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    cal = run(workload, "native", total, args, f"calibrate-{workload}", traces / f"{workload}.pickle.gz")
    cal["P"], cal["L"] = cal["max_memory_allocated"], max(0, cal["outside_max"] or 0)
    return cal


def order(workloads: list[str], ks: list[float], allocators: list[str], rounds: range) -> list[tuple]:
    return [(r, k, w, a) for r in rounds for k in ks for w in workloads
            for a in (allocators if r % 2 == 0 else allocators[::-1])]


def parse_args(argv: list[str] | None, prog: str = "bench edge-fit") -> argparse.Namespace:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["rl", "sage", "t5", "bert"], choices=WORKLOADS)
    parser.add_argument("--k", nargs="+", type=float, default=[1.02, 1.03, 1.05])
    parser.add_argument("--allocators", nargs="+", default=["expandable", "gmlake"],
                        help="native, expandable, or a gmlake policy name (gmlake, gmlake-paper, ...)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-round", type=int, default=0, help="number the rounds from here (a later call)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=("small", "full"), default="full")
    parser.add_argument("--timeout", type=int, default=180, help="seconds a run may take")
    parser.add_argument("--deadline", type=float, help="start no run after this many seconds")
    parser.add_argument("--calibration", help="an earlier edge-fit.json whose calibrations to reuse; the runs it "
                        "holds are kept and not made again, so a later call continues it")
    parser.add_argument("--fresh", action="store_true",
                        help="with --calibration, keep none of its runs: every run is made again (after a change to "
                             "an allocator, whose earlier runs no longer say what it does)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.rounds < 0 or args.steps < 1 or any(not 1 <= k <= 4 for k in args.k):
        parser.error("need --rounds >= 0, --steps >= 1 and every --k within [1, 4]")
    if args.fresh and not args.calibration:
        parser.error("--fresh needs --calibration (without it every run is made anyway)")
    if args.calibration:
        args.earlier = _earlier(parser, args)
    args.out = str(Path(args.out).resolve())       # the runs start in the repository's root (harness.run_process)
    return args


def kept_runs(args: argparse.Namespace) -> list[dict]:
    """The --calibration file's runs this call keeps (and so does not make again): all of them, or none with
    --fresh."""
    return [] if args.fresh else list(args.earlier.get("runs", []))


def _earlier(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The --calibration file, refused in one line where it is not an edge-fit record or was calibrated on another
    shape schedule: P is the peak over the calibrated steps, so runs of more steps (or another seed or size) can
    need more than k x P, and every allocator would run out of memory for want of a calibration, not of memory."""
    path = Path(args.calibration)
    try:
        earlier = json.loads(path.read_text())
    except FileNotFoundError:
        parser.error(f"--calibration {path}: no such file")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parser.error(f"--calibration {path}: not an edge-fit.json ({type(exc).__name__}: {exc})")
    if not isinstance(earlier, dict) or not isinstance(earlier.get("calibrations"), dict):
        parser.error(f"--calibration {path}: not an edge-fit.json (no calibrations)")
    for name in ("steps", "seed", "size"):
        theirs, ours = earlier.get(name), getattr(args, name)
        if theirs is not None and theirs != ours:
            parser.error(f"--calibration {path} was calibrated with --{name} {theirs}, not {ours}: its P does not "
                         f"hold for these runs; pass --{name} {theirs}, or calibrate again without --calibration")
    return earlier


def main(argv: list[str] | None = None, prog: str = "bench edge-fit") -> int:
    args = parse_args(argv, prog)
    import torch

    total = torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else 0
    if not total:
        print(f"{prog}: error: needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device_total": total, "torch": torch.__version__, "steps": args.steps, "seed": args.seed,
              "size": args.size, "calibrations": {}, "runs": []}
    if args.calibration:
        result["calibrations"], result["runs"] = args.earlier["calibrations"], kept_runs(args)
    done = {(r["round"], r["k"], r["workload"], r["allocator"]) for r in result["runs"]}
    started = time.perf_counter()

    def save() -> None:
        (out / "edge-fit.json").write_text(json.dumps(result, indent=1))

    for workload in args.workloads:
        if workload not in result["calibrations"]:
            cal = result["calibrations"][workload] = calibrate(workload, args, total)
            print(f"calibrate {workload}: {cal['outcome']} P={cal['P']} L={cal['L']} ({cal['wall_s']} s)", flush=True)
            save()
    for r, k, workload, allocator in order(args.workloads, args.k, args.allocators,
                                           range(args.first_round, args.first_round + args.rounds)):
        if args.deadline and time.perf_counter() - started > args.deadline:
            print("deadline: no more runs started", flush=True)
            break
        cal = result["calibrations"][workload]
        if not cal.get("P") or (r, k, workload, allocator) in done:
            continue
        leave = math.ceil(k * cal["P"]) + cal["L"]
        rec = run(workload, allocator, leave, args, f"r{r}-k{k}-{workload}-{allocator}")
        rec.update(round=r, k=k)
        result["runs"].append(rec)
        print(f"r{r} k={k} {workload:5} {allocator:10} {rec['outcome']:7} steps={rec['steps_done']:3} "
              f"reserved={rec['max_memory_reserved']} outside={rec['outside_max']} ({rec['wall_s']} s)"
              f"{'  ' + str(rec['error'])[:160] if rec['outcome'] != 'fit' else ''}", flush=True)
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
