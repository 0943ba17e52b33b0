"""Shared by the out-of-memory scripts: a cap by set_per_process_memory_fraction, the allocator in use, and a tiny
causal LM made from a config (no download), whose memory grows with the batch through its logits."""
from __future__ import annotations

import os

import torch

GiB = 1 << 30
SEQ = 256
VOCAB = 32000


def allocator_name() -> str:
    """gmlake, expandable (PyTorch's allocator with expandable segments) or native."""
    try:
        import gmlake.torch as gt

        if gt.is_enabled():
            return "gmlake"
    except ImportError:
        pass
    return "expandable" if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else "native"


def cap(gib: float) -> int:
    """Cap this process at `gib` GiB of the device, as PyTorch's users do; the cap in bytes."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(gib * GiB / total)
    return int(gib * GiB)


def tiny_lm():
    """A two-layer GPT-2 with a 32k vocabulary: about 10 M parameters, its logits ~33 MB a sample in fp32."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=SEQ, vocab_size=VOCAB)
    return GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, each its own labels."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return {"input_ids": self.data[i], "labels": self.data[i]}
