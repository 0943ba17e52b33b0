"""Train a model at random init (no downloads) on shapes drawn per step: the dynamic-shape speed workloads.

    python -m bench.workloads.dynamic --workload {vit,bert,t5,cnn,rl,sage,moe} [--steps 60] [--seed 0]
        [--device cuda|cpu] [--size small|full] [--warmup N] [--json OUT] [--memory-fraction F]

vit (ViT-B/16, mixed resolution), bert (BERT-base, dynamic padding), t5 (T5-base with recomputation), cnn (ResNet-50,
channels-last); rl, sage and moe live in workloads/edge_programs.py. The shape schedule is drawn from --seed before the
model is built, so every allocator sees the same sequence (`schedule_sha256`); docs/benchmarks.md ("Speed suite")
holds the method. --memory-fraction caps the process from the first byte; a step out of memory under it exits 3
(OOM_EXIT) with an `oom` summary, on which bench cap search bisects. --size small is a smoke test on the CPU.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from bench.cli import OneLineParser
from bench.workloads import edge_programs
from bench.workloads.common import (  # noqa: F401 - OOM_EXIT, parse_fraction, out_of_memory: tests read them here
    OOM_EXIT,
    MachineProbe,
    Workload,
    add_run_arguments,
    allocator_name,
    cap_fields,
    counters_since,
    draw_range,
    dump_snapshot,
    exit_failed,
    gmlake_policy_name,
    gmlake_stats,
    gpu_time,
    limit_memory,
    memory_fraction,
    memory_peaks,
    out_of_memory,
    outside_now,
    parse_fraction,
    start_snapshot,
    write_summary,
)
from bench.workloads.shapes import draw_schedule

# Per workload and size: the model's dimensions and the ranges the shapes are drawn from (inclusive, in steps of
# `batch_step` and `shape_step`; `shape` is the image side or the padded sequence length). The full sizes are chosen
# so that the suite's 4 workloads x 4 allocators x 2 rounds of 60 steps fit one 9-minute device call.
PRESETS: dict[str, dict[str, dict]] = {
    "vit": {
        "full": {"hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "patch": 16, "classes": 1000,
                 "batch": (32, 112), "batch_step": 16, "shape": (160, 384), "shape_step": 32},
        "small": {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64, "patch": 8, "classes": 10,
                  "batch": (2, 4), "batch_step": 1, "shape": (32, 64), "shape_step": 16},
    },
    "bert": {
        "full": {"hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "vocab": 30522, "classes": 2,
                 "batch": (64, 128), "batch_step": 8, "shape": (32, 512), "shape_step": 8},
        "small": {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64, "vocab": 1000, "classes": 2,
                  "batch": (2, 4), "batch_step": 1, "shape": (8, 64), "shape_step": 8},
    },
    "t5": {
        "full": {"hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "vocab": 32128,
                 "batch": (32, 96), "batch_step": 8, "shape": (32, 512), "shape_step": 8, "target": (16, 128)},
        "small": {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64, "vocab": 1000,
                  "batch": (2, 4), "batch_step": 1, "shape": (8, 64), "shape_step": 8, "target": (8, 32)},
    },
    "cnn": {
        "full": {"width": 64, "blocks": (3, 4, 6, 3), "classes": 1000,
                 "batch": (64, 224), "batch_step": 32, "shape": (128, 288), "shape_step": 32},
        "small": {"width": 8, "blocks": (1, 1, 1, 1), "classes": 10,
                  "batch": (2, 4), "batch_step": 1, "shape": (32, 64), "shape_step": 16},
    },
}


def draw_batch(rng: random.Random, cfg: dict) -> int:
    """One step's batch size, from the preset's range."""
    return draw_range(rng, cfg["batch"], cfg["batch_step"])


def draw_side_or_length(rng: random.Random, cfg: dict) -> int:
    """One step's image side or padded sequence length, from the preset's range."""
    return draw_range(rng, cfg["shape"], cfg["shape_step"])


# ---- the models ----------------------------------------------------------------------------------------------

def build_vit(cfg: dict, device: torch.device) -> Workload:
    """ViT image classifier (transformers) whose position embeddings are interpolated to each step's image side."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                       intermediate_size=cfg["ffn"], patch_size=cfg["patch"], image_size=cfg["shape"][0],
                       num_labels=cfg["classes"])
    with torch.device(device):
        model = ViTForImageClassification(config)

    def draw(rng: random.Random) -> dict:
        return {"batch": draw_batch(rng, cfg), "side": draw_side_or_length(rng, cfg)}

    def make(shape: dict, dev: torch.device) -> dict:
        b, s = shape["batch"], shape["side"]
        return {"pixel_values": torch.randn(b, 3, s, s, device=dev),
                "labels": torch.randint(0, cfg["classes"], (b,), device=dev)}

    def loss(m: nn.Module, inputs: dict) -> torch.Tensor:
        return m(**inputs, interpolate_pos_encoding=True).loss

    return Workload(model, draw, make, loss, lambda s: s["batch"] * (s["side"] // cfg["patch"]) ** 2)


def padding_mask(batch: int, length: int, dev: torch.device) -> torch.Tensor:
    """An attention mask for a dynamically padded batch: per-sample lengths in [length/2, length], the longest
    sample exactly `length` (the batch was padded to it)."""
    lengths = torch.randint(max(1, length // 2), length + 1, (batch,), device=dev)
    lengths[0] = length
    return (torch.arange(length, device=dev)[None, :] < lengths[:, None]).long()


def build_bert(cfg: dict, device: torch.device) -> Workload:
    """BERT sequence classifier (transformers) on dynamically padded batches."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                        intermediate_size=cfg["ffn"], vocab_size=cfg["vocab"], num_labels=cfg["classes"],
                        max_position_embeddings=max(512, cfg["shape"][1]))
    with torch.device(device):
        model = BertForSequenceClassification(config)

    def draw(rng: random.Random) -> dict:
        return {"batch": draw_batch(rng, cfg), "length": draw_side_or_length(rng, cfg)}

    def make(shape: dict, dev: torch.device) -> dict:
        b, n = shape["batch"], shape["length"]
        return {"input_ids": torch.randint(0, cfg["vocab"], (b, n), device=dev),
                "attention_mask": padding_mask(b, n, dev),
                "labels": torch.randint(0, cfg["classes"], (b,), device=dev)}

    return Workload(model, draw, make, lambda m, inputs: m(**inputs).loss, lambda s: s["batch"] * s["length"])


def enable_recomputation(model: nn.Module) -> None:
    """Gradient checkpointing on every layer, non-reentrant, under either transformers' name for it (v5 renamed
    gradient_checkpointing_enable to activation_checkpointing_enable)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def build_t5(cfg: dict, device: torch.device) -> Workload:
    """T5 encoder-decoder (transformers) with gradient checkpointing, padded source and target."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(d_model=cfg["hidden"], num_layers=cfg["layers"], num_decoder_layers=cfg["layers"],
                      num_heads=cfg["heads"], d_kv=cfg["hidden"] // cfg["heads"], d_ff=cfg["ffn"],
                      vocab_size=cfg["vocab"], use_cache=False, pad_token_id=0, decoder_start_token_id=0)
    with torch.device(device):
        model = T5ForConditionalGeneration(config)
    enable_recomputation(model)

    def draw(rng: random.Random) -> dict:
        return {"batch": draw_batch(rng, cfg), "length": draw_side_or_length(rng, cfg),
                "target": draw_range(rng, cfg["target"], 8)}

    def make(shape: dict, dev: torch.device) -> dict:
        b, n, t = shape["batch"], shape["length"], shape["target"]
        labels = torch.randint(1, cfg["vocab"], (b, t), device=dev)
        labels[padding_mask(b, t, dev) == 0] = -100                 # padded target positions carry no loss
        return {"input_ids": torch.randint(1, cfg["vocab"], (b, n), device=dev),
                "attention_mask": padding_mask(b, n, dev), "labels": labels}

    return Workload(model, draw, make, lambda m, inputs: m(**inputs).loss,
                    lambda s: s["batch"] * (s["length"] + s["target"]))


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 down, 3x3 (strided), 1x1 up, plus the (projected) shortcut."""

    def __init__(self, channels_in: int, width: int, stride: int) -> None:
        super().__init__()
        channels_out = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, channels_out, 1, bias=False), nn.BatchNorm2d(channels_out))
        self.shortcut = nn.Identity() if stride == 1 and channels_in == channels_out else nn.Sequential(
            nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False), nn.BatchNorm2d(channels_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(width: int, blocks: tuple[int, ...], classes: int) -> nn.Sequential:
    """A ResNet (ResNet-50 at width 64, blocks (3, 4, 6, 3)) that takes any image side."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
    channels = width
    for stage, count in enumerate(blocks):
        stage_width = width * 2 ** stage
        for i in range(count):
            layers.append(Bottleneck(channels, stage_width, 2 if i == 0 and stage > 0 else 1))
            channels = stage_width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


def build_cnn(cfg: dict, device: torch.device) -> Workload:
    """A ResNet in channels-last on images whose side is drawn per step."""
    with torch.device(device):
        model = resnet(cfg["width"], tuple(cfg["blocks"]), cfg["classes"])
    model = model.to(memory_format=torch.channels_last)
    criterion = nn.CrossEntropyLoss()

    def draw(rng: random.Random) -> dict:
        return {"batch": draw_batch(rng, cfg), "side": draw_side_or_length(rng, cfg)}

    def make(shape: dict, dev: torch.device) -> dict:
        b, s = shape["batch"], shape["side"]
        return {"images": torch.randn(b, 3, s, s, device=dev).contiguous(memory_format=torch.channels_last),
                "labels": torch.randint(0, cfg["classes"], (b,), device=dev)}

    def loss(m: nn.Module, inputs: dict) -> torch.Tensor:
        return criterion(m(inputs["images"]), inputs["labels"])

    return Workload(model, draw, make, loss, lambda s: 0)


PRESETS.update(edge_programs.PRESETS)
BUILDERS: dict[str, Callable[[dict, torch.device], Workload]] = {
    "vit": build_vit, "bert": build_bert, "t5": build_t5, "cnn": build_cnn,
    "rl": edge_programs.build_rl, "sage": edge_programs.build_sage, "moe": edge_programs.build_moe}


# ---- the run -------------------------------------------------------------------------------------------------

def shape_schedule(workload: Workload, steps: int, seed: int, pool: int = 0) -> list[dict]:
    """Every step's shape, drawn up front from `seed` alone: the same sequence under every allocator; with `pool` > 0
    from that many distinct shapes (Note [Warm steps from a pool of shapes], bench/workloads/shapes.py)."""
    return draw_schedule(workload.draw_shape, steps, seed, pool)


def schedule_digest(schedule: list[dict]) -> str:
    """A short digest of the shape schedule, to check that runs compared saw the same shapes."""
    return hashlib.sha256(json.dumps(schedule, sort_keys=True).encode()).hexdigest()[:16]


def gmlake_step_counters() -> tuple[int, int] | None:
    """gmlake's running totals of stitches and driver calls (all kinds), or None under torch's allocator."""
    stats = gmlake_stats()
    return None if stats is None else (stats["stitches"], sum(stats["calls"].values()))


def train(workload: Workload, schedule: list[dict], device: torch.device, warmup: int,
          records: list[dict] | None = None, quiet_gc: bool = False) -> tuple[list[dict], dict, Callable[[dict], None]]:
    """Run one training step per scheduled shape. Returns the per-step records, gmlake's counters at the end of
    warm-up (None under torch's allocator) and a function that runs one more step of a given shape (for gpu_time).
    Records go into `records` when given, so that a caller whose step raised (out of memory under a cap) knows how
    many steps completed. On CUDA each record also holds `event_ms`, CUDA events around the step. `quiet_gc`:
    Python's collector runs between steps, never inside one (Note [Warm steps from a pool of shapes])."""
    cuda = device.type == "cuda"
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = workload.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    records = [] if records is None else records
    at_warmup = None
    counters = gmlake_step_counters()
    probe = MachineProbe(cuda)

    def step(inputs, end: torch.cuda.Event | None = None) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = workload.loss(model, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if end is not None:
            end.record()
        sync()
        return loss

    if quiet_gc:                    # the model's objects out of every later collection: those stay short
        gc.collect()
        gc.freeze()
    for index, shape in enumerate(schedule):
        if index == warmup:
            at_warmup = gmlake_stats()
        inputs = workload.make_inputs(shape, device)
        if quiet_gc:
            gc.collect()
            gc.disable()
        sync()
        started = time.perf_counter()
        if events:
            events[0].record()
        loss = step(inputs, events[1] if events else None)       # ends in a synchronize on CUDA
        step_s = time.perf_counter() - started
        if quiet_gc:
            gc.enable()
        del inputs
        record = {**shape, "step_s": step_s, "tokens": workload.tokens(shape), "loss": loss.item()}
        if events:
            record["event_ms"] = events[0].elapsed_time(events[1])
        now = gmlake_step_counters()
        if now is not None:
            record.update(stitches=now[0] - counters[0], driver_calls=now[1] - counters[1])
        counters = now
        record.update(probe())
        record.update(outside_now())       # under a device limit: memory taken outside the allocator so far
        records.append(record)
    if at_warmup is None:            # warm-up covers every step: nothing is timed after it
        at_warmup = gmlake_stats()
    return records, at_warmup, lambda shape: step(workload.make_inputs(shape, device))


def summarize(records: list[dict], warmup: int) -> dict:
    """Step-time figures after warm-up: their sum (the suite's measure), median, samples/s and tokens/s."""
    timed = records[warmup:]
    timed_s = sum(r["step_s"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    return {
        "timed_steps": len(timed),
        "timed_s": timed_s,
        "median_step_s": statistics.median(r["step_s"] for r in timed) if timed else None,
        "samples_per_s": sum(r["batch"] for r in timed) / timed_s if timed_s else None,
        "tokens_per_s": tokens / timed_s if timed_s and tokens else None,      # None for the CNN
    }


def header(args: argparse.Namespace, cfg: dict, warmup: int) -> dict:
    """The summary's first keys: what ran, under which allocator."""
    return {
        "workload": args.workload, "size": args.size, "config": cfg, "seed": args.seed, "device": args.device,
        "allocator": allocator_name() if args.device == "cuda" else "cpu", "gmlake_policy": gmlake_policy_name(),
        "torch": torch.__version__, "steps": args.steps, "warmup_steps": warmup,
        "shape_pool": args.shape_pool, "quiet_gc": args.quiet_gc,
    }


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(BUILDERS), required=True)
    add_run_arguments(parser, steps=60)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=("small", "full"), default="full")
    parser.add_argument("--gpu-time-steps", type=int, default=4, metavar="N",
                        help="after the run, time the kernels of N more steps (the last N shapes) with the profiler "
                             "(Note [GPU time]; at most --steps; 0: none)")
    parser.add_argument("--shape-pool", type=int, default=0, metavar="K",
                        help="draw K distinct shapes, run each once in the warm-up, then time steps drawn from them "
                             "(Note [Warm steps from a pool of shapes]; 0: every step drawn afresh)")
    parser.add_argument("--quiet-gc", action="store_true", help="run Python's collector between steps, not in one")
    args = parser.parse_args()
    warmup = args.steps // 4 if args.warmup is None else args.warmup
    if args.steps < 1 or not 0 <= warmup < args.steps:
        parser.error("need --steps >= 1 and 0 <= --warmup < --steps")
    if not 0 <= args.shape_pool <= warmup:
        parser.error("need 0 <= --shape-pool <= --warmup (the warm-up runs every shape of the pool)")
    if args.gpu_time_steps < 0:
        parser.error("need --gpu-time-steps >= 0")
    if args.snapshot and args.device != "cuda":
        parser.error("--snapshot records the CUDA allocator's events: it needs --device cuda")
    fraction = memory_fraction("dynamic.py", args.memory_fraction, args.device)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here; use --device cpu (with --size small) for a smoke test")

    device = torch.device(args.device)
    filler = 0
    if fraction is not None:
        filler = limit_memory(fraction)     # initialises CUDA; the cap holds from the first byte
    cfg = dict(PRESETS[args.workload][args.size])
    torch.manual_seed(args.seed)
    records: list[dict] = []
    if args.snapshot:
        start_snapshot()
    try:
        workload = BUILDERS[args.workload](cfg, device)
        schedule = shape_schedule(workload, args.steps, args.seed, args.shape_pool)
        records, at_warmup, one_step = train(workload, schedule, device, warmup, records, args.quiet_gc)
    except Exception as exc:  # noqa: BLE001 - exit_failed re-raises all but a capped run's failures
        exit_failed("dynamic.py", header(args, cfg, warmup), records, fraction, exc, args.json)
    if args.snapshot:
        dump_snapshot(args.snapshot)

    summary = {
        **header(args, cfg, warmup),
        "schedule_sha256": schedule_digest(schedule),
        "parameters": sum(p.numel() for p in workload.model.parameters()),
        **summarize(records, warmup),
    }
    summary.update(cap_fields(fraction, filler))
    if args.device == "cuda":
        summary.update(memory_peaks())
        summary["utilization"] = summary["max_memory_allocated"] / summary["max_memory_reserved"]
        end = gmlake_stats()
        summary["gmlake"] = end
        summary["gmlake_after_warmup"] = counters_since(at_warmup, end) if end is not None else None
    if args.gpu_time_steps:         # after every figure above is read: these steps are not part of them
        summary["gpu_time"] = [gpu_time(lambda shape=shape: one_step(shape), cuda=args.device == "cuda")
                               for shape in schedule[-args.gpu_time_steps:]]
    summary["per_step"] = records
    write_summary(summary, args.json, shown=("per_step", "gmlake", "config"))


if __name__ == "__main__":
    main()
