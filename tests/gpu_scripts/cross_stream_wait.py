"""Note [Waiting for another stream's free block] on a real GPU: with cross_stream_wait, the default stream takes
the block a side stream freed while the side stream's kernels still write into it. The wait on the GPU must order
the side stream's late write before the new owner's, or the new owner reads the side stream's value."""
import sys

import torch

import gmlake.torch as gt

n = 1 << 26                                     # 256 MiB of float32: a large-pool block
side = torch.cuda.Stream()
kept = []                                       # the default stream never frees, so it has no free block of its own
per_trial = []
for trial in range(5):
    before = gt.memory_stats()["gmlake.stream_waits"]
    with torch.cuda.stream(side):
        x = torch.empty(n, device="cuda")       # the side stream's block
        torch.cuda._sleep(1_000_000_000)        # its kernels run late (~0.5 s) ...
        x.fill_(2.0)                            # ... and write the block last
    del x                                       # freed on the side stream while that write is queued
    y = torch.empty(n, device="cuda")           # a miss on the default stream: waits for the side stream, takes x's block
    y.fill_(3.0)
    kept.append(y)
    per_trial.append(gt.memory_stats()["gmlake.stream_waits"] - before)
torch.cuda.synchronize()
for trial, y in enumerate(kept):
    assert bool((y == 3.0).all()), f"trial {trial}: the side stream's late write landed after the new owner's"
print("waits per trial:", per_trial)
# With the knob, a trial whose side-stream event had already completed takes the block without a wait (one of five
# did on an H200, 2026-12-01): at least one wait must have happened, or this checked nothing.
if sys.argv[1:] == ["wait"]:
    assert sum(per_trial) >= 1, per_trial
else:
    assert sum(per_trial) == 0, per_trial
print("ok")
