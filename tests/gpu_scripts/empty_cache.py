"""torch.cuda.empty_cache() under gmlake gives memory back to the driver (cuMemGetInfo)."""
import torch

import gmlake.torch as gt

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
free0, _ = torch.cuda.mem_get_info()
ts = [torch.empty(int(s), dtype=torch.uint8, device="cuda") for s in (3e8, 5e8, 7e8, 1e8, 2e6, 3e3)]
a, b = ts[0], ts[1]
del ts[0], ts[0]
big = torch.empty(int(8e8), dtype=torch.uint8, device="cuda")   # stitched from the freed blocks
del big, a, b, ts
free1, _ = torch.cuda.mem_get_info()
assert free1 < free0 - int(1e9)
torch.cuda.empty_cache()
free2, _ = torch.cuda.mem_get_info()
print("free before", free0, "held", free1, "after empty_cache", free2, "reserved", gt.memory_reserved())
assert gt.memory_reserved() == 2 << 20 or gt.memory_reserved() == 0, gt.memory_reserved()   # torch.zeros(1) lives
assert free2 >= free0 - (2 << 20), (free0, free2)
