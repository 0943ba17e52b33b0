"""A memory-fraction cap gives torch's OutOfMemoryError with gmlake's report after PyTorch's words, and a loop that
catches it and shrinks the batch recovers."""
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
    except torch.cuda.OutOfMemoryError as exc:
        errors.append(str(exc))
        batch //= 2
        model.zero_grad(set_to_none=True)
assert errors, "the cap should have been hit"
message = errors[0]
assert message.startswith("CUDA out of memory. Tried to allocate "), message
assert "allowed; gmlake: " in message and "reserved" in message and "limit in force: the cap of" in message, message
assert gt.memory_stats()["num_ooms"] == len(errors), (gt.memory_stats()["num_ooms"], len(errors))
print("recovered at batch", batch, "after", len(errors), "OOMs; message:", message[:200])
