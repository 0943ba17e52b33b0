"""torch.cuda's memory API answering from a gmlake allocator on the sim driver, with a CPU build of torch.

torch's own Python functions run unchanged; only torch._C's entry points are gmlake's (install_memory_api), and CUDA
is made to look initialised. Prints one JSON object with what the functions returned.
"""
import json
import sys

import torch

import gmlake
import gmlake.torch as gt
from gmlake.torch import _torch_bridge

MiB = 1 << 20
_torch_bridge.configure(lambda device: gmlake.Allocator(gmlake.SimDriver(capacity=8 << 30),
                                                        gmlake.policies.get("gmlake-paper")))   # stitches at once
torch.cuda.is_initialized = lambda: True
torch.cuda.memory.is_initialized = lambda: True
torch.cuda.current_device = lambda: 0
# bound before the patch: must still answer from gmlake
from torch.cuda import max_memory_allocated

gt.install_memory_api(torch)
alloc = _torch_bridge.allocator(0)
torch.cuda.memory._record_memory_history(max_entries=100_000)
ptrs = [alloc.malloc(64 * MiB) for _ in range(4)]
for p in ptrs[::2]:
    alloc.free(p)
stitched = alloc.malloc(100 * MiB)          # no free block of 100 MiB: two free 64 MiB blocks are stitched
out = {
    "stitches": alloc.stats()["stitches"],
    "memory_allocated": torch.cuda.memory_allocated(),
    "max_memory_allocated": max_memory_allocated(),
    "memory_reserved": torch.cuda.memory_reserved(),
    "max_memory_reserved": torch.cuda.max_memory_reserved(0),
    "stats": torch.cuda.memory_stats(),
    "accelerator_allocated": torch._C._accelerator_getDeviceStats(0)["allocated_bytes"]["all"]["current"],
    "summary": torch.cuda.memory_summary(0),
}
torch.cuda.reset_peak_memory_stats()
out["max_memory_allocated_after_reset"] = torch.cuda.max_memory_allocated()
torch.cuda.reset_accumulated_memory_stats()
out["allocations_after_reset_accumulated"] = torch.cuda.memory_stats()["allocation.all.allocated"]
out["snapshot_segments"] = torch.cuda.memory_snapshot()
torch.cuda.memory._dump_snapshot(sys.argv[1])
gt.restore_memory_api(torch)
out["restored"] = not hasattr(torch._C, "_cuda_memoryStats") or torch._C._cuda_memoryStats is not gt.nested_memory_stats
out["stitched_addr"] = stitched
print(json.dumps(out))
