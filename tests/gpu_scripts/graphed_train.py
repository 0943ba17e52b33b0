"""A module made a CUDA graph by torch.cuda.make_graphed_callables, trained 20 steps: prints the losses as JSON, so
test_torch_gpu can compare them under PyTorch's allocator and under gmlake (graphed and eager training differ by
up to 2 % after 20 steps under either allocator, so the comparison is graphed against graphed)."""
import json

import torch

dev = torch.device("cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
sample = torch.randn(64, 256, device=dev, requires_grad=True)
graphed = torch.cuda.make_graphed_callables(model, (sample,))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for step in range(20):
    x = torch.randn(64, 256, device=dev, generator=torch.Generator(device=dev).manual_seed(step))
    loss = graphed(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    losses.append(loss.item())
print(json.dumps(losses))
