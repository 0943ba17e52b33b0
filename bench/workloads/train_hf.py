"""Train a Hugging Face causal LM at random init (no downloads) in bf16, with shapes that vary per step.

    python -m bench.workloads.train_hf --model gpt2-large --lora --ckpt --steps 40 --json out.json

LoRA (peft), gradient checkpointing, optimizer offload and batch sizes and lengths drawn afresh each step: the
conditions that fragment memory (docs/benchmarks.md, "Training suite"). --memory-fraction caps the run as dynamic.py
does (out of memory: exit 3 with an `oom` summary); under a cap nothing runs after the timed steps by default.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from bench.cli import OneLineParser
from bench.workloads.common import (  # fsdp_train.py imports them from here too
    MachineProbe,
    add_run_arguments,
    allocator_name,
    allocator_ooms,
    cap_fields,
    counters_since,
    dump_snapshot,
    exit_failed,
    gmlake_stats,
    gpu_time,
    limit_memory,
    memory_fraction,
    memory_peaks,
    refuse,
    start_snapshot,
    write_summary,
)

MODELS = {
    # name: (family, hidden, layers, heads, ffn, word_embed_proj_dim)
    "gpt2": ("gpt2", 768, 12, 12, None, None),
    "gpt2-medium": ("gpt2", 1024, 24, 16, None, None),
    "gpt2-large": ("gpt2", 1280, 36, 20, None, None),
    "gpt2-xl": ("gpt2", 1600, 48, 25, None, None),
    "opt-125m": ("opt", 768, 12, 12, 3072, 768),
    "opt-350m": ("opt", 1024, 24, 16, 4096, 512),
    "opt-1.3b": ("opt", 2048, 24, 32, 8192, 2048),
    # for smoke tests on a CPU
    "tiny-gpt2": ("gpt2", 64, 2, 2, None, None),
    "tiny-opt": ("opt", 64, 2, 2, 256, 64),
}


def build_model(name: str, device: str | torch.device = "cpu"):
    """The model at random init in bf16, built directly on `device` (initializing 1.3B weights on the CPU takes
    longer than the benchmark), with the names of the modules LoRA adapts."""
    from transformers import AutoModelForCausalLM, GPT2Config, OPTConfig

    family, hidden, layers, heads, ffn, proj = MODELS[name]
    if family == "gpt2":
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=2048)
        lora_targets = ["c_attn", "c_proj"]
    else:
        cfg = OPTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn,
                        word_embed_proj_dim=proj, max_position_embeddings=2048)
        lora_targets = ["q_proj", "v_proj"]
    cfg.use_cache = False
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model, cfg.vocab_size, lora_targets


SEARCH_SEQ, SEARCH_MAX = 1024, 512     # the max-batch search's sequence length and largest batch


def search_max_batch(train_step, args, model) -> int:
    """The largest batch (at most SEARCH_MAX, of SEARCH_SEQ tokens) whose training step fits under the cap, by
    bisection. Each probe runs two steps; an out-of-memory error marks a batch too large, and the allocator must
    recover from it."""
    import gc

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * (1 << 30) / total))
    lo, hi = 0, SEARCH_MAX
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            for _ in range(2):
                train_step(mid, SEARCH_SEQ)
            lo = mid
        except RuntimeError as exc:          # torch.OutOfMemoryError, or gmlake's out-of-memory RuntimeError
            if "out of memory" not in str(exc).lower():
                raise
            hi = mid - 1
            model.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)
    return lo


def add_lora(model, targets: list[str], ckpt: bool):
    """LoRA (r=16) on `targets`, adapters in the model's dtype (FSDP needs one dtype per flat parameter)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, lora_dropout=0.0,
                                             task_type="CAUSAL_LM"), autocast_adapter_dtype=False)
    if ckpt:
        model.enable_input_require_grads()     # checkpointed blocks need an input that requires grad
    return model


def train(args: argparse.Namespace, device: torch.device,
          steps: list[dict]) -> tuple[Callable[[int, int], None], torch.nn.Module]:
    """Build the model and its optimizer and run --steps steps of shapes drawn from --seed, each step's record
    appended to `steps` as it completes (so that a caller whose step ran out of memory knows how many did). Returns
    a function that runs one more step of a given batch and length (for gpu_time and the batch search), and the
    model."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rng = random.Random(args.seed)
    model, vocab, targets = build_model(args.model, device)
    if args.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        model = add_lora(model, targets, args.ckpt)
    params = [q for q in model.parameters() if q.requires_grad]
    if args.offload:
        # Optimizer states on the CPU (ZeRO-Offload's split): gradients go to pinned fp32 host copies, the fused
        # CPU AdamW steps there, the updated weights come back.
        host = [q.detach().float().cpu().pin_memory() if cuda else q.detach().float().clone() for q in params]
        for h in host:
            h.grad = torch.zeros_like(h).pin_memory() if cuda else torch.zeros_like(h)
        optim = torch.optim.AdamW(host, lr=1e-4, fused=True)
    else:
        optim = torch.optim.AdamW(params, lr=1e-4)
    model.train()
    probe = MachineProbe(cuda)
    for _ in range(args.steps):
        batch = rng.randint(args.min_batch, args.max_batch)
        seq = rng.randint(args.min_seq // 8, args.max_seq // 8) * 8
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        sync()
        # gmlake's counters as the first timed step starts: what it did after warm-up is the end's minus these
        before = {"gmlake_before": gmlake_stats()} if cuda and len(steps) == args.warmup else {}
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if args.offload:
            for q, h in zip(params, host):
                h.grad.copy_(q.grad, non_blocking=True)
                q.grad = None
            sync()
            optim.step()
            for q, h in zip(params, host):
                q.data.copy_(h, non_blocking=True)     # the host grads stay: the next step's copy overwrites them
        else:
            optim.step()
            optim.zero_grad(set_to_none=True)
        sync()
        steps.append({"batch": batch, "seq": seq, "step_s": time.perf_counter() - t0, "loss": loss.item(), **probe(),
                      **before})

    def train_step(batch: int, seq: int) -> None:
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        model(input_ids=ids, labels=ids).loss.backward()
        if args.offload:
            for q in params:
                q.grad = None
        else:
            optim.step()
            optim.zero_grad(set_to_none=True)
        sync()

    return train_step, model


def main() -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--ckpt", action="store_true", help="gradient checkpointing (recomputation)")
    p.add_argument("--offload", action="store_true", help="optimizer states on the CPU")
    add_run_arguments(p, steps=40)
    p.add_argument("--min-batch", type=int, default=4)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--min-seq", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (no memory figures)")
    p.add_argument("--gpu-time-steps", type=int, metavar="N",
                   help="after the run, time the kernels of N more steps (the last N shapes) with the profiler "
                        "(Note [GPU time] in common.py; at most --steps; 0: none; default 4, or 0 under "
                        "--memory-fraction: there a profiled step that runs out of memory is recorded as an error, "
                        "the run still fits)")
    p.add_argument("--max-batch-search", action="store_true",
                   help="after training, find the largest batch that fits under --cap-gib (bisection)")
    p.add_argument("--cap-gib", type=float, default=24.0, help="memory cap for the batch search, GiB")
    args = p.parse_args()
    # as it was before --warmup: the first quarter, at least the first step, never every step
    warmup = min(max(1, args.steps // 4), args.steps - 1) if args.warmup is None else args.warmup
    args.warmup = warmup                # train() reads gmlake's counters where the timed steps begin
    if args.steps < 1 or not 0 <= warmup < args.steps:
        p.error("need --steps >= 1 and 0 <= --warmup < --steps")
    fraction = memory_fraction("train_hf.py", args.memory_fraction, args.device)
    gpu_time_steps = (4 if fraction is None else 0) if args.gpu_time_steps is None else args.gpu_time_steps
    if gpu_time_steps < 0:
        p.error("need --gpu-time-steps >= 0")
    if fraction is not None and args.max_batch_search:
        # the search runs after the timed steps under a cap of its own: it could fail a run whose training fit
        # (profiled steps under the cap may run: gpu_time records their out-of-memory as an error)
        refuse("train_hf.py", "--memory-fraction takes no --max-batch-search")

    cuda = args.device == "cuda"
    filler = 0
    if fraction is not None:
        filler = limit_memory(fraction)     # initialises CUDA; the cap holds from the first byte
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    head = {"model": args.model, "lora": args.lora, "ckpt": args.ckpt, "offload": args.offload, "steps": args.steps,
            "warmup_steps": warmup, "seed": args.seed, "allocator": allocator_name() if cuda else "cpu"}
    if args.snapshot:
        start_snapshot()
    steps: list[dict] = []
    try:
        train_step, model = train(args, device, steps)
    except Exception as exc:  # noqa: BLE001 - exit_failed re-raises all but a capped run's failures
        exit_failed("train_hf.py", head, steps, fraction, exc, args.json)
    if args.snapshot:
        dump_snapshot(args.snapshot)

    timed = steps[warmup:]
    timed_s = sum(s["step_s"] for s in timed)
    summary = {**head, "timed_s": timed_s, "median_step_s": statistics.median(s["step_s"] for s in timed),
               "tokens_per_s": sum(s["batch"] * s["seq"] for s in timed) / timed_s}
    summary.update(cap_fields(fraction, filler))
    if cuda:
        summary.update(memory_peaks())
        summary["allocator_ooms"] = allocator_ooms()
        summary["gmlake"] = gmlake_stats()
        at_warmup = timed[0].get("gmlake_before") if timed else None
        if summary["gmlake"] is not None and at_warmup is not None:
            summary["gmlake_after_warmup"] = counters_since(at_warmup, summary["gmlake"])
    if gpu_time_steps:              # after the peaks and counters are read: these steps are not part of them
        summary["gpu_time"] = [gpu_time(lambda s=s: train_step(s["batch"], s["seq"]), cuda=cuda)
                               for s in steps[-gpu_time_steps:]]
    if cuda:
        summary["max_batch_under_cap"] = search_max_batch(train_step, args, model) if args.max_batch_search else None
        summary["cap_gib"] = args.cap_gib if args.max_batch_search else None
    summary["per_step"] = steps
    write_summary(summary, args.json, shown=("per_step", "gmlake"))


if __name__ == "__main__":
    main()
