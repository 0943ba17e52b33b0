"""The stats API under torch's names, and a snapshot that gmlake replays to the GPU run's own peak."""
import sys

import torch

import gmlake.torch as gt
from gmlake.sim.replay import replay
from gmlake.sim.trace import load

gt.record_memory_history(True)
ts = []
for i in range(300):
    ts.append(torch.empty((i * 7919) % 50_000_000 + 1, dtype=torch.uint8, device="cuda"))
    if i % 3 == 2:
        del ts[(i * 31) % len(ts)]
del ts
s = gt.memory_stats()
for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
            "reserved_bytes.all.peak", "active_bytes.all.peak", "num_ooms"):
    assert key in s, key
assert gt.max_memory_allocated() == s["allocated_bytes.all.peak"] > 0
assert gt.memory_allocated() == 0
assert gt.max_memory_reserved() >= gt.max_memory_allocated()
print(gt.memory_summary())
path = gt.dump_snapshot(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gmlake-snapshot.pickle.gz")
trace = load(path)
total = torch.cuda.get_device_properties(0).total_memory
assert trace.meta.get("device_total") == total, "the snapshot records the device's size, so replay models it"
result = replay(trace, gt._enabled["chosen"])
print("real peak reserved", gt.max_memory_reserved(), "replayed", result.peak_reserved)
assert result.peak_reserved == gt.max_memory_reserved(), "the replay must predict the GPU run exactly"
gt.reset_peak_memory_stats()
assert gt.max_memory_allocated() == 0
print("ok")
