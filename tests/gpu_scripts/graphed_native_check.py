import torch
dev=torch.device('cuda')
# 4. make_graphed_callables on a module, trained
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
eager = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
eager.load_state_dict(model.state_dict())
sample = torch.randn(64, 256, device=dev, requires_grad=True)
graphed = torch.cuda.make_graphed_callables(model, (sample,))
opt_g = torch.optim.SGD(model.parameters(), lr=0.05)
opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
losses_g, losses_e = [], []
for step in range(20):
    x = torch.randn(64, 256, device=dev, generator=torch.Generator(device=dev).manual_seed(step))
    for net, opt, out in ((graphed, opt_g, losses_g), (eager, opt_e, losses_e)):
        loss = net(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        out.append(loss.item())
print('max rel diff', max(abs(a-b)/abs(b) for a,b in zip(losses_g, losses_e)), losses_g[:3], losses_e[:3])
assert losses_g[-1] < losses_g[0], losses_g
print(f"ok: make_graphed_callables trained, loss {losses_g[0]:.4f} -> {losses_g[-1]:.4f} as eager")

