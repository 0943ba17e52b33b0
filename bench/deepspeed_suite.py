"""DeepSpeed ZeRO-2 and ZeRO-3 with the optimizer offloaded to the CPU, on one GPU, under native,
expandable segments and gmlake, interleaved.

    python -m bench deepspeed [--stages 2 3] [--allocators native expandable gmlake] [--rounds 2] [--steps 40]
        [--optimizer cpu-adam|torch-adamw|auto] [--launch alternate|deepspeed|direct] [--deadline S] [--out DIR]

Each run is a fresh process of bench/workloads/deepspeed_train.py, A B C then C B A per stage; --launch alternate
starts gmlake through DeepSpeed's launcher (`GMLAKE=1`) and as one process (`gmlake run`) in turn. A preflight
stops the suite in one line where deepspeed, the GPU or CPU Adam is missing. docs/benchmarks.md ("DeepSpeed ZeRO with
the optimizer on the CPU") holds the method and the table. Output: DIR/runs/*.json|.log and DIR/summary.json.
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from bench import RESULTS, child_env
from bench.cli import OneLineParser, cell, render_table
from bench.harness import (
    GIB,
    Results,
    environment,
    finished_runs,
    launch,
    measured_run,
    run_in_order,
    run_order,
    run_process,
)
from bench.speed_suite import native_spread, spread_pct

WORKLOAD_MODULE = "bench.workloads.deepspeed_train"
WORKLOAD_SCRIPT = "bench/workloads/deepspeed_train.py"
ALLOCATORS = ("native", "expandable", "gmlake")
LAUNCHES = ("alternate", "deepspeed", "direct")
OPTIMIZERS = ("cpu-adam", "torch-adamw", "auto")
BASE_PORT = 29600          # MASTER_PORT of run NN: BASE_PORT + NN (a run never waits on the last one's socket)
# the workload's sizes, passed through as they are (flag, default): a 16 x 1024 GPT-2 (255M parameters, GPT-2's 50257
# tokens), so that CPU Adam's step over them keeps a run near half a minute and the matrix inside one device command
SIZES = (("--batch", 8), ("--min-seq", 128), ("--max-seq", 1024), ("--hidden", 1024), ("--layers", 16),
         ("--vocab", 50257))
CPU_SIZES = {"--batch": 2, "--min-seq": 16, "--max-seq": 64, "--hidden": 64, "--layers": 2, "--vocab": 512}


def stage_name(stage: int) -> str:
    return f"zero{stage}"


def launch_of(round_: int, stage_index: int, launch: str) -> str:
    """How the runs of `round_` of the stage_index-th stage start: "deepspeed" (the launcher) or "direct" (one
    process). "alternate" switches with the stage and the round, so that the first round alone starts gmlake both
    ways and, over two rounds, each stage runs both ways."""
    if launch == "alternate":
        return "deepspeed" if (round_ + stage_index) % 2 == 0 else "direct"
    return launch


def deepspeed_launcher() -> list[str]:
    """DeepSpeed's launcher: `deepspeed` on PATH, else its module under this Python (the same program)."""
    found = shutil.which("deepspeed")
    return [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]


def workload_args(stage: int, args) -> list[str]:
    out = ["--stage", str(stage), "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
           "--optimizer", args.optimizer, "--device", args.device]
    for flag, _ in SIZES:
        out += [flag, str(getattr(args, flag[2:].replace("-", "_")))]
    return out


def command(stage: int, allocator: str, how: str, args, json_path: Path, port: int,
            launcher: list[str] | None = None) -> tuple[list[str], dict]:
    """The command line and environment of one run, started `how` ("deepspeed": the launcher, gmlake by GMLAKE=1;
    "direct": one process, gmlake by `gmlake run`)."""
    script = [*workload_args(stage, args), "--json", str(json_path)]
    if how == "deepspeed":
        ds = [*(launcher or deepspeed_launcher()), "--num_gpus", "1", "--master_port", str(port), WORKLOAD_SCRIPT]
        cmd, env = launch("native" if allocator == "gmlake" else allocator, ds, script)
        if allocator == "gmlake":
            env["GMLAKE"] = "1"
    else:
        cmd, env = launch(allocator, [sys.executable], ["-m", WORKLOAD_MODULE, *script])
    env["MASTER_PORT"] = str(port)
    return cmd, env


def expected_allocator(allocator: str, device: str) -> str:
    return "cpu" if device == "cpu" else allocator


def run_one(index: int, round_: int, stage: int, allocator: str, launch: str, args, timeout_s: float) -> dict:
    """One run in a fresh process; its measurements merged with the command, launch, return code and wall time."""
    base = Path(args.out) / "runs" / f"{index:02d}-{stage_name(stage)}-{allocator}"
    json_path, log_path = base.with_suffix(".json"), base.with_suffix(".log")
    cmd, env = command(stage, allocator, launch, args, json_path.resolve(), BASE_PORT + index)
    run = measured_run(cmd, env, json_path, timeout_s, {"index": index, "round": round_, "stage": stage,
                                                        "allocator": allocator, "launch": launch}, log=log_path)
    run["command"] = ("GMLAKE=1 " if env.get("GMLAKE") else "") + (
        f"PYTORCH_CUDA_ALLOC_CONF={env['PYTORCH_CUDA_ALLOC_CONF']} " if env["PYTORCH_CUDA_ALLOC_CONF"] else "") \
        + run["command"]
    if "error" not in run and run["allocator_seen"] != expected_allocator(allocator, args.device):
        run["error"] = f"ran under {run['allocator_seen']!r}, not {allocator!r}: the launch did not select it"
    json_path.write_text(json.dumps(run, indent=1) + "\n")
    return run


def loss_diff(losses: list[float], reference: list[float]) -> float | None:
    """The largest |loss - reference| over the steps; None where the two ran different numbers of steps."""
    if not losses or len(losses) != len(reference):
        return None
    return max(abs(a - b) for a, b in zip(losses, reference))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table_rows(runs: list[dict], stages: list[int], allocators: list[str]) -> list[dict]:
    """One row per stage and allocator with a run (see the module's docstring for the figures)."""
    rows = []
    for stage in stages:
        done_of = {a: [r for r in runs if r["stage"] == stage and r["allocator"] == a and "error" not in r]
                   for a in allocators}
        native_runs = sorted(done_of.get("native", []), key=lambda r: r["index"])
        reference = native_runs[0]["losses"] if native_runs else None
        medians = {a: _median([r["median_step_s"] for r in done]) for a, done in done_of.items()}
        reserved = {a: _median([r["max_memory_reserved"] for r in done if r.get("max_memory_reserved")])
                    for a, done in done_of.items()}
        for allocator, done, failed in finished_runs(runs, "stage", stage, allocators, rows):
            steps = [r["median_step_s"] for r in done]
            row = {"stage": stage, "allocator": allocator, "runs": len(done), "failed": failed,
                   "launches": sorted({r["launch"] for r in done}), "optimizer": sorted({r["optimizer"] for r in done}),
                   "median_step_s": medians[allocator], "step_s_runs": steps, "step_s_min": min(steps),
                   "step_s_max": max(steps), "spread_pct": spread_pct(steps)}
            native_median, expandable_median = medians.get("native"), medians.get("expandable")
            if native_median:
                row.update(step_vs_native=medians[allocator] / native_median,
                           step_vs_native_min=min(steps) / native_median, step_vs_native_max=max(steps) / native_median)
            row["step_vs_expandable"] = _ratio(medians[allocator], expandable_median)
            if reserved[allocator]:
                row.update(peak_reserved_gib=reserved[allocator] / GIB,
                           peak_reserved_gib_runs=[r["max_memory_reserved"] / GIB for r in done],
                           peak_allocated_gib=_median([r["max_memory_allocated"] for r in done]) / GIB,
                           utilization=_median([r["utilization"] for r in done]),
                           reserved_vs_native=_ratio(reserved[allocator], reserved.get("native")),
                           reserved_vs_expandable=_ratio(reserved[allocator], reserved.get("expandable")),
                           num_alloc_retries=max((r.get("num_alloc_retries") or 0) for r in done))
            if reference is not None:
                diffs = [loss_diff(r["losses"], reference) for r in done if r is not native_runs[0]]
                row["loss_max_abs_diff_vs_native"] = max(diffs) if diffs and None not in diffs else None
                row["losses_compared"] = len(diffs)
            after = [r["gmlake_after_warmup"] for r in done if r.get("gmlake_after_warmup")]
            if after:
                row.update(stitches_after_warmup=_median([a["stitches"] for a in after]),
                           driver_calls_after_warmup=_median([a["driver_calls"] for a in after]),
                           driver_busy_s_after_warmup=_median([a.get("driver_busy_s", 0.0) for a in after]))
            totals = [r["gmlake"] for r in done if r.get("gmlake")]
            if totals:
                row.update(stitches=_median([t["stitches"] for t in totals]),
                           driver_calls=_median([sum(t["calls"].values()) for t in totals]))
            rows.append(row)
    return rows


def format_table(rows: list[dict], warmup: int, steps: int) -> str:
    """The table printed at the end, and native's run-to-run spread under it."""
    title = (f"peaks over the training steps; step = median step time after {warmup} warm-up steps of {steps}, "
             "median over runs (min-max: the runs' medians); loss diff = largest |loss - native run 1's| over the "
             "steps; stitches, driver calls: gmlake's after warm-up")
    columns = ["stage", "allocator", "runs", "resv GiB", "vs nat", "vs exp", "alloc GiB", "util", "step s", "min-max",
               "vs nat", "vs exp", "loss diff", "stitches", "drv calls", "note"]
    cells = []
    for row in rows:
        name = stage_name(row["stage"])
        if not row["runs"]:
            cells.append([name, row["allocator"], "0", *[""] * 12, f"failed {row['failed']} time(s)"])
            continue
        cells.append([name, row["allocator"], str(row["runs"]), cell(row.get("peak_reserved_gib"), ".2f"),
                      cell(row.get("reserved_vs_native"), ".3f"), cell(row.get("reserved_vs_expandable"), ".3f"),
                      cell(row.get("peak_allocated_gib"), ".2f"), cell(row.get("utilization"), ".3f"),
                      f"{row['median_step_s']:.3f}", f"{row['step_s_min']:.3f}-{row['step_s_max']:.3f}",
                      cell(row.get("step_vs_native"), ".3f"), cell(row.get("step_vs_expandable"), ".3f"),
                      cell(row.get("loss_max_abs_diff_vs_native"), ".2g"), cell(row.get("stitches_after_warmup"), ".0f"),
                      cell(row.get("driver_calls_after_warmup"), ".0f"),
                      f"({row['failed']} failed)" if row["failed"] else ""])
    table = render_table(title, columns, cells, left=("stage", "allocator", "note"), borders=False)
    return "\n".join([table.rstrip("\n"), *native_spread(rows, lambda row: stage_name(row["stage"]), " of step time")])


def preflight(args) -> tuple[dict | None, str]:
    """The workload's --preflight in a fresh process: (its JSON, "") where the runs can go ahead, else (None, the
    one line that says why). With --optimizer auto, CPU Adam first, torch's AdamW where that fails (args.optimizer is
    set to what will run)."""
    tried = ["cpu-adam", "torch-adamw"] if args.optimizer == "auto" else [args.optimizer]
    why = ""
    for optimizer in tried:
        cmd = [sys.executable, "-m", WORKLOAD_MODULE, "--preflight", "--optimizer", optimizer, "--device", args.device]
        env = {**child_env(), "PYTHONUNBUFFERED": "1"}
        env.pop("GMLAKE", None)
        proc, timed_out = run_process(cmd, env, args.preflight_timeout)
        code, output = proc.returncode, proc.stdout + proc.stderr
        lines = [line for line in output.splitlines() if line.strip()]
        if code == 0 and lines:
            try:
                info = json.loads(lines[-1])
            except json.JSONDecodeError:
                info = None
            if info is not None:
                args.optimizer = optimizer
                if why:
                    info["fell_back_because"] = why
                return info, ""
        mine = [line for line in lines if "preflight:" in line]
        why = (f"timed out after {args.preflight_timeout:.0f} s (the CPU Adam build?)" if timed_out
               else (mine[-1] if mine else (lines[-1] if lines else f"exit status {code}, no output")))
        if optimizer == "cpu-adam" and len(tried) > 1:
            print(f"preflight: {why}\npreflight: --optimizer auto: falling back to torch-adamw", flush=True)
    return None, why


def build_parser(prog: str) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="+", type=int, choices=(2, 3), default=[2, 3])
    parser.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=list(ALLOCATORS))
    parser.add_argument("--rounds", type=int, default=2, help="each round runs every allocator once per stage")
    parser.add_argument("--first-round", type=int, default=0, metavar="N",
                        help="start at round N (0-based): a later call continues a suite a deadline cut short, in "
                             "the order and with the launches that round has in a whole suite")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10, help="steps not timed")
    parser.add_argument("--seed", type=int, default=0)
    for flag, default in SIZES:
        parser.add_argument(flag, type=int, help=f"the workload's {flag} (default {default}; on the CPU "
                                                 f"{CPU_SIZES[flag]})")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="cpu-adam",
                        help="cpu-adam: DeepSpeedCPUAdam; torch-adamw: torch's AdamW on the CPU; auto: CPU Adam "
                             "where it builds, else torch-adamw")
    parser.add_argument("--launch", choices=LAUNCHES, default="alternate",
                        help="deepspeed: the deepspeed launcher (gmlake: GMLAKE=1); direct: one process (gmlake: "
                             "gmlake run -m); alternate: one stage each way, swapped in odd rounds")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke test of the suite on DeepSpeed's CPU accelerator, native only, tiny model")
    parser.add_argument("--deadline", type=float, default=0,
                        help="seconds from the start: start no run that would likely end after it, and stop one "
                             "still running at it (0: none)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds one run may take")
    parser.add_argument("--preflight-timeout", type=float, default=420,
                        help="seconds the preflight may take (it builds CPU Adam the first time)")
    parser.add_argument("--out", default=str(RESULTS / "deepspeed"))
    return parser


def check_args(parser: OneLineParser, args) -> None:
    """Refuse what cannot run, with one line (exit status 2), and fill the sizes' defaults."""
    if args.rounds < 1 or args.steps < 1 or not 0 <= args.warmup < args.steps or args.first_round < 0:
        parser.error("need --rounds >= 1, --first-round >= 0, --steps >= 1 and 0 <= --warmup < --steps")
    if args.timeout <= 0 or args.preflight_timeout <= 0 or args.deadline < 0:
        parser.error("need --timeout and --preflight-timeout above 0 and --deadline >= 0")
    for flag, default in SIZES:
        name = flag[2:].replace("-", "_")
        if getattr(args, name) is None:
            setattr(args, name, CPU_SIZES[flag] if args.device == "cpu" else default)
        if getattr(args, name) < 1:
            parser.error(f"need {flag} >= 1")
    if args.min_seq > args.max_seq:
        parser.error("need --min-seq <= --max-seq")
    if args.hidden % max(1, args.hidden // 64):
        parser.error("need --hidden divisible by its heads (hidden / 64)")
    args.stages = list(dict.fromkeys(args.stages))
    args.allocators = list(dict.fromkeys(args.allocators))
    if args.device == "cpu" and args.allocators != ["native"]:
        skipped = [a for a in args.allocators if a != "native"]
        print(f"skipping {', '.join(skipped)}: they need CUDA (--device cpu); running native only", flush=True)
        args.allocators = ["native"]


def main(argv: list[str] | None = None, prog: str = "bench deepspeed") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    check_args(parser, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info, why = preflight(args)
    if info is None:
        print(f"{prog}: preflight failed: {why}", file=sys.stderr)
        (out / "summary.json").write_text(json.dumps({"preflight_error": why}, indent=1) + "\n")
        return 1
    print("preflight: " + json.dumps(info), flush=True)
    order = [o for o in run_order(args.stages, args.allocators, args.first_round + args.rounds)
             if o[0] >= args.first_round]
    results = Results(out, "summary.json", {
        "environment": environment(), "settings": dict(vars(args)), "preflight": info,
        "deepspeed_launcher": " ".join(deepspeed_launcher()),
        "order": [f"{stage_name(s)}:{a}:r{r}:{launch_of(r, args.stages.index(s), args.launch)}" for r, s, a in order],
        "runs": [], "rows": []}, args.deadline, slim=True)
    record = results.record
    print(f"{len(order)} runs: ZeRO {', '.join(map(str, args.stages))}; {args.steps} steps ({args.warmup} warm-up), "
          f"optimizer {args.optimizer}, launch {args.launch}, deadline {args.deadline or 'none'}", flush=True)

    def expected(item: tuple) -> float:
        done = [r["wall_s"] for r in record["runs"] if "error" not in r and r["stage"] == item[1]]
        return max(done or [r["wall_s"] for r in record["runs"] if "error" not in r] or [0.0])

    def how(item: tuple) -> str:
        return launch_of(item[0], args.stages.index(item[1]), args.launch)

    run_in_order(order, results, timeout=args.timeout,
                 run=lambda index, item, timeout_s: run_one(index, *item, how(item), args, timeout_s),
                 expected=expected, label=lambda item: f"ZeRO-{item[1]} / {item[2]} ({how(item)})",
                 rows=lambda runs: table_rows(runs, args.stages, args.allocators),
                 shown=("median_step_s", "max_memory_reserved", "max_memory_allocated", "utilization", "init_s",
                        "wall_s"), error_tail=1500)
    print(format_table(record["rows"], args.warmup, args.steps))
    failed = sum(1 for r in record["runs"] if "error" in r)
    if failed or not record["runs"]:
        print(f"{prog}: {failed} of {len(record['runs'])} runs failed", file=sys.stderr)
        return 1
    return 0
