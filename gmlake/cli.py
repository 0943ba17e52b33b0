"""The gmlake command: replay, compare, capture, convert.

    gmlake replay TRACE [--policy NAME ...] [--json]
    gmlake compare [TRACE ...] [--out DIR]
    gmlake capture -o run.pickle.gz -- python train.py ...
    gmlake convert SNAPSHOT -o trace.gmtrace
    gmlake run train.py args...            (gmlake as PyTorch's CUDA allocator)

Bad input gets one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from gmlake import policies
from gmlake.trace import TraceError


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(message)


def _policies(names: list[str] | None) -> list[str]:
    names = names or policies.names()
    known = policies.names()
    for name in names:
        if name not in known:
            raise UsageError(f"unknown policy {name!r}; built-in policies: {', '.join(known)}")
    return names


def _load(paths: list[str], device: int | None):
    from gmlake.trace import load

    return [load(p, device) for p in paths]


def _policy_objects(names: list[str] | None, settings: list[str] | None) -> list:
    """The named policies (default: every built-in one) with the --set knobs applied."""
    knobs = policies.parse_knobs(settings or [])
    return [policies.get(name, **knobs) for name in _policies(names)]


def cmd_replay(args) -> int:
    """`gmlake replay`: one trace through each policy; a table, or JSON lines."""
    from gmlake.replay import replay

    chosen = _policy_objects(args.policy, args.set)
    (trace,) = _load([args.trace], args.device)
    results = [replay(trace, policy, device_memory=args.device_memory) for policy in chosen]
    if args.json:
        for r in results:
            print(json.dumps(r.summary()))
        return 0
    from rich.console import Console

    from gmlake.compare import table

    Console(width=None if sys.stdout.isatty() else 180).print(table(results, [trace]))
    return 0


def cmd_explain(args) -> int:
    """`gmlake explain`: where each policy's reserved bytes are at its peak; a table, or JSON lines."""
    from dataclasses import asdict

    from gmlake.explain import explain

    chosen = _policy_objects(args.policy, args.set)
    (trace,) = _load([args.trace], args.device)
    found = [explain(trace, policy, device_memory=args.device_memory) for policy in chosen]
    if args.json:
        for b in found:
            print(json.dumps(asdict(b)))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{trace.name}: reserved memory at each policy's peak (GiB, % of reserved)")
    table.add_column("")
    for b in found:
        table.add_column(b.policy, justify="right")
    table.add_row("request that reached the peak", *(f"#{b.request_index}, {b.request_size / 2**20:.2f} MiB"
                                                     for b in found))
    table.add_row("reserved", *(f"{b.reserved / 2**30:.3f}" for b in found), end_section=True)
    labels = [label for label, _ in found[0].rows()]
    for i, label in enumerate(labels):
        table.add_row(label, *(f"{b.rows()[i][1] / 2**30:.3f}  {100 * b.rows()[i][1] / b.reserved:5.1f}%"
                               for b in found), end_section=i == len(labels) - 1)
    for label in found[0].fragments:
        table.add_row(f"free large blocks {label}",
                      *(f"{b.fragments[label][0]} / {b.fragments[label][1] / 2**30:.3f}" for b in found))
    Console(width=None if sys.stdout.isatty() else 180).print(table)
    return 0


def cmd_compare(args) -> int:
    """`gmlake compare`: traces (default: the bundled ones) under every policy; table, PNG, JSON lines."""
    from rich.console import Console

    from gmlake import compare
    from gmlake.replay import bundled_traces

    names = _policies(args.policy)
    paths = args.traces or [str(p) for p in bundled_traces()]
    if not paths:
        raise UsageError("no traces given and none bundled")
    traces = _load(paths, args.device)
    results = compare.run(traces, names, progress=sys.stderr.isatty())
    console = Console(width=None if sys.stdout.isatty() else 180)
    console.print(compare.table(results, traces))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = compare.plot(results, traces, out / "compare.png")
    (out / "compare.jsonl").write_text("".join(json.dumps(r.summary()) + "\n" for r in results))
    console.print(f"wrote {png} and {out / 'compare.jsonl'}")
    return 0


def _program(args, usage: str) -> list[str]:
    """The program to run, after an optional `--`."""
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        raise UsageError(f"nothing to run: {usage}")
    return program


def cmd_capture(args) -> int:
    """`gmlake capture`: run a Python program with allocator history on, then dump its snapshot."""
    program = _program(args, "gmlake capture -o OUT -- python script.py args...")
    exe = Path(program[0]).name
    if not exe.startswith("python"):
        raise UsageError("capture runs Python programs: gmlake capture -o OUT -- python script.py args...")
    cmd = [program[0], "-m", "gmlake.capture", args.output]
    if args.name:
        cmd += ["--name", args.name]
    cmd += ["--", *program[1:]]
    return subprocess.call(cmd, env=os.environ.copy())


def cmd_convert(args) -> int:
    """`gmlake convert`: a snapshot to the compact .gmtrace format."""
    from gmlake.trace import load, save_compact

    (trace,) = _load([args.snapshot], args.device)
    if args.name:
        trace.meta["name"] = args.name
    save_compact(trace, args.output)
    print(f"{args.output}: {len(trace)} events")
    return 0


def cmd_run(args) -> int:
    """`gmlake run`: install gmlake as PyTorch's CUDA allocator, then run the program in this process."""
    import runpy

    from gmlake import torch as gtorch

    program = _program(args, "gmlake run script.py args...  (or: gmlake run -m module args...)")
    opts = gtorch.options_from_env()
    opts.update(policies.parse_knobs(args.set or []))
    for flag, knob in (("policy", "policy"), ("chunk_size", "chunk_size"), ("limit", "limit"),
                       ("max_cached_sblocks", "max_cached_sblocks")):
        value = getattr(args, flag)
        if value is not None:
            opts[knob] = value
    if args.no_stitch:
        opts["stitch"] = False
    policy = opts.pop("policy", "gmlake")
    limit = opts.pop("limit", 0)
    if program[0] == "-m" and len(program) < 2:
        raise UsageError("-m needs a module name")
    if program[0] != "-m" and not Path(program[0]).is_file():
        raise UsageError(f"no such script: {program[0]}")
    _policies([policy])
    policies.get(policy, **opts).validate(1)   # unknown or ill-typed knobs fail here, before the program runs
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("gmlake run needs PyTorch, which is not installed here") from None
    gtorch.enable(policy, limit=limit, **opts)
    if program[0] == "-m":
        sys.argv = program[1:]
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        script = Path(program[0])
        sys.argv = program
        sys.path.insert(0, str(script.resolve().parent))
        runpy.run_path(str(script), run_name="__main__")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the gmlake command."""
    parser = _Parser(prog="gmlake", description="GPU memory allocator with virtual memory stitching: tools.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("replay", help="replay one trace through policies on the sim driver")
    p.add_argument("trace", help="a PyTorch snapshot pickle (.pickle, .pickle.gz) or a .gmtrace file")
    p.add_argument("--policy", action="append", help="policy name (repeatable; default: all built-in)")
    p.add_argument("--json", action="store_true", help="one JSON object per line, one per policy")
    p.add_argument("--device", type=int, help="which device's trace, if the snapshot has several")
    p.add_argument("--device-memory", type=int, help="simulated device size in bytes (default: the captured one)")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE", help="change a policy knob (repeatable)")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("explain", help="where a policy's reserved memory is at its peak, replaying one trace")
    p.add_argument("trace", help="a PyTorch snapshot pickle (.pickle, .pickle.gz) or a .gmtrace file")
    p.add_argument("--policy", action="append", help="policy name (repeatable; default: all built-in)")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE", help="change a policy knob (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object per line, one per policy")
    p.add_argument("--device", type=int, help="which device's trace, if the snapshot has several")
    p.add_argument("--device-memory", type=int, help="simulated device size in bytes (default: the captured one)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("compare", help="replay traces (default: the bundled ones) under every policy; table + PNG")
    p.add_argument("traces", nargs="*")
    p.add_argument("--policy", action="append")
    p.add_argument("--device", type=int)
    p.add_argument("--out", default="gmlake-compare", help="folder for compare.png and compare.jsonl")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("capture", help="record a memory snapshot of a Python training run")
    p.add_argument("-o", "--output", default="gmlake-capture.pickle.gz")
    p.add_argument("--name", help="a name for the run, kept in the snapshot")
    p.add_argument("program", nargs=argparse.REMAINDER, help="-- python script.py args...")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("run", help="run a Python program with gmlake as PyTorch's CUDA allocator")
    p.add_argument("--policy", help="policy name (env GMLAKE_POLICY; default gmlake)")
    p.add_argument("--chunk-size", type=int, help="physical handle size in bytes (env GMLAKE_CHUNK_SIZE)")
    p.add_argument("--limit", type=int, help="cap on each device's memory in bytes (env GMLAKE_LIMIT)")
    p.add_argument("--max-cached-sblocks", type=int, help="env GMLAKE_MAX_CACHED_SBLOCKS")
    p.add_argument("--no-stitch", action="store_true", help="never stitch (env GMLAKE_STITCH=0)")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE",
                   help="any policy knob, e.g. min_saved_chunks=0 (repeatable; env GMLAKE_KNOBS=k=v,k=v)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="script.py args...  or  -m module args...")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("convert", help="convert a snapshot to the compact .gmtrace format")
    p.add_argument("snapshot")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--name")
    p.add_argument("--device", type=int)
    p.set_defaults(func=cmd_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the gmlake command; returns the exit status (2 for bad input)."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (UsageError, TraceError, ValueError) as exc:
        print(f"gmlake: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
