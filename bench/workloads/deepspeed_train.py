"""Train a small decoder with DeepSpeed ZeRO (stage 2 or 3, optimizer states offloaded to the CPU) on one GPU, with
sequence lengths drawn afresh each step, and write a JSON summary: losses, peak reserved and allocated, step times.

    deepspeed --num_gpus 1 bench/workloads/deepspeed_train.py --stage 3 --json out.json   # GMLAKE=1 in front: gmlake
    gmlake run -m bench.workloads.deepspeed_train --stage 2 --json out.json              # one process, no launcher

Needs deepspeed (its CPU Adam is built on first use, which needs a CUDA toolkit) and transformers.

Random init (no downloads), bf16, deterministic algorithms and one seed, so that every allocator sees the same shapes
and computes the same losses: an allocator changes where tensors live, never what the kernels compute.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, choices=(2, 3), default=3)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--min-seq", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--json", default="")
    p.add_argument("--local_rank", type=int, default=-1)   # the deepspeed launcher passes it
    return p.parse_args()


def allocator_name() -> str:
    gt = sys.modules.get("gmlake.torch")
    if gt is not None and gt.is_enabled():
        return "gmlake"
    return "expandable" if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else "native"


def main() -> int:
    args = parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29517")):
        os.environ.setdefault(k, v)
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    random.seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.set_device(0)
    cfg = GPT2Config(n_embd=args.hidden, n_layer=args.layers, n_head=args.hidden // 64, n_positions=args.max_seq,
                     use_cache=False)
    model = AutoModelForCausalLM.from_config(cfg)
    model.gradient_checkpointing_enable()
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
        "zero_optimization": {"stage": args.stage, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "overlap_comm": False, "contiguous_gradients": True},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(2)
    losses, times = [], []
    for _ in range(args.steps):
        seq = rng.randint(args.min_seq, args.max_seq)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, seq), generator=gen).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    stats = torch.cuda.memory_stats()
    summary = {
        "allocator": allocator_name(),
        "stage": args.stage, "steps": args.steps, "warmup": args.warmup,
        "losses": losses, "step_s": times, "timed_s": sum(times[args.warmup:]),
        "peak_reserved": stats.get("reserved_bytes.all.peak", 0),
        "peak_allocated": stats.get("allocated_bytes.all.peak", 0),
        "torch": torch.__version__, "deepspeed": deepspeed.__version__,
    }
    if summary["allocator"] == "gmlake":
        import gmlake.torch as gt

        summary["gmlake"] = {k: v for k, v in gt.memory_stats().items() if isinstance(v, (int, float))}
    print(json.dumps({k: summary[k] for k in ("allocator", "stage", "timed_s", "peak_reserved", "peak_allocated")}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
