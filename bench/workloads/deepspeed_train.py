"""Train a decoder with DeepSpeed ZeRO (stage 2 or 3, optimizer states offloaded to the CPU) on one GPU, with
sequence lengths drawn afresh each step, and write a JSON summary: losses, peak reserved and allocated, step times.

    GMLAKE=1 deepspeed --num_gpus 1 bench/workloads/deepspeed_train.py --stage 3 --json out.json   # the launcher
    gmlake run -m bench.workloads.deepspeed_train --stage 2 --json out.json                       # one process
    python -m bench.workloads.deepspeed_train --preflight        # deepspeed importable, CPU Adam built (JIT), exit

Needs deepspeed and transformers; `--optimizer torch-adamw` where CPU Adam does not build, `--device cpu` a smoke
test. GPT-2 at random init, deterministic kernels and one seed: every allocator computes the same losses. The peaks
are over the training steps; `init_reserved` is what was reserved when they began. `python -m bench deepspeed` runs
it under each allocator (docs/benchmarks.md, "DeepSpeed ZeRO with the optimizer on the CPU").
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script (the deepspeed launcher): bench's modules from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.cli import OneLineParser

SCRIPT = "deepspeed_train.py"
OPTIMIZERS = ("cpu-adam", "torch-adamw")


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=SCRIPT, description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, choices=(2, 3), default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10, help="steps not timed (default 10)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--min-seq", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, help="attention heads (default: hidden / 64)")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="cpu-adam",
                   help="cpu-adam: DeepSpeedCPUAdam (JIT-built C++); torch-adamw: torch's AdamW on the CPU")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test, no memory figures")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--preflight", action="store_true",
                   help="only check: deepspeed imports and (with --optimizer cpu-adam) its CPU Adam builds and loads; "
                        "one JSON line, exit 0, or one line saying what is missing, exit 1")
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=-1,
                   help=argparse.SUPPRESS)             # the deepspeed launcher passes it
    return p


def parse_args(argv: list[str] | None = None):
    """The command line, checked: a bad value is one line on stderr and exit status 2, before anything is built."""
    p = build_parser()
    args = p.parse_args(argv)
    args.heads = args.heads or max(1, args.hidden // 64)
    if args.steps < 1 or not 0 <= args.warmup < args.steps:
        p.error("need --steps >= 1 and 0 <= --warmup < --steps")
    if args.batch < 1:
        p.error("need --batch >= 1")
    if not 1 <= args.min_seq <= args.max_seq:
        p.error("need 1 <= --min-seq <= --max-seq")
    if args.hidden < 1 or args.layers < 1 or args.vocab < 2 or args.hidden % args.heads:
        p.error(f"need --hidden, --layers >= 1, --vocab >= 2 and --hidden divisible by --heads ({args.heads})")
    return args


def ds_config(args) -> dict:
    """DeepSpeed's config: ZeRO `args.stage`, optimizer states and step on the CPU (pinned), bf16, no clipping."""
    params = {"lr": 1e-4, "weight_decay": 0.0}
    if args.optimizer == "torch-adamw":
        params["torch_adam"] = True          # torch.optim.AdamW over the CPU partitions, no JIT build
    zero = {"stage": args.stage, "offload_optimizer": {"device": "cpu", "pin_memory": args.device == "cuda"},
            "overlap_comm": False, "contiguous_gradients": True}
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": params},
        "zero_optimization": zero,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }


def schedule(args) -> list[int]:
    """Each step's sequence length, from --seed alone (multiples of 8 where the range allows)."""
    rng = random.Random(args.seed + 1)
    lo, hi = -(-args.min_seq // 8), args.max_seq // 8
    if lo > hi:
        return [rng.randint(args.min_seq, args.max_seq) for _ in range(args.steps)]
    return [rng.randint(lo, hi) * 8 for _ in range(args.steps)]


def set_distributed_env(args) -> None:
    """One process, world size 1: what the launcher would have set, unless it did (MASTER_PORT from the caller)."""
    local = max(args.local_rank, 0)
    for k, v in (("RANK", str(local)), ("LOCAL_RANK", str(local)), ("WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(k, v)
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def python_headers() -> str | None:
    """Python.h's folder where it exists (torch's JIT build of CPU Adam needs it), else None."""
    import sysconfig

    include = sysconfig.get_paths().get("include") or ""
    return include if os.path.exists(os.path.join(include, "Python.h")) else None


def preflight(args) -> int:
    """What the runs need, checked in seconds (or the first CPU Adam build, a minute or two): one JSON line and
    exit 0, or one line naming what is missing and exit 1."""
    import shutil

    info: dict = {"python": sys.version.split()[0], "python_headers": python_headers(),
                  "ninja": shutil.which("ninja"), "cxx": shutil.which(os.environ.get("CXX", "c++"))}
    try:
        import deepspeed
        import torch
    except ImportError as exc:
        print(f"{SCRIPT}: preflight: deepspeed is not importable ({exc}); install it (see bench/deepspeed_suite.py)",
              file=sys.stderr)
        return 1
    info.update(deepspeed=deepspeed.__version__, torch=torch.__version__)
    if args.optimizer == "cpu-adam":
        started = time.perf_counter()
        try:
            from deepspeed.ops.op_builder import CPUAdamBuilder

            CPUAdamBuilder().load(verbose=False)
        except Exception as exc:  # noqa: BLE001 - the JIT build's errors: RuntimeError, CalledProcessError, ...
            text = " ".join(str(exc).split())[-600:]
            missing = [name for name in ("python_headers", "ninja", "cxx") if not info[name]]
            print(f"{SCRIPT}: preflight: DeepSpeed's CPU Adam did not build or load ({type(exc).__name__}: {text})"
                  + (f"; missing: {', '.join(missing)}" if missing else "")
                  + "; --optimizer torch-adamw runs without it", file=sys.stderr)
            return 1
        info["cpu_adam_load_s"] = round(time.perf_counter() - started, 1)
    info["cuda"] = torch.cuda.is_available() and torch.cuda.get_device_name(0)      # after the build, which needs none
    if args.device == "cuda" and not info["cuda"]:
        print(f"{SCRIPT}: preflight: torch sees no CUDA device", file=sys.stderr)
        return 1
    print(json.dumps({"preflight": "ok", "optimizer": args.optimizer, **info}))
    return 0


def build_model(args, vocab: int):
    """GPT-2 at random init (fp32 on the CPU; DeepSpeed casts to bf16 and moves it), eager attention, no dropout,
    gradient checkpointing (non-reentrant)."""
    from transformers import AutoModelForCausalLM, GPT2Config

    cfg = GPT2Config(vocab_size=vocab, n_embd=args.hidden, n_layer=args.layers, n_head=args.heads,
                     n_positions=max(args.max_seq, 8), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=vocab - 1, eos_token_id=vocab - 1, use_cache=False)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):          # transformers >= 5.24 (the old name warns)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")     # deterministic cuBLAS
    set_distributed_env(args)
    if args.preflight:
        return preflight(args)
    import deepspeed
    import torch

    from bench.workloads.common import MachineProbe, allocator_name, counters_since, gmlake_stats, memory_peaks

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"{SCRIPT}: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    allocator = allocator_name() if cuda else "cpu"
    model = build_model(args, args.vocab)
    n_params = sum(p.numel() for p in model.parameters())
    started = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(args))
    init_s = time.perf_counter() - started
    device = engine.device
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    init_reserved = None
    if cuda:
        sync()
        if allocator == "gmlake":
            import gmlake.torch as gt

            init_reserved = gt.memory_reserved()
            gt.reset_peak_memory_stats()
        else:
            init_reserved = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator().manual_seed(args.seed + 2)
    probe = MachineProbe(cuda)
    steps: list[dict] = []
    for i, seq in enumerate(schedule(args)):
        ids = torch.randint(0, args.vocab, (args.batch, seq), generator=gen).to(device)
        sync()
        before = {"gmlake_before": gmlake_stats()} if cuda and i == args.warmup else {}
        t0 = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        sync()
        step_s = time.perf_counter() - t0
        steps.append({"seq": seq, "step_s": step_s, "loss": loss.detach().item(), **probe(), **before})
    timed = [s["step_s"] for s in steps[args.warmup:]]
    summary = {
        "allocator": allocator, "stage": args.stage, "optimizer": args.optimizer, "device": args.device,
        "launcher": "deepspeed" if args.local_rank >= 0 else "direct",
        "steps": args.steps, "warmup_steps": args.warmup, "batch": args.batch, "min_seq": args.min_seq,
        "max_seq": args.max_seq, "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
        "vocab": args.vocab, "seed": args.seed, "params": n_params, "init_s": init_s,
        "losses": [s["loss"] for s in steps], "timed_s": sum(timed), "median_step_s": statistics.median(timed),
        "tokens_per_s": sum(args.batch * s["seq"] for s in steps[args.warmup:]) / sum(timed),
        "torch": torch.__version__, "deepspeed": deepspeed.__version__, "torch_threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0)), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    if cuda:
        summary["init_reserved"] = init_reserved
        summary.update(memory_peaks())
        summary["num_alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries")
        summary["gmlake"] = gmlake_stats()
        at_warmup = steps[args.warmup].get("gmlake_before")
        if summary["gmlake"] is not None and at_warmup is not None:
            summary["gmlake_after_warmup"] = counters_since(at_warmup, summary["gmlake"])
    summary["per_step"] = steps
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f)
    print(json.dumps({k: summary.get(k) for k in ("allocator", "stage", "launcher", "median_step_s",
                                                  "max_memory_reserved", "max_memory_allocated")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
