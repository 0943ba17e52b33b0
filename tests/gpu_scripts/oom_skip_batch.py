"""A training loop that catches torch.cuda.OutOfMemoryError, skips the batch and goes on, under a 3 GiB cap: the
batches that fit train, the two too large are skipped. Prints one JSON line."""
import json

import torch
from oom_common import allocator_name, cap

cap(3)
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
trained, skipped = [], []
for i, batch in enumerate([64, 64, 1 << 17, 64, 1 << 16, 64]):
    try:
        x = torch.randn(batch, 4096, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        trained.append(i)
    except torch.cuda.OutOfMemoryError:
        skipped.append(i)
    finally:
        x = None
        opt.zero_grad(set_to_none=True)
print(json.dumps({"allocator": allocator_name(), "trained": trained, "skipped": skipped,
                  "num_ooms": torch.cuda.memory_stats()["num_ooms"]}))
