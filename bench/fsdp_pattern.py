"""FSDP's streams on a CPU: PyTorch FSDP1's allocation pattern replayed through policies on the sim driver.

    python -m bench fsdp-pattern [--policy SPEC]... [--steps 24] [--layers 24] [--lag N] [--json OUT]
        [--trace OUT.pickle.gz]

Modelled from FSDP1's source, per rank, OPT-1.3B in bf16 over two ranks: the unshard stream allocates each layer's
unsharded flat parameter, freed after the layer with record_stream; the compute stream the checkpointed inputs,
temporaries and unsharded gradient; the post-backward stream each sharded gradient, kept until zero_grad. Without
`cross_stream` sharing those gradients can never hold the next forward's activations. Events complete at once, an
upper bound on reuse; --lag N makes the GPU trail by N layers (Note [Polling pending frees]). --trace writes the
pattern as a snapshot (tests/data/fsdp-pattern.pickle.gz) for `gmlake replay`.
"""
from __future__ import annotations

import gzip
import json
import pickle
import random
from pathlib import Path

from bench.cli import OneLineParser

MiB = 1 << 20
GiB = 1 << 30
COMPUTE, UNSHARD, POST_BACKWARD = 1, 2, 3
HIDDEN, VOCAB = 2048, 50272                    # OPT-1.3B
UNSHARDED_PARAM, SHARDED_PARAM = 100 * MiB, 50 * MiB
H200_BYTES = 150_109_880_320                   # torch.cuda.get_device_properties(0).total_memory on the H200s


def run(policy, steps: int = 24, layers: int = 24, seed: int = 0, history: list | None = None,
        lag: int | None = None) -> dict:
    """Replay `steps` training steps of the pattern through `policy`; the allocator's stats at the end. With a
    `history` list, the allocator's events (PyTorch snapshot entries) are appended to it. `lag`: how many layers
    the GPU's work trails the CPU's, each step ending in a synchronize (None: every event is complete at once)."""
    import gmlake

    driver = gmlake.SimDriver()
    driver.auto_complete = lag is None
    alloc = gmlake.Allocator(driver, policy)
    if history is not None:
        alloc.record_history()
    boundaries: list[dict[int, int]] = []           # per layer done: the work queued on each stream by then

    def layer_done() -> None:
        if lag is None:
            return
        boundaries.append({s: driver.queued(s) for s in (COMPUTE, UNSHARD, POST_BACKWARD)})
        if len(boundaries) > lag:
            for stream, ticket in boundaries[-1 - lag].items():
                driver.complete_stream(stream, ticket)

    def synchronize() -> None:                      # the workload's torch.cuda.synchronize() after each step
        if lag is not None:
            driver.complete_all()
            boundaries.clear()
    rng = random.Random(seed)
    shards = [alloc.malloc(SHARDED_PARAM, COMPUTE) for _ in range(layers)]      # sharded parameters, for good

    def unshard() -> int:
        return alloc.malloc(UNSHARDED_PARAM, UNSHARD)

    def reshard(param: int) -> None:
        alloc.record_stream(param, COMPUTE)
        alloc.free(param)

    def temporaries(*multiples: int) -> None:
        for block in [alloc.malloc(activation * k, COMPUTE) for k in multiples]:
            alloc.free(block)

    for _ in range(steps):
        batch, length = rng.randint(2, 8), rng.choice((128, 256, 512, 768, 1024))
        activation = batch * length * HIDDEN * 2
        saved, sharded_grads = [], []
        for _layer in range(layers):                                            # forward
            param = unshard()
            saved.append(alloc.malloc(activation, COMPUTE))                     # checkpointed input
            temporaries(1, 4, 1)
            reshard(param)
            layer_done()
        logits = alloc.malloc(batch * length * VOCAB * 4, COMPUTE)
        grad_logits = alloc.malloc(batch * length * VOCAB * 4, COMPUTE)
        alloc.free(logits)
        for _layer in range(layers):                                            # backward
            param = unshard()
            temporaries(1, 4, 1, 1, 4, 1)                                       # recomputation, then gradients
            alloc.free(saved.pop())
            unsharded_grad = alloc.malloc(UNSHARDED_PARAM, COMPUTE)
            sharded_grads.append(alloc.malloc(SHARDED_PARAM, POST_BACKWARD))   # reduce-scatter output
            alloc.record_stream(unsharded_grad, POST_BACKWARD)
            alloc.free(unsharded_grad)
            reshard(param)
            layer_done()
        alloc.free(grad_logits)
        for grad in sharded_grads:                                              # optimizer step, zero_grad
            alloc.free(grad)
        synchronize()
    for shard in shards:
        alloc.free(shard)
    stats = alloc.stats()
    if history is not None:
        history.extend(alloc.history())
    alloc.close()
    return stats


def write_trace(path: Path, steps: int, layers: int, seed: int) -> None:
    """The pattern as a PyTorch snapshot (gzipped pickle), recorded under the caching policy, with its peaks."""
    from gmlake.policies import resolve

    entries: list = []
    stats = run(resolve("caching").policy, steps, layers, seed, history=entries)
    snapshot = {"segments": [], "device_traces": [entries],
                "gmlake": {"name": path.name.split(".")[0], "allocator": "native", "device_name": "NVIDIA H200",
                           "device_total": H200_BYTES,
                           "max_memory_reserved": stats["peak_reserved_bytes"],
                           "max_memory_allocated": stats["peak_allocated_bytes"]}}
    with gzip.open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)


def main(argv: list[str] | None = None, prog: str = "bench fsdp-pattern") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", action="append", help="a policy spec (repeatable; default: expandable, gmlake, "
                        "gmlake[cross_stream=false], gmlake-paper)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lag", type=int, metavar="LAYERS",
                        help="the GPU trails the CPU by this many layers, each step ending in a synchronize "
                             "(default: every event is complete at once)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--trace", type=Path, help="also write the pattern as a snapshot (.pickle.gz) for replay")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.layers < 1:
        parser.error("--steps and --layers must be at least 1")
    if args.lag is not None and args.lag < 0:
        parser.error("--lag must be at least 0")
    for out in (args.json, args.trace):
        if out is not None and not out.parent.is_dir():
            parser.error(f"{out}: no such directory {str(out.parent)!r}")
    from gmlake.policies import resolve
    from gmlake.sim.replay import driver_seconds

    specs = args.policy or ["expandable", "gmlake[cross_stream=false]", "gmlake", "gmlake-paper"]
    try:
        policies = [resolve(spec).policy for spec in specs]
    except ValueError as exc:
        parser.error(str(exc))
    results = []
    print(f"{'policy':44} {'reserved GiB':>12} {'allocated GiB':>13} {'utilization':>11} {'stitches':>8} "
          f"{'migrations':>10} {'priced driver ms':>16}")
    for spec, policy in zip(specs, policies):
        st = run(policy, args.steps, args.layers, args.seed, lag=args.lag)
        row = {"policy": spec, "peak_reserved": st["peak_reserved_bytes"], "peak_allocated": st["peak_allocated_bytes"],
               "utilization": st["peak_allocated_bytes"] / st["peak_reserved_bytes"], "stitches": st["stitches"],
               "stream_migrations": st["stream_migrations"], "pending_frees_at_end": st["pending_frees"],
               "driver_seconds": driver_seconds(st), "calls": st["calls"]}
        results.append(row)
        print(f"{spec:44} {row['peak_reserved'] / GiB:12.2f} {row['peak_allocated'] / GiB:13.2f} "
              f"{row['utilization']:11.3f} {row['stitches']:8} {row['stream_migrations']:10} "
              f"{row['driver_seconds'] * 1e3:16.1f}")
    if args.trace:
        write_trace(args.trace, args.steps, args.layers, args.seed)
        print(f"wrote {args.trace}")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "layers": args.layers, "seed": args.seed, "lag": args.lag,
                                         "results": results}, indent=2) + "\n")
    return 0
