"""Each way an allocation runs out of memory raises torch.OutOfMemoryError whose text begins with PyTorch's words,
and memory_stats()["num_ooms"] counts it: a plain allocation over a cap set by set_per_process_memory_fraction, one
inside autograd's backward (raised on autograd's thread, re-raised in the caller's), one larger than the device;
the allocator serves again after. Prints one JSON line; run under PyTorch's allocator and under `gmlake run`, the
outcomes must be the same."""
import json

import torch
from oom_common import GiB, allocator_name, cap

MiB = 1 << 20


def should_reduce_batch_size(e: BaseException) -> bool:
    """accelerate's test (accelerate.utils.memory), by the words."""
    return isinstance(e, RuntimeError) and len(e.args) == 1 and "CUDA out of memory." in e.args[0]


def attempt(fn) -> dict:
    try:
        fn()
    except Exception as e:       # noqa: BLE001 - what was raised is the result
        return {"raised": type(e).__name__, "oom": isinstance(e, torch.cuda.OutOfMemoryError),
                "torch_oom": isinstance(e, torch.OutOfMemoryError), "runtime": isinstance(e, RuntimeError),
                "words": str(e).startswith("CUDA out of memory. Tried to allocate "),
                "accelerate": should_reduce_batch_size(e), "head": str(e)[:160]}
    return {"raised": None}


out = {"allocator": allocator_name()}
torch.ones(1, device="cuda")
total = torch.cuda.get_device_properties(0).total_memory

cap(2)
out["plain"] = attempt(lambda: torch.empty(3 * GiB, dtype=torch.uint8, device="cuda"))


def backward_over_the_cap():
    a = torch.randn(16384, 8192, device="cuda", requires_grad=True)        # 512 MiB
    z = (a * 2).exp()                                                       # two more, exp's output saved
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 256 * MiB) / total)
    z.sum().backward()                                                      # needs 512 MiB more at least


torch.cuda.set_per_process_memory_fraction(1.0)
out["autograd"] = attempt(backward_over_the_cap)
torch.cuda.set_per_process_memory_fraction(1.0)
torch.cuda.empty_cache()
out["device"] = attempt(lambda: torch.empty(total + GiB, dtype=torch.uint8, device="cuda"))
out["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
out["usable_after"] = float(torch.ones(MiB, device="cuda").sum()) == MiB
print(json.dumps(out))
