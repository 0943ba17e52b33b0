"""FSDP full-shard (ZeRO-3) training with LoRA and recomputation, shapes varying per step, one process per GPU.

    torchrun --nproc-per-node 2 -m gmlake run -m bench.workloads.fsdp_train --model opt-1.3b --json out.json

Rank 0 writes the summary: each rank's peaks, the median step time, tokens/s and `timed_s` (the slowest rank's).
Each rank draws its own shapes. Under --memory-fraction a rank out of memory writes its own summary (rank r > 0 to
`rank_path`) and exits 3 at once, since the other rank waits in a collective that will never complete: torchrun's
own status then ends the job, and the rank's file tells an out-of-memory stop from a crash.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import time
from typing import NoReturn

import torch
import torch.distributed as dist

from bench.cli import OneLineParser
from bench.workloads.common import OOM_EXIT, counters_since, memory_fraction, oom_summary, out_of_memory, refuse
from bench.workloads.train_hf import (
    MODELS,
    MachineProbe,
    add_lora,
    allocator_name,
    build_model,
    dump_snapshot,
    gmlake_stats,
    gpu_time,
    memory_peaks,
    start_snapshot,
)


def rank_path(path: str, rank: int) -> str:
    """Rank 0 writes `path`; rank r writes it with `.rank<r>` before its suffixes: fsdp.pickle.gz becomes
    fsdp.rank1.pickle.gz."""
    if rank == 0:
        return path
    head, sep, name = path.rpartition("/")
    stem, dot, suffixes = name.partition(".")
    return f"{head}{sep}{stem}.rank{rank}{dot}{suffixes}"


def main() -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="opt-1.3b")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--min-batch", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--min-seq", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, help="steps not timed (default: the first quarter, at least one)")
    p.add_argument("--memory-fraction", metavar="F",
                   help="cap each rank at F (0 < F <= 1) of its device's memory; out of memory: exit 3 (see above)")
    p.add_argument("--json")
    p.add_argument("--snapshot", help="record every allocator event of each rank, model building included, into this "
                                      "snapshot (rank r > 0 writes NAME.rank<r> before the suffixes; slows the run)")
    p.add_argument("--gpu-time-steps", type=int, metavar="N",
                   help="after the run, time the kernels of N more steps (the last N shapes) on each rank with the "
                        "profiler (Note [GPU time] in common.py; 0: none; default 4, under --memory-fraction 0)")
    args = p.parse_args()
    fraction = memory_fraction("fsdp_train.py", args.memory_fraction, "cuda")
    if fraction is not None and args.gpu_time_steps:
        refuse("fsdp_train.py", "--memory-fraction takes no --gpu-time-steps N > 0 (under the cap the profiled steps "
                                "could fail the run)")
    if args.gpu_time_steps is None:
        args.gpu_time_steps = 0 if fraction is not None else 4
    warmup = min(max(1, args.steps // 4), args.steps - 1) if args.warmup is None else args.warmup
    if args.steps < 1 or not 0 <= warmup < args.steps:
        refuse("fsdp_train.py", "need --steps >= 1 and 0 <= --warmup < --steps")
    if not 0 <= args.gpu_time_steps <= args.steps:
        refuse("fsdp_train.py", "need 0 <= --gpu-time-steps <= --steps")

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if args.snapshot:
        start_snapshot()
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)     # the cap holds from the first byte of the model
    try:
        train(args, rank, world, warmup, fraction)
    except Exception as exc:
        if fraction is None or not out_of_memory(exc):
            raise
        exit_rank_out_of_memory(args, rank, fraction, exc)
    dist.destroy_process_group()


def exit_rank_out_of_memory(args: argparse.Namespace, rank: int, fraction: float, exc: BaseException) -> NoReturn:
    """This rank ran out of memory under --memory-fraction: its summary, one line on stderr, and the process ends at
    once with OOM_EXIT (the other rank waits in a collective; torchrun stops it)."""
    summary = oom_summary({"model": args.model, "rank": rank}, getattr(exc, "gmlake_step", None), fraction, exc)
    if args.json:
        with open(rank_path(args.json, rank), "w") as f:
            json.dump(summary, f)
    print(f"fsdp_train.py: rank {rank} out of memory under memory fraction {fraction}", file=sys.stderr, flush=True)
    os._exit(OOM_EXIT)


def train(args: argparse.Namespace, rank: int, world: int, warmup: int, fraction: float | None) -> None:
    """Build the FSDP model, train --steps steps, and (rank 0) write the summary. An exception raised in a step
    carries the step's index as `gmlake_step`."""
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
    at_warmup = None
    for step in range(args.steps):
        batch = rng.randint(args.min_batch, args.max_batch)
        seq = rng.randint(args.min_seq // 8, args.max_seq // 8) * 8
        torch.cuda.synchronize()
        if step == warmup:
            at_warmup = gmlake_stats()
        t0 = time.perf_counter()
        try:
            ids = torch.randint(0, vocab, (batch, seq), device="cuda")
            train_step(ids)
            torch.cuda.synchronize()
        except Exception as exc:
            exc.gmlake_step = step
            raise
        times.append(time.perf_counter() - t0)
        tokens.append(batch * seq)
        shapes.append((batch, seq))
        probes.append(probe())
    if args.snapshot:
        dump_snapshot(rank_path(args.snapshot, rank))
    end = gmlake_stats()
    mine = {**memory_peaks(), "gmlake": end, "median_step_s": statistics.median(times[warmup:]),
            "gmlake_after_warmup": counters_since(at_warmup, end) if end is not None and at_warmup else None,
            "tokens_per_s": sum(tokens[warmup:]) / sum(times[warmup:]), "timed_s": sum(times[warmup:]),
            "step_s": times, "probes": probes}
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
                   "tokens_per_s": sum(g["tokens_per_s"] for g in gathered),
                   "timed_s": max(g["timed_s"] for g in gathered), "warmup_steps": warmup}
        if fraction is not None:
            summary.update(memory_fraction=fraction, oom=False)
        print(json.dumps(summary))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f)


if __name__ == "__main__":
    main()
