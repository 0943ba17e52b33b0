"""torch.compile (default mode) trains under gmlake."""
import torch

model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
step = torch.compile(lambda x: model(x).square().mean())
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
losses = []
for i in range(5):
    loss = step(torch.randn(64 + 32 * (i % 2), 512, device="cuda"))
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
print("ok", losses)
