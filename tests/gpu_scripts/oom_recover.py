"""A memory-fraction cap gives gmlake's clear OOM, and a loop that catches it and shrinks the batch recovers."""
import torch

import gmlake.torch as gt

torch.cuda.set_per_process_memory_fraction(0.05)            # about 7 GiB of an H200
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
batch, errors = 1 << 17, []
while batch >= 1024:
    try:
        x = torch.randn(batch, 4096, device="cuda")
        model(x).sum().backward()
        break
    except RuntimeError as exc:
        errors.append(str(exc))
        batch //= 2
        model.zero_grad(set_to_none=True)
assert errors, "the cap should have been hit"
message = errors[0]
assert "gmlake: CUDA out of memory" in message and "reserved" in message and "cap" in message, message
assert gt.memory_stats()["num_ooms"] >= 1
print("recovered at batch", batch, "after", len(errors), "OOMs; message:", message[:200])
