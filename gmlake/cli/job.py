"""The commands that run a training program: `gmlake run` (gmlake as PyTorch's CUDA allocator) and `gmlake capture`
(record a memory snapshot of a run)."""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gmlake import policies
from gmlake.cli.common import EXIT_OK, UsageError, _output_file, _torch_cuda_problem


def _program(args, usage: str) -> list[str]:
    """The program to run, after an optional `--`."""
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        raise UsageError(f"nothing to run: {usage}")
    if program[0] == "-m" and len(program) < 2:
        raise UsageError(f"-m needs a module name: {usage}")
    return program


def _check_script(program: list[str]) -> None:
    """A program is `-m module args`, `-c code args` or `script.py args`; the script must exist."""
    if program[0] == "-c" and len(program) < 2:
        raise UsageError("-c needs the code to run, as python -c takes it")
    if program[0] not in ("-m", "-c") and not Path(program[0]).is_file():
        raise UsageError(f"no such script: {program[0]}")


def cmd_capture(args) -> int:
    """`gmlake capture`: run a Python program with allocator history on, then dump its snapshot. A bare `python`
    (or `python3`, ...) means this interpreter, the one gmlake is installed in; a path to a Python is honoured."""
    usage = "gmlake capture -o OUT -- python script.py args...  (or: -- python -m module args..., -- python -c CODE)"
    program = _program(args, usage)
    first = program[0]
    if first in ("-m", "-c") or first.endswith(".py"):
        python, rest = sys.executable, program
    elif Path(first).name.startswith("python"):
        python, rest = (first if os.sep in first else sys.executable), program[1:]
    else:
        raise UsageError(f"capture runs Python programs: {usage}")
    if not rest:
        raise UsageError(f"nothing to run: {usage}")
    if rest[0] == "-m" and len(rest) < 2:
        raise UsageError(f"-m needs a module name: {usage}")
    _check_script(rest)
    output = _output_file(args.output, "--output")
    if python == sys.executable:
        problem = _torch_cuda_problem("capture")
        if problem:
            raise UsageError(problem)
    cmd = [python, "-m", "gmlake.torch.capture", str(output)]
    if args.name:
        cmd += ["--name", args.name]
    cmd += ["--", *rest]
    try:
        return subprocess.call(cmd, env=os.environ.copy())
    except OSError as exc:
        raise UsageError(f"cannot start {python}: {exc.strerror or exc}") from None


def _run_policy(args) -> tuple[policies.PolicyChoice, int]:
    """The policy and per-device limit `gmlake run` installs: the GMLAKE_* environment, overridden by the flags
    (--policy, --chunk-size, --limit, --max-cached-sblocks, --no-stitch), then --set; checked for any driver, so an
    unknown policy or an unknown or ill-typed knob fails before the program runs."""
    # torch is optional: gmlake.torch (and torch) load only for a command that runs it
    from gmlake import torch as gtorch

    opts = gtorch.options_from_env()
    spec = args.policy if args.policy is not None else opts.get("policy", "gmlake")
    opts.pop("policy", None)
    limit = args.limit if args.limit is not None else opts.pop("limit", 0)
    opts.pop("limit", None)
    for flag in ("chunk_size", "max_cached_sblocks"):
        if getattr(args, flag) is not None:
            opts[flag] = getattr(args, flag)
    if args.no_stitch:
        opts["stitch"] = False
    (choice,) = policies.choose([spec], args.set or [], base_knobs=opts, granularity=1)
    return choice, limit


def cmd_run(args) -> int | Callable[[], int]:
    """`gmlake run`: check every setting, install gmlake as PyTorch's CUDA allocator, and return the program to run
    (main runs it outside gmlake's error handling: its errors are its own)."""
    # torch is optional: gmlake.torch (and torch) load only for a command that runs it
    from gmlake import torch as gtorch

    program = _program(args, "gmlake run script.py args...  (or: gmlake run -m module args...)")
    choice, limit = _run_policy(args)
    _check_script(program)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("gmlake run needs PyTorch, which is not installed here") from None
    problem = _torch_cuda_problem("run")
    if problem:
        raise UsageError(problem)
    gtorch.enable(choice, limit=limit)

    def run_program() -> int:
        if program[0] == "-m":
            sys.argv = program[1:]
            runpy.run_module(program[1], run_name="__main__", alter_sys=True)
        elif program[0] == "-c":
            sys.argv = ["-c", *program[2:]]
            exec(compile(program[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - python -c
        else:
            script = Path(program[0])
            sys.argv = program
            sys.path.insert(0, str(script.resolve().parent))
            runpy.run_path(str(script), run_name="__main__")
        return EXIT_OK

    return run_program
