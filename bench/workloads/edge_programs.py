"""Three dynamic-shape programs of the kinds that run at a device's edge, in plain torch (no downloads), for
bench/workloads/dynamic.py (`--workload rl`, `sage` and `moe`):

    rl    an RL-style loop: sample completions for groups of prompts with a KV cache (SDPA attention, which picks
          flash or cuDNN kernels by shape), then a policy-gradient step over prompt + completion with recomputation;
          groups, group size, prompt length and completion length drawn per step
    sage  full-batch GraphSAGE (mean aggregation by index_add_) on a random graph whose node count and degree are
          drawn per step: multi-GB gathered messages that change size every step
    moe   a decoder whose feed-forward layers are top-2 mixtures of experts, routed by data (each expert's share of
          the tokens, and so its buffers, differs per step and per layer), with a large vocabulary whose logits are
          taken in float32: multi-GB logits and their gradients whose size follows the batch and sequence length
          drawn per step. Kept out of every tuning decision (bench/plan_goals.py's validation set)
"""
from __future__ import annotations

import random
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.workloads.common import Workload, draw_range

PRESETS = {
    "rl": {
        "full": {"hidden": 1024, "layers": 8, "heads": 16, "ffn": 4096, "vocab": 32000,
                 "groups": (2, 6), "group": (4, 8), "prompt": (64, 384), "prompt_step": 8, "new": (8, 48),
                 "new_step": 8},
        "small": {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64, "vocab": 100,
                  "groups": (1, 2), "group": (2, 2), "prompt": (8, 16), "prompt_step": 4, "new": (2, 6),
                  "new_step": 2},
    },
    "sage": {
        "full": {"features": 128, "hidden": 256, "layers": 3, "classes": 40,
                 "nodes": (50_000, 400_000), "nodes_step": 10_000, "degree": (6, 14)},
        "small": {"features": 8, "hidden": 16, "layers": 2, "classes": 4,
                  "nodes": (50, 200), "nodes_step": 10, "degree": (2, 4)},
    },
    "moe": {
        "full": {"hidden": 768, "layers": 6, "heads": 12, "experts": 8, "expert_ffn": 1536, "vocab": 50304,
                 "batch": (2, 12), "shape": (256, 1536), "shape_step": 64},
        "small": {"hidden": 32, "layers": 2, "heads": 2, "experts": 4, "expert_ffn": 32, "vocab": 100,
                  "batch": (1, 3), "shape": (8, 32), "shape_step": 4},
    },
}


class Block(nn.Module):
    """A pre-norm decoder block with SDPA attention; `cache` (keys, values) grows by concatenation, as transformers'
    DynamicCache does."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        if ffn:         # 0: a subclass brings its own feed-forward part (feed)
            self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor, cache: tuple | None = None) -> tuple[torch.Tensor, tuple]:
        b, n, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None and n > 1)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, h))
        return x + self.feed(self.norm2(x)), (k, v)

    def feed(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Decoder(nn.Module):
    def __init__(self, cfg: dict, block: type[Block] | None = None):
        super().__init__()
        self.embed = nn.Embedding(cfg["vocab"], cfg["hidden"])
        self.blocks = nn.ModuleList(block(cfg) if block else Block(cfg["hidden"], cfg["heads"], cfg["ffn"])
                                    for _ in range(cfg["layers"]))
        self.norm = nn.LayerNorm(cfg["hidden"])
        self.head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)

    def hidden(self, ids: torch.Tensor, recompute: bool) -> torch.Tensor:
        """The final hidden states of a whole sequence, each block recomputed in backward where `recompute`."""
        x = self.embed(ids)
        for block in self.blocks:
            x = checkpoint(lambda y, blk=block: blk(y)[0], x, use_reentrant=False) if recompute else block(x)[0]
        return self.norm(x)

    @torch.no_grad()
    def sample(self, prompt: torch.Tensor, new: int, generator: torch.Generator | None) -> torch.Tensor:
        """`new` tokens sampled after `prompt` with a KV cache: one prefill, then one token at a time."""
        caches: list = [None] * len(self.blocks)
        x, out = self.embed(prompt), []
        for _ in range(new):
            for i, block in enumerate(self.blocks):
                x, caches[i] = block(x, caches[i])
            probs = torch.softmax(self.head(self.norm(x[:, -1])).float(), dim=-1)
            token = torch.multinomial(probs, 1, generator=generator)
            out.append(token)
            x = self.embed(token)
        return torch.cat(out, dim=1)


def build_rl(cfg: dict, device: torch.device):
    with torch.device(device):
        model = Decoder(cfg)

    def draw(rng: random.Random) -> dict:
        groups, group = draw_range(rng, cfg["groups"], 1), draw_range(rng, cfg["group"], 1)
        return {"batch": groups * group, "group": group,
                "prompt": draw_range(rng, cfg["prompt"], cfg["prompt_step"]),
                "new": draw_range(rng, cfg["new"], cfg["new_step"])}

    def make(shape: dict, dev: torch.device) -> dict:
        prompts = torch.randint(0, cfg["vocab"], (shape["batch"], shape["prompt"]), device=dev)
        return {"prompts": prompts, "new": shape["new"], "group": shape["group"]}

    def loss(m: nn.Module, inputs: dict) -> torch.Tensor:
        prompts, new, group = inputs["prompts"], inputs["new"], inputs["group"]
        completions = m.sample(prompts, new, None)
        sequence = torch.cat([prompts, completions], dim=1)
        rewards = (completions % 7 == 0).float().mean(dim=1).view(-1, group)      # any reward: memory is the point
        advantages = ((rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + 1e-4))
        hidden = m.hidden(sequence[:, :-1], recompute=True)[:, prompts.shape[1] - 1:]
        logp = torch.log_softmax(m.head(hidden).float(), dim=-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
        return -(advantages.view(-1, 1) * logp).mean()

    return Workload(model, draw, make, loss, lambda s: s["batch"] * (s["prompt"] + s["new"]))


class Sage(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        widths = [cfg["features"]] + [cfg["hidden"]] * (cfg["layers"] - 1) + [cfg["classes"]]
        self.self_lin = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(widths))
        self.neigh_lin = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in pairwise(widths))

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        degree = torch.zeros(x.shape[0], device=x.device).index_add_(0, dst, torch.ones_like(dst, dtype=torch.float))
        scale = degree.clamp(min=1).reciprocal().unsqueeze(1)
        for i, (own, neigh) in enumerate(zip(self.self_lin, self.neigh_lin)):
            messages = x.index_select(0, src)                                 # E x width: the big, varying tensor
            mean = torch.zeros_like(x).index_add_(0, dst, messages) * scale.to(x.dtype)
            x = own(x) + neigh(mean)
            if i < len(self.self_lin) - 1:
                x = F.relu(x)
        return x


def build_sage(cfg: dict, device: torch.device):
    with torch.device(device):
        model = Sage(cfg)

    def draw(rng: random.Random) -> dict:
        nodes = draw_range(rng, cfg["nodes"], cfg["nodes_step"])
        return {"batch": nodes, "degree": draw_range(rng, cfg["degree"], 1)}

    def make(shape: dict, dev: torch.device) -> dict:
        n, e = shape["batch"], shape["batch"] * shape["degree"]
        return {"x": torch.randn(n, cfg["features"], device=dev), "src": torch.randint(0, n, (e,), device=dev),
                "dst": torch.randint(0, n, (e,), device=dev), "labels": torch.randint(0, cfg["classes"], (n,), device=dev)}

    def loss(m: nn.Module, inputs: dict) -> torch.Tensor:
        return F.cross_entropy(m(inputs["x"], inputs["src"], inputs["dst"]).float(), inputs["labels"])

    return Workload(model, draw, make, loss, lambda s: s["batch"])


class MoEBlock(Block):
    """Block whose feed-forward part is a top-2 mixture of experts: each expert runs on the tokens routed to it
    (gathered with index_select, scattered back with index_add), so its buffers' sizes follow the data."""

    def __init__(self, cfg: dict):
        super().__init__(cfg["hidden"], cfg["heads"], 0)
        self.router = nn.Linear(cfg["hidden"], cfg["experts"], bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(cfg["hidden"], cfg["expert_ffn"]), nn.GELU(),
                                                   nn.Linear(cfg["expert_ffn"], cfg["hidden"]))
                                     for _ in range(cfg["experts"]))

    def feed(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.softmax(self.router(tokens), dim=-1).topk(2, dim=-1)
        mixed = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                mixed = mixed.index_add(0, rows, expert(tokens.index_select(0, rows)) * weights[rows, slot, None])
        return mixed.view_as(x)


def build_moe(cfg: dict, device: torch.device):
    with torch.device(device):
        model = Decoder(cfg, MoEBlock)

    def draw(rng: random.Random) -> dict:
        return {"batch": draw_range(rng, cfg["batch"], 1), "length": draw_range(rng, cfg["shape"], cfg["shape_step"])}

    def make(shape: dict, dev: torch.device) -> dict:
        return {"ids": torch.randint(0, cfg["vocab"], (shape["batch"], shape["length"] + 1), device=dev)}

    def loss(m: nn.Module, inputs: dict) -> torch.Tensor:
        ids = inputs["ids"]
        logits = m.head(m.hidden(ids[:, :-1], recompute=False)).float()     # batch x length x vocab in float32
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return Workload(model, draw, make, loss, lambda s: s["batch"] * s["length"])
