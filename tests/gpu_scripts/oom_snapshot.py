"""PyTorch's recipe for a memory snapshot at an out-of-memory: record the history, attach an observer that dumps a
snapshot, run out of memory. The snapshot the observer wrote loads and renders in torch.cuda._memory_viz (the
timeline, the segments and the text trace, which reads the oom entry's device_free). Prints one JSON line.

    python oom_snapshot.py OUT.pickle"""
import json
import pickle
import sys

import torch
from oom_common import GiB, allocator_name, cap
from torch.cuda import _memory_viz

MiB = 1 << 20
path = sys.argv[1]
calls = []


def oom_observer(device, alloc, device_alloc, device_free):
    calls.append([device, alloc, device_alloc, device_free])
    torch.cuda.memory._dump_snapshot(path)


torch.cuda.memory._record_memory_history(max_entries=100_000)
torch._C._cuda_attach_out_of_memory_observer(oom_observer)
limit = cap(1)
kept = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(2)]
try:
    torch.empty(GiB, dtype=torch.uint8, device="cuda")
    raised = None
except torch.cuda.OutOfMemoryError as e:
    raised = str(e)[:120]
with open(path, "rb") as f:
    snapshot = pickle.load(f)
trace = [e for t in snapshot["device_traces"] for e in t]
out = {"allocator": allocator_name(), "raised": raised is not None, "observer_calls": len(calls),
       "observer_args": calls[0][:3] if calls else None, "limit": limit,
       "free_is_number": bool(calls) and isinstance(calls[0][3], int),
       "segments": len(snapshot["segments"]), "oom_entries": sum(e["action"] == "oom" for e in trace),
       "oom_sizes": [e["size"] for e in trace if e["action"] == "oom"],
       "trace_plot": len(_memory_viz.trace_plot(snapshot)), "segment_plot": len(_memory_viz.segment_plot(snapshot)),
       "text_trace_has_oom": "raise OutOfMemoryError" in _memory_viz.trace(snapshot)}
print(json.dumps(out))
