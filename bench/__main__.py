"""`python -m bench COMMAND [SUBCOMMAND] ARGS...`: every benchmark of gmlake behind one entry point.

Each command is a module of bench with a `main(argv, prog)`; `python -m bench COMMAND --help` shows its options.
"""
from __future__ import annotations

import importlib
import sys

# command -> (module, what it measures); a command with subcommands maps each to its own module.
COMMANDS: dict[str, tuple[str, str] | dict[str, tuple[str, str]]] = {
    "train": ("bench.train_suite", "the training suite: LLM fine-tuning workloads under native, expandable, gmlake"),
    "speed": ("bench.speed_suite", "the dynamic-shape speed suite: four workloads, allocators interleaved"),
    "speed-ab": ("bench.speed_ab", "warm step time of allocators or two gmlake builds, with a verdict at 2 %"),
    "cap": {
        "search": ("bench.cap_search", "the smallest memory cap at which each workload completes, per allocator"),
        "time": ("bench.cap_time", "step time at a cap against uncapped, in A B B A rounds"),
    },
    "micro": ("bench.micro", "the core's cache hits, each driver call, stitching, stream calls"),
    "sync-price": ("bench.sync_price", "a context synchronize's price, idle and in a training-like loop"),
    "latency": ("bench.torch_latency", "torch.empty + del under gmlake against native's allocator"),
    "kernels": ("bench.vmm_kernels", "kernels on cudaMalloc memory against VMM memory of 20 MiB and 2 MiB handles"),
    "ipc-price": ("bench.ipc_price", "each VMM call per handle and a step, with and without exportable chunks"),
    "replay-speed": ("bench.replay_speed", "replay's events per second; --against OLD_CHECKOUT for an A/B"),
    "fsdp-pattern": ("bench.fsdp_pattern", "FSDP's streams modelled on the sim driver"),
    "edge": ("bench.edge", "at the edge of memory, by replay: where each policy fits, what fitting costs there"),
    "plan-goals": ("bench.plan_goals", "the replay goals of a policy, on tuning and held-out validation traces"),
    "edge-fit": ("bench.edge_fit", "the device as the limit, libraries loading lazily: who trains at k x P + L"),
    "report": {
        "docs": ("bench.report_docs", ("rewrite the generated sections of the docs (benchmarks.md from "
                                       "bench/results, policies.md by replay)")),
        "stall": ("bench.stall_check", "the stall model against GPU runs"),
        "prices": ("bench.price_check", "the driver price table against the time measured in GPU runs"),
        "variation": ("bench.run_variation", "the runs' own variation, and the runs a speed gap needs"),
    },
}
GROUPS = {"cap": "memory caps on the GPU", "report": "tables and checks from the results"}


def usage(commands: dict, prefix: str) -> str:
    width = max(len(name) for name in commands)
    lines = [f"usage: python -m {prefix} COMMAND ...", "", "commands:"]
    for name, entry in commands.items():
        text = entry[1] if isinstance(entry, tuple) else f"{name} {'|'.join(entry)} ...: " + GROUPS[name]
        lines.append(f"  {name:<{width}}  {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands, prog = COMMANDS, "bench"
    while True:
        if not args or args[0] in ("-h", "--help"):
            print(usage(commands, prog))
            return 0
        name = args.pop(0)
        entry = commands.get(name)
        if entry is None:
            print(f"{prog}: no command {name!r}; one of: {', '.join(commands)}", file=sys.stderr)
            return 2
        prog = f"{prog} {name}"
        if isinstance(entry, tuple):
            return importlib.import_module(entry[0]).main(args, prog) or 0
        commands = entry


if __name__ == "__main__":
    sys.exit(main())
