"""torch.cuda.memory_stats() around torch.cuda.reset_peak_memory_stats() and reset_accumulated_memory_stats(),
answered by gmlake. `sim`: a CPU build of torch over a sim-driver allocator (torch._C's entry points are gmlake's, CUDA
made to look initialised, as torch_memory_api_on_sim.py does); `cuda`: under `gmlake run` on a GPU, with tensors.
Prints one JSON object: the stats at each moment, and gmlake's own stats() around Allocator.reset_peak_stats()."""
import json
import sys

import torch

import gmlake
import gmlake.torch as gt
from gmlake.torch import _torch_bridge

MiB = 1 << 20
mode = sys.argv[1]
if mode == "sim":
    _torch_bridge.configure(lambda device: gmlake.Allocator(gmlake.SimDriver(capacity=8 << 30),
                                                            gmlake.policies.get("gmlake-paper")))
    torch.cuda.is_initialized = lambda: True
    torch.cuda.memory.is_initialized = lambda: True
    torch.cuda.current_device = lambda: 0
    gt.install_memory_api(torch)
    alloc = _torch_bridge.allocator(0)
    live = {}

    def take(name, size):
        live[name] = alloc.malloc(size)

    def drop(name):
        alloc.free(live.pop(name))
else:
    torch.empty(1, device="cuda")
    alloc = _torch_bridge.allocator(0)
    live = {}

    def take(name, size):
        live[name] = torch.empty(size, dtype=torch.uint8, device="cuda")

    def drop(name):
        del live[name]

# Every peak above its current value, every current value above 0: a live stitched block, a cached one evicted,
# a large block freed, the cache emptied.
for i, size in enumerate((4, 4, 4)):
    take(f"part{i}", size * MiB)
    take(f"guard{i}", 2 * MiB)
for i in range(3):
    drop(f"part{i}")
take("stitched", 12 * MiB)
for i, size in enumerate((4, 4, 4)):
    take(f"part{i}", size * MiB)
    take(f"guard2{i}", 2 * MiB)
for i in range(3):
    drop(f"part{i}")
take("stitched2", 12 * MiB)
drop("stitched2")
take("big", 64 * MiB)
take("small", 1000)
drop("big")
alloc.empty_cache() if mode == "sim" else torch.cuda.empty_cache()
torch.cuda.synchronize() if mode == "cuda" else None
out = {"before": torch.cuda.memory_stats(), "gmlake_before": alloc.stats()}
torch.cuda.reset_peak_memory_stats()
out["after_peak_reset"] = torch.cuda.memory_stats()
out["gmlake_after_peak_reset"] = alloc.stats()
out["max_allocated_after_peak_reset"] = torch.cuda.max_memory_allocated()
out["max_reserved_after_peak_reset"] = torch.cuda.max_memory_reserved()
torch.cuda.reset_accumulated_memory_stats()
out["after_accumulated_reset"] = torch.cuda.memory_stats()
take("after", 8 * MiB)
drop("after")
out["after_more"] = torch.cuda.memory_stats()
print(json.dumps(out))
