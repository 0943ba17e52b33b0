"""Re-backing at the edge on the CUDA driver (Note [Taking slots back at the edge]): under a cap, twenty 20 MiB pages
each hold a live 6 MiB tensor and a freed 14 MiB gap; a 300 MiB tensor fits only once the gaps go back. Every live
tensor must keep its values (copied to the host and back at the same addresses), kernels must still run on them,
and the run must have re-backed (not merely released free pages). Re-backing is off by default: run with
GMLAKE_KNOBS=reback_slot=2MiB (tests/test_torch_gpu.py does)."""
import torch

import gmlake.torch as gt

MiB = 1 << 20
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(600 * MiB / total)
keep, gaps = [], []
for i in range(20):
    keep.append(torch.full((6 * MiB // 4,), float(i), device="cuda"))
    gaps.append(torch.empty(14 * MiB // 4, device="cuda"))
ptrs = [t.data_ptr() for t in keep]
del gaps
torch.cuda.synchronize()
before = gt.allocator().stats()
print("before", {k: before[k] for k in ("reserved_bytes", "allocated_bytes")}, flush=True)
big = torch.ones(300 * MiB // 4, device="cuda")        # 400 + 300 > 600 MiB: needs the 280 MiB of gaps back
after = gt.allocator().stats()
print("after", {k: after[k] for k in ("reserved_bytes", "allocated_bytes", "rebacked_chunks", "copied_bytes")},
      after["calls"]["copy_out"], flush=True)
assert after["rebacked_chunks"] >= 19, after["rebacked_chunks"]        # every page (one may hold other blocks)
assert after["calls"]["copy_out"] >= after["rebacked_chunks"] and after["copied_bytes"] >= 19 * 6 * MiB, after
assert after["reserved_bytes"] <= before["reserved_bytes"] + 300 * MiB - 19 * 14 * MiB, after["reserved_bytes"]
for i, t in enumerate(keep):
    assert t.data_ptr() == ptrs[i]
    assert bool(torch.all(t == float(i))), f"tensor {i} lost its values"
    t.add_(1.0)                                         # a kernel writes through the new handles
assert all(bool(torch.all(t == float(i + 1))) for i, t in enumerate(keep))
assert float(big.sum()) == 300 * MiB // 4
small = [torch.full((2 * MiB // 4,), 7.0, device="cuda") for _ in range(30)]   # into the gaps' slots, 2 MiB each
assert all(bool(torch.all(s == 7.0)) for s in small)
assert all(bool(torch.all(t == float(i + 1))) for i, t in enumerate(keep))
print("ok", after["rebacked_chunks"], "chunks re-backed,", after["copied_bytes"] // MiB, "MiB copied")
