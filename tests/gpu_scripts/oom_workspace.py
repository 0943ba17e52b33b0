"""A library's workspace request through the allocator, refused at a cap: cuDNN asks the allocator for the workspace
of each execution plan it tries, and PyTorch moves on to the next plan when a request raises c10::OutOfMemoryError.
Under a cap that holds the tensors but only half the first plan's workspace, the refused workspaces are skipped and
counted, and the convolution ends as it ends under PyTorch's allocator. Prints one JSON line.

(cudnn.benchmark stays off, so that the plans tried are cuDNN's heuristics' under either allocator, not the ones a
timed search happens to rank first; benchmark mode under gmlake is tests/gpu_scripts/cudnn_benchmark.py's.)"""
from __future__ import annotations

import json

import torch
from oom_common import allocator_name

torch.backends.cudnn.benchmark = False
torch.manual_seed(0)
x = torch.randn(32, 128, 96, 96, device="cuda")
conv = torch.nn.Conv2d(128, 128, 5, padding=2).cuda()
with torch.no_grad():
    reference = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=2).float()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = conv(x)
    torch.cuda.synchronize()
    workspace = torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size()
    del out
torch.cuda.empty_cache()
total = torch.cuda.get_device_properties(0).total_memory
cap = torch.cuda.memory_reserved() + x.numel() * 4 + workspace // 2
torch.cuda.set_per_process_memory_fraction(cap / total)
oom_before = torch.cuda.memory_stats()["num_ooms"]
error = None
try:
    with torch.no_grad():
        out = conv(x)
    torch.cuda.synchronize()
    match = bool(torch.allclose(out, reference, rtol=1e-2, atol=1e-2))
except Exception as exc:  # noqa: BLE001 - the outcome is the point: which error escaped, if any
    error, match = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", False
print(json.dumps({"allocator": allocator_name(), "workspace_mib": workspace >> 20, "ran": error is None,
                  "match": match, "error": error,
                  "refused_workspaces": torch.cuda.memory_stats()["num_ooms"] - oom_before}))
