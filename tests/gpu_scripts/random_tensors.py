"""Thousands of tensors of random sizes under gmlake, each filled with its own value and checked when dropped."""
import os
import random

import torch

import gmlake.torch as gt

rng = random.Random(3)
live = {}
value = 0
for i in range(4000):
    if live and (rng.random() < 0.45 or len(live) > 300):
        key = rng.choice(list(live))
        t, v = live.pop(key)
        assert bool((t == v).all()), f"tensor {key} was overwritten"
    else:
        n = rng.choice([rng.randint(1, 4096), rng.randint(4096, 1 << 20), rng.randint(1 << 20, 1 << 25)])
        value = (value + 1) % 120 + 1
        t = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(value)
        live[i] = (t, value)
for t, v in live.values():
    assert bool((t == v).all())
stats = gt.memory_stats()
if os.environ.get("GMLAKE_POLICY") == "gmlake-paper":       # the paper's policy stitches such sizes at once
    assert stats["gmlake.stitches"] > 0, stats
gt.allocator().check()
print("ok", stats["gmlake.stitches"], stats["reserved_bytes.all.peak"], stats["allocated_bytes.all.peak"])
