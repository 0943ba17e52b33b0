"""A policy hook that raises makes the torch allocation fail with the hook's message (issue 12), the allocator undone
and still usable after. Run directly (not through `gmlake run`): it enables gmlake with a Python policy object."""
from dataclasses import dataclass

import torch

import gmlake
import gmlake.torch as gt

MiB = 1 << 20


@dataclass(frozen=True)
class RefusesLargeSplits(gmlake.policies.GMLakePolicy):
    def should_split(self, block_size, size, pool, default):
        if pool == "large" and size >= 64 * MiB:
            raise ValueError("this policy refuses large splits")
        return default


gt.enable(RefusesLargeSplits())
small = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")      # splits below the threshold: fine
allocated = gt.memory_allocated()
try:
    torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
    raise SystemExit("FAIL: the hook's error was swallowed")
except RuntimeError as exc:
    message = str(exc)
assert "RefusesLargeSplits" in message or "refuses large splits" in message, message
assert "ValueError" in message and "refuses large splits" in message, message
assert gt.memory_allocated() == allocated, "the failed allocation was not undone"
again = torch.ones(4 * MiB, device="cuda")                          # the allocator is still usable
assert float(again.sum()) == 4 * MiB
print("ok policy error reached torch:", message[:160])
