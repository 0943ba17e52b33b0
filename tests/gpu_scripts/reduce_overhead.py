"""A small transformer trained with torch.compile, with or without CUDA graphs (mode="reduce-overhead"), under
whatever allocator the process has: prints one JSON line with the losses, graph replays, peak reserved and step time.

    python reduce_overhead.py [--mode reduce-overhead|default] [--steps 50]
"""
import argparse
import json
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="reduce-overhead", choices=["reduce-overhead", "default"])
parser.add_argument("--steps", type=int, default=50)
args = parser.parse_args()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

replays = 0
original_replay = torch.cuda.CUDAGraph.replay


def counting_replay(self, *a, **k):
    global replays
    replays += 1
    return original_replay(self, *a, **k)


torch.cuda.CUDAGraph.replay = counting_replay

layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, dropout=0.0, batch_first=True)
model = torch.nn.Sequential(torch.nn.Embedding(8000, 512), torch.nn.TransformerEncoder(layer, num_layers=4),
                            torch.nn.Linear(512, 8000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def forward_loss(tokens):
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


step_fn = torch.compile(forward_loss, mode=None if args.mode == "default" else args.mode)
data = torch.Generator(device="cuda").manual_seed(1)
losses, times = [], []
for step in range(args.steps):
    tokens = torch.randint(0, 8000, (32, 257), device="cuda", generator=data)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.compiler.cudagraph_mark_step_begin()
    loss = step_fn(tokens)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
warm = args.steps // 4
print(json.dumps({"mode": args.mode, "losses": losses, "graph_replays": replays,
                  "max_memory_reserved": torch.cuda.max_memory_reserved(),
                  "max_memory_allocated": torch.cuda.max_memory_allocated(),
                  "timed_s": sum(times[warm:]), "median_step_s": sorted(times[warm:])[len(times[warm:]) // 2]}))
