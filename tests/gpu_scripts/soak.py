"""Soak: >= 500 training steps with shapes that vary per step, under gmlake. Reserved memory must stay flat after
warm-up, the cached sBlocks bounded, and every chunk released at the end. Prints one JSON line of figures."""
import gc
import json
import random
import sys

import torch

import gmlake.torch as gt

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 500
warmup = steps // 5
rng = random.Random(0)
torch.manual_seed(0)
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True, dropout=0.0),
    num_layers=12).cuda().to(torch.bfloat16)
head = torch.nn.Linear(1024, 32000).cuda().to(torch.bfloat16)
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-5)
reserved, sblocks, stitches = [], [], []
for step in range(steps):
    batch = rng.choice([4, 6, 8, 12, 16])
    seq = rng.choice([128, 192, 256, 384, 512, 768, 1024])
    x = torch.randn(batch, seq, 1024, device="cuda", dtype=torch.bfloat16)
    y = torch.randint(0, 32000, (batch, seq), device="cuda")
    loss = torch.nn.functional.cross_entropy(head(model(x)).float().flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del x, y, loss
    s = gt.memory_stats()
    reserved.append(s["reserved_bytes.all.current"])
    sblocks.append(s["gmlake.cached_sblocks"])
    stitches.append(s["gmlake.stitches"])
after = reserved[warmup:]
peak = max(reserved)
drift = max(after) - after[0]
alloc = gt.allocator()
stats = alloc.stats()
del model, head, params, opt
gc.collect()
if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
    torch._C._cuda_clearCublasWorkspaces()
torch.cuda.synchronize()
torch.cuda.empty_cache()
end = alloc.stats()
result = {
    "steps": steps, "warmup": warmup, "peak_reserved": peak, "reserved_at_warmup_end": after[0],
    "max_reserved_after_warmup": max(after), "drift_bytes": drift, "drift_fraction": drift / peak,
    "max_cached_sblocks": max(sblocks), "stitches": stats["stitches"],
    "stitches_per_step_after_warmup": (stitches[-1] - stitches[warmup]) / (steps - warmup),
    "utilization": stats["peak_allocated_bytes"] / stats["peak_reserved_bytes"],
    "end_allocated": end["allocated_bytes"], "end_reserved": end["reserved_bytes"],
    "end_driver_chunks": alloc.driver.live_chunks,
}
print(json.dumps(result))
assert result["drift_fraction"] <= 0.05, result
assert result["max_cached_sblocks"] <= 4096, result
assert end["allocated_bytes"] == 0 and end["reserved_bytes"] == 0 and alloc.driver.live_chunks == 0, result
print("ok")
