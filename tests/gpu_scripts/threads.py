"""Several Python threads allocate, fill and check torch tensors at once while the main thread trains (so the
autograd engine's device thread allocates too), all under gmlake."""
import random
import threading
import time

import torch

import gmlake.torch as gt

errors, counts = [], []
stop = time.monotonic() + 15


def worker(seed: int) -> None:
    rng = random.Random(seed)
    stream = torch.cuda.Stream()
    live, ops = [], 0
    try:
        with torch.cuda.stream(stream):
            while time.monotonic() < stop:
                if live and (rng.random() < 0.5 or len(live) > 40):
                    t, v = live.pop(rng.randrange(len(live)))
                    if not bool((t == v).all()):
                        errors.append(f"thread {seed}: tensor overwritten")
                        return
                else:
                    n = rng.choice([rng.randint(1, 1 << 16), rng.randint(1 << 16, 1 << 24)])
                    v = rng.randint(1, 250)
                    live.append((torch.full((n,), v, dtype=torch.uint8, device="cuda"), v))
                ops += 1
            stream.synchronize()
    except Exception as exc:  # noqa: BLE001 - whatever fails in a thread is reported by the main one
        errors.append(f"thread {seed}: {exc!r}")
    counts.append(ops)


threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 2048)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
steps = 0
while time.monotonic() < stop:
    loss = model(torch.randn(256 + 64 * (steps % 4), 2048, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    steps += 1
for t in threads:
    t.join(timeout=120)
assert not any(t.is_alive() for t in threads), "deadlock"
assert not errors, errors
torch.cuda.synchronize()
gt.allocator().check()
print(f"ok: {sum(counts)} tensor operations in 8 threads and {steps} training steps, "
      f"stitches {gt.memory_stats()['gmlake.stitches']}")
