"""Train a Hugging Face causal LM at random init (no downloads) in bf16, with shapes that vary per step.

    python bench/workloads/train_hf.py --model gpt2-large --lora --ckpt --steps 40 --json out.json

The conditions that fragment memory: LoRA (peft), gradient checkpointing, optimizer offload, and batch sizes and
sequence lengths drawn afresh each step, as a real data loader produces them.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

MODELS = {
    # name: (family, hidden, layers, heads, ffn, word_embed_proj_dim)
    "gpt2": ("gpt2", 768, 12, 12, None, None),
    "gpt2-medium": ("gpt2", 1024, 24, 16, None, None),
    "gpt2-large": ("gpt2", 1280, 36, 20, None, None),
    "gpt2-xl": ("gpt2", 1600, 48, 25, None, None),
    "opt-125m": ("opt", 768, 12, 12, 3072, 768),
    "opt-350m": ("opt", 1024, 24, 16, 4096, 512),
    "opt-1.3b": ("opt", 2048, 24, 32, 8192, 2048),
}


def build_model(name: str):
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
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    return model, cfg.vocab_size, lora_targets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--ckpt", action="store_true", help="gradient checkpointing (recomputation)")
    p.add_argument("--offload", action="store_true", help="optimizer states on the CPU")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--min-batch", type=int, default=4)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--min-seq", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--fixed-batch", type=int, help="use this batch size every step (for max-batch searches)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write a summary here")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = torch.device("cuda")
    model, vocab, targets = build_model(args.model)
    model.to(device)
    if args.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, lora_dropout=0.0,
                                                 task_type="CAUSAL_LM"))
        if args.ckpt:
            model.enable_input_require_grads()
    params = [q for q in model.parameters() if q.requires_grad]
    if args.offload:
        # Optimizer states on the CPU: gradients go to pinned host copies, the step runs there, weights come back.
        host = [q.detach().float().cpu().pin_memory() for q in params]
        for h in host:
            h.grad = torch.zeros_like(h).pin_memory()
        optim = torch.optim.AdamW(host, lr=1e-4)
    else:
        optim = torch.optim.AdamW(params, lr=1e-4)
    model.train()
    times, tokens, losses = [], [], []
    for step in range(args.steps):
        batch = args.fixed_batch or rng.randint(args.min_batch, args.max_batch)
        seq = rng.randint(args.min_seq // 8, args.max_seq // 8) * 8
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if args.offload:
            for q, h in zip(params, host):
                h.grad.copy_(q.grad, non_blocking=True)
                q.grad = None
            torch.cuda.synchronize()
            optim.step()
            for q, h in zip(params, host):
                q.data.copy_(h, non_blocking=True)
        else:
            optim.step()
        optim.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(batch * seq)
        losses.append(float(loss))
    warm = max(1, len(times) // 4)
    summary = {
        "model": args.model, "lora": args.lora, "ckpt": args.ckpt, "offload": args.offload, "steps": args.steps,
        "median_step_s": statistics.median(times[warm:]) if len(times) > warm else times[-1],
        "tokens_per_s": sum(tokens[warm:]) / sum(times[warm:]) if len(times) > warm else None,
        "losses": losses,
    }
    try:
        summary["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        summary["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    except RuntimeError:  # a pluggable allocator (gmlake run) has no torch stats; gmlake reports its own
        pass
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f)
    print(json.dumps({k: v for k, v in summary.items() if k != "losses"}))


if __name__ == "__main__":
    main()
