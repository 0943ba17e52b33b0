"""Train a small transformer a few steps with deterministic settings; print the losses as JSON."""
import json
import os

import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True, dropout=0.0),
    num_layers=4).cuda()
head = torch.nn.Linear(256, 1000).cuda()
opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-3)
gen = torch.Generator(device="cuda").manual_seed(1)
losses = []
for step in range(12):
    seq = 32 + 16 * (step % 5)          # shapes vary per step
    x = torch.randn(8, seq, 256, device="cuda", generator=gen)
    y = torch.randint(0, 1000, (8, seq), device="cuda", generator=gen)
    loss = torch.nn.functional.cross_entropy(head(model(x)).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
print(json.dumps(losses))
