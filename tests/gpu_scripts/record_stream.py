"""A consumer on a side stream reads a tensor after the producer frees it: record_stream must keep its memory."""
import torch

import gmlake.torch as gt

n = 1 << 26
side = torch.cuda.Stream()
for trial in range(5):
    x = torch.full((n,), 7.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)          # the consumer is late
        total = x.sum()
    x.record_stream(side)
    del x                                       # freed while the side stream has not read it yet
    for _ in range(4):                          # the producer reuses memory at once
        y = torch.empty(n, device="cuda").fill_(-1.0)
        del y
    torch.cuda.synchronize()
    assert total.item() == 7.0 * n, f"trial {trial}: the side stream read overwritten memory: {total.item()}"
# Deferred frees are retired at the next allocation once their events have completed.
torch.empty(1, device="cuda")
assert gt.memory_stats()["gmlake.pending_frees"] == 0
print("ok")
