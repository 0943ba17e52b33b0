"""A training script that never mentions gmlake, for `GMLAKE=1 torchrun ...` and `GMLAKE=1 accelerate launch ...`.

    GMLAKE=1 torchrun --nproc-per-node 2 tests/gpu_scripts/env_train.py
    GMLAKE=1 accelerate launch --multi_gpu --num_processes 2 tests/gpu_scripts/env_train.py

DDP over NCCL when launched with several processes, a DataLoader whose spawned workers import torch but never touch
CUDA, then a check through gmlake's own statistics that gmlake served this rank's allocations. Prints PASS/FAIL lines
per rank; exits 1 on a failure.
"""
import os
import sys

import torch
import torch.distributed as dist


class Shapes(torch.utils.data.Dataset):
    """Batches whose sequence length changes, so the allocator sees new sizes each step."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> torch.Tensor:
        if torch.cuda.is_initialized():
            raise RuntimeError("a DataLoader worker initialised CUDA")
        return torch.randn(32 + 16 * (i % 7), 512, generator=torch.Generator().manual_seed(i))


def main() -> int:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        dist.init_process_group("nccl")
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                                      torch.nn.Linear(2048, 512)) for _ in range(4)]).cuda()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(Shapes(), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    for x in loader:
        loss = model(x.cuda(non_blocking=True)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()

    failures = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} rank {rank}: {name}{': ' + detail if detail else ''}", flush=True)

    import gmlake.torch as gt  # only to verify; the script ran under whatever GMLAKE chose

    check("gmlake is PyTorch's allocator", gt.is_enabled())
    if gt.is_enabled():
        s = gt.allocator(local).stats()
        check("gmlake served this rank's allocations", s["allocs"] > 50 and s["allocated_bytes"] > 0,
              f"{s['allocs']} allocations, peak reserved {s['peak_reserved_bytes'] >> 20} MiB, "
              f"{s['stitches']} stitches, policy {gt._enabled['chosen'].name}")
        check("torch.cuda.max_memory_reserved() is gmlake's", torch.cuda.max_memory_reserved() == s["peak_reserved_bytes"])
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {rank}: {'ALL PASS' if not failures else f'{failures} FAILED'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
