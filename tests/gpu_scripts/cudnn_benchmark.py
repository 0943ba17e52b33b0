"""Train with torch.backends.cudnn.benchmark = True: a small conv net, and timm's resnet18 where timm is installed
(made from its config, no download), each on inputs of two sizes so that cuDNN benchmarks several shapes, sizing
each search by asking the allocator for cacheInfo (Note [cacheInfo through a subclass] in
gmlake/torch/_torch_allocator.py). Prints one JSON line: the losses, the out-of-memory count, and under gmlake how
often cacheInfo reached the bridge and what it answers next to the device's free memory.

Usage: cudnn_benchmark.py [STEPS]; run it plainly (PyTorch's allocator) and under `gmlake run` (or GMLAKE=1)."""
from __future__ import annotations

import json
import sys

import torch
from oom_common import allocator_name

MiB = 1 << 20
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 8

torch.backends.cudnn.benchmark = True
# The algorithms cuDNN picks by timing may differ between runs; full fp32 keeps their results within rounding.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def convnet() -> torch.nn.Module:
    def block(cin: int, cout: int) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                torch.nn.ReLU(inplace=True)]

    return torch.nn.Sequential(*block(3, 32), *block(32, 64), torch.nn.MaxPool2d(2), *block(64, 128),
                               torch.nn.Conv2d(128, 128, 5, padding=2), torch.nn.ReLU(inplace=True),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10))


def models() -> dict[str, torch.nn.Module]:
    made = {"convnet": convnet}
    try:
        import timm

        made["timm_resnet18"] = lambda: timm.create_model("resnet18", pretrained=False, num_classes=10)
    except ImportError:
        pass
    out = {}
    for name, make in made.items():
        torch.manual_seed(0)
        out[name] = make().cuda()
    return out


def train(model: torch.nn.Module) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for step in range(STEPS):
        side = 64 if step % 2 == 0 else 96              # two shapes: two benchmarks for every convolution
        x = torch.randn(32, 3, side, side, device="cuda", generator=gen)
        y = torch.randint(0, 10, (32,), device="cuda", generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


result: dict[str, object] = {"allocator": allocator_name(), "steps": STEPS,
                             "losses": {name: train(model) for name, model in models().items()}}
torch.cuda.synchronize()
result["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
if result["allocator"] == "gmlake":
    import gmlake.torch as gt
    from gmlake.torch import _torch_bridge
    from gmlake.torch.state import _enabled

    free, _ = torch.cuda.mem_get_info()
    result.update(cache_info_installed=bool(_enabled.get("cache_info")),
                  cache_info_calls=_torch_bridge.cache_info_calls(),
                  cache_info_mib=_torch_bridge.cache_info(torch.cuda.current_device()) / MiB,
                  device_free_mib=free / MiB, limit_mib=gt.allocator().limit / MiB,
                  reserved_mib=torch.cuda.memory_reserved() / MiB)
print(json.dumps(result))
