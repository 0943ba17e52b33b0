"""FSDP full-shard (ZeRO-3) training with LoRA and recomputation, shapes varying per step, one process per GPU.

    torchrun --nproc-per-node 2 bench/workloads/fsdp_train.py --model opt-1.3b --json out.json
    torchrun --nproc-per-node 2 -m gmlake run bench/workloads/fsdp_train.py --model opt-1.3b --json out.json

Rank 0 writes the summary: each rank's peak allocated and reserved memory, the median step time, tokens per second.
Each rank draws its own shapes, as each rank's data loader would.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import time

import torch
import torch.distributed as dist

from train_hf import (MODELS, MachineProbe, add_lora, allocator_name, build_model, dump_snapshot, gmlake_stats,
                      gpu_time, memory_peaks, start_snapshot)


def rank_path(path: str, rank: int) -> str:
    """Rank 0 writes `path`; rank r writes it with `.rank<r>` before its suffixes: fsdp.pickle.gz becomes
    fsdp.rank1.pickle.gz."""
    if rank == 0:
        return path
    head, sep, name = path.rpartition("/")
    stem, dot, suffixes = name.partition(".")
    return f"{head}{sep}{stem}.rank{rank}{dot}{suffixes}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="opt-1.3b")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--min-batch", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--min-seq", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--cap-gib", type=float, help="cap each rank's memory (set_per_process_memory_fraction); the "
                                                 "suite's batch search runs each probe as its own job under a cap")
    p.add_argument("--json")
    p.add_argument("--snapshot", help="record every allocator event of each rank, model building included, into this "
                                      "snapshot (rank r > 0 writes NAME.rank<r> before the suffixes; slows the run)")
    p.add_argument("--gpu-time-steps", type=int, default=4, metavar="N",
                   help="after the run, time the kernels of N more steps (the last N shapes) on each rank with the "
                        "profiler (Note [GPU time] in common.py; 0: none)")
    args = p.parse_args()
    if not 0 <= args.gpu_time_steps <= args.steps:
        p.error("need 0 <= --gpu-time-steps <= --steps")

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if args.snapshot:
        start_snapshot()
    if args.cap_gib:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * (1 << 30) / total))
    torch.manual_seed(0)
    rng = random.Random(rank)

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    model, vocab, targets = build_model(args.model, torch.device("cuda"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = add_lora(model, targets, ckpt=True)
    layer_types = {type(m) for m in model.modules() if m.__class__.__name__ in ("GPT2Block", "OPTDecoderLayer")}
    wrap = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: type(m) in layer_types)
    model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=wrap,
                 device_id=torch.cuda.current_device(), use_orig_params=True)
    optim = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)

    def train_step(ids: torch.Tensor) -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    times, tokens, probes, shapes = [], [], [], []
    probe = MachineProbe(True)
    for step in range(args.steps):
        batch = rng.randint(args.min_batch, args.max_batch)
        seq = rng.randint(args.min_seq // 8, args.max_seq // 8) * 8
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_step(ids)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(batch * seq)
        shapes.append((batch, seq))
        probes.append(probe())
    if args.snapshot:
        dump_snapshot(rank_path(args.snapshot, rank))
    warm = max(1, len(times) // 4)
    mine = {**memory_peaks(), "gmlake": gmlake_stats(), "median_step_s": statistics.median(times[warm:]),
            "tokens_per_s": sum(tokens[warm:]) / sum(times[warm:]), "step_s": times, "probes": probes}
    if args.gpu_time_steps:         # after the peaks and counters are read: these steps are not part of them
        mine["gpu_time"] = [gpu_time(lambda b=b, s=s: train_step(torch.randint(0, vocab, (b, s), device="cuda")))
                            for b, s in shapes[-args.gpu_time_steps:]]
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        summary = {"model": args.model, "strategy": "fsdp-full-shard+lora+ckpt", "world": world, "steps": args.steps,
                   "allocator": allocator_name(), "ranks": gathered,
                   "max_memory_reserved": max(g["max_memory_reserved"] for g in gathered),
                   "max_memory_allocated": max(g["max_memory_allocated"] for g in gathered),
                   "median_step_s": max(g["median_step_s"] for g in gathered),
                   "tokens_per_s": sum(g["tokens_per_s"] for g in gathered)}
        print(json.dumps(summary))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
