"""The real training benchmark: each workload under the native allocator, expandable segments and gmlake.

    python bench/train_suite.py [--workloads NAME ...] [--steps 30] [--cap-gib 24] [--out bench/results/train.json]

One process per (workload, allocator): a training phase with shapes drawn per step (peak allocated, peak reserved,
utilization, median step time, tokens/s), then a bisection for the largest batch that fits under a fixed cap.
Results carry the GPU, driver, torch and gmlake versions, the date and each command. `bench/report_training.py`
turns them into README's table and a PNG.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = {
    f"{model}-{name}": ["--model", hf, *flags]
    for model, hf in (("opt1.3b", "opt-1.3b"), ("gpt2xl", "gpt2-xl"))
    for name, flags in (("lora", ["--lora"]), ("ckpt", ["--ckpt"]), ("lora-ckpt", ["--lora", "--ckpt"]),
                        ("offload", ["--offload"]))
}
ALLOCATORS = ("native", "expandable", "gmlake")


def command(workload: str, allocator: str, args, out: str) -> tuple[list[str], dict]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTORCH_CUDA_ALLOC_CONF": ""}
    script = [str(HERE / "workloads" / "train_hf.py"), *WORKLOADS[workload], "--steps", str(args.steps),
              "--min-batch", str(args.min_batch), "--max-batch", str(args.max_batch), "--json", out]
    if args.cap_gib:
        script += ["--max-batch-search", "--cap-gib", str(args.cap_gib)]
    if allocator == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator == "gmlake":
        return [sys.executable, "-m", "gmlake", "run", *script], env
    return [sys.executable, *script], env


def environment() -> dict:
    import torch

    import gmlake

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    gpu, driver = (smi[0].split(", ") + ["?"])[:2] if smi else ("?", "?")
    return {"gpu": gpu, "nvidia_driver": driver, "torch": torch.__version__, "gmlake": gmlake.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--allocators", nargs="*", default=list(ALLOCATORS), choices=list(ALLOCATORS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--min-batch", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--cap-gib", type=float, default=24.0, help="0: skip the max-batch search")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", default=str(HERE / "results" / "train.json"))
    args = parser.parse_args()
    record = {"environment": environment(), "runs": []}
    for workload in args.workloads:
        for allocator in args.allocators:
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
                out = tmp.name
            cmd, env = command(workload, allocator, args, out)
            print(f"== {workload} / {allocator}", flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            run = {"workload": workload, "allocator": allocator, "command": " ".join(cmd), "returncode": proc.returncode}
            if proc.returncode == 0 and os.path.getsize(out):
                run.update(json.loads(Path(out).read_text()))
                run.pop("losses", None)
                run["utilization"] = run["max_memory_allocated"] / run["max_memory_reserved"]
                print(json.dumps({k: run[k] for k in ("max_memory_reserved", "utilization", "median_step_s",
                                                       "max_batch_under_cap")}), flush=True)
            else:
                run["error"] = (proc.stderr or proc.stdout)[-2000:]
                print(run["error"], flush=True)
            os.unlink(out)
            record["runs"].append(run)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(record, indent=2) + "\n")   # after every run: a timeout loses one


if __name__ == "__main__":
    main()
