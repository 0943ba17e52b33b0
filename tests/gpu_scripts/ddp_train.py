"""Two GPUs under torchrun with DDP: `torchrun --nproc-per-node 2 -m gmlake run tests/gpu_scripts/ddp_train.py`."""
import torch
import torch.distributed as dist

import gmlake.torch as gt

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda(),
    device_ids=[rank])
opt = torch.optim.AdamW(model.parameters())
for step in range(5):
    loss = model(torch.randn(64 + 16 * step, 1024, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
assert gt.is_enabled() and gt.memory_stats()["allocated_bytes.all.peak"] > 0
print(f"rank {rank} ok, device {torch.cuda.current_device()}, peak reserved {gt.max_memory_reserved()}")
dist.destroy_process_group()
