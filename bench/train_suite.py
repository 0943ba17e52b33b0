"""The training suite: LLM fine-tuning workloads under the native allocator, expandable segments and gmlake.

    python -m bench train [--workloads NAME ...] [--allocators NAME ...] [--steps 24] [--cap-gib 24]
        [--out bench/results/train.json]

One process per (workload, allocator): training on shapes drawn per step, then a bisection for the largest batch
under a fixed cap (single-GPU workloads; FSDP runs under torchrun). docs/benchmarks.md,
"Training suite: LLM fine-tuning", holds the method; `bench report docs` makes its table from the records.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench import RESULTS
from bench.cli import OneLineParser
from bench.harness import ALLOCATORS, Results, environment, launch, measured_run

WORKLOADS = {
    f"{model}-{name}": ["--model", hf, *flags]
    for model, hf in (("opt1.3b", "opt-1.3b"), ("gpt2xl", "gpt2-xl"))
    for name, flags in (("lora", ["--lora"]), ("ckpt", ["--ckpt"]), ("lora-ckpt", ["--lora", "--ckpt"]),
                        ("offload", ["--offload"]))
}
FSDP_WORKLOADS = {"opt1.3b-fsdp-lora-ckpt": ["--model", "opt-1.3b"]}      # LoRA + recomputation, always
DEFAULT_ALLOCATORS = ("native", "expandable", "gmlake")
MIN_BATCH, MAX_BATCH = 2, 8         # the default batch range of a single-GPU run (bench cap search's probes too)


def command(workload: str, allocator: str, args, out: str) -> tuple[list[str], dict]:
    """The command line and environment of one run (the max-batch search in-process, single-GPU workloads only: a
    rank out of memory mid-step would leave the other waiting in a collective)."""
    common = ["--steps", str(args.steps), "--min-batch", str(args.min_batch), "--max-batch", str(args.max_batch),
              "--json", out]
    if workload in FSDP_WORKLOADS:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        script = ["-m", "bench.workloads.fsdp_train", *FSDP_WORKLOADS[workload], *common]
    else:
        launcher = [sys.executable]
        script = ["-m", "bench.workloads.train_hf", *WORKLOADS[workload], *common]
        if args.cap_gib:
            script += ["--max-batch-search", "--cap-gib", str(args.cap_gib)]
    return launch(allocator, launcher, script)


def main(argv: list[str] | None = None, prog: str = "bench train") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=[*WORKLOADS, *FSDP_WORKLOADS],
                        choices=[*WORKLOADS, *FSDP_WORKLOADS])
    parser.add_argument("--allocators", nargs="*", default=list(DEFAULT_ALLOCATORS), choices=list(ALLOCATORS))
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--min-batch", type=int, default=MIN_BATCH)
    parser.add_argument("--max-batch", type=int, default=MAX_BATCH)
    parser.add_argument("--cap-gib", type=float, default=24.0, help="0: skip the max-batch search")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", default=str(RESULTS / "train.json"))
    args = parser.parse_args(argv)
    out_path = Path(args.out)
    results = Results(out_path.parent, out_path.name, {"environment": environment(), "runs": []})
    for workload, allocator in ((w, a) for w in args.workloads for a in args.allocators):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            summary = Path(tmp.name)
        cmd, env = command(workload, allocator, args, str(summary))
        print(f"== {workload} / {allocator}", flush=True)
        run = measured_run(cmd, env, summary, args.timeout,
                           {"workload": workload, "allocator": allocator}, error_chars=2000)
        summary.unlink(missing_ok=True)
        if "error" in run:
            print(run["error"], flush=True)
        else:
            print(json.dumps({k: run.get(k) for k in ("max_memory_reserved", "utilization", "median_step_s",
                                                       "max_batch_under_cap", "wall_s")}), flush=True)
        results.record["runs"].append(run)
        results.save()      # after every run: a timeout loses one
