"""Issue 13: a custom policy loaded by file path (`gmlake run --policy FILE.py:Class`) has its seams called on the
torch path, on the GPU, with the built-in answers kept: tensors stay correct and the stitches happen."""
import torch

import gmlake.torch as gt

MiB = 1 << 20
policy = gt.allocator().policy
assert type(policy).__name__ == "CountingSeams", f"the policy gmlake run installed is {type(policy).__name__}"
kept = []
for round_ in range(4):                           # free blocks of mixed sizes, then requests no single block fits
    blocks = [torch.full((n * MiB // 4,), float(n), device="cuda") for n in (6, 2, 10, 2, 14, 2)]
    del blocks[0], blocks[1], blocks[2]           # 6, 10 and 14 MiB freed between live 2 MiB guards
    big = torch.full((28 * MiB // 4,), 3.0, device="cuda")
    assert float(big.sum()) == 3.0 * 28 * MiB // 4
    kept.append(blocks)
    del big
calls = dict(type(policy).calls)
stats = gt.allocator().stats()
for seam in ("choose_block", "should_split", "choose_stitch", "segment_layout"):
    assert calls.get(seam, 0) > 0, f"{seam} was never called through the torch bridge: {calls}"
assert stats["stitches"] > 0, stats["stitches"]
print("ok seams called on the GPU:", calls, "stitches", stats["stitches"])
