"""CUDA graph capture under gmlake fails with a clear error rather than corrupting memory."""
import torch

x = torch.ones(1024, device="cuda")
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        y = x * 2
except RuntimeError as exc:
    assert "gmlake: CUDA graph capture is not supported" in str(exc), exc
    print("ok: refused with:", str(exc)[:120])
else:
    raise SystemExit("graph capture was not refused")
