"""What every command of the `gmlake` command line shares: exit statuses, the one-line error, argument types, output
files and the terminal."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gmlake import policies
from gmlake.policies.settings import KNOBS_VARIABLE, env_knobs, parse_size
from gmlake.sim import MAX_DEVICE_MEMORY

EXIT_OK = 0


EXIT_INTERNAL_ERROR = 1


EXIT_BAD_INPUT = 2


EXIT_OUT_OF_MEMORY = 3


EXIT_INTERRUPTED = 130


# What `pip install 'gmlake[sim]'` adds (pyproject.toml): the replay and analysis commands need it, `run` does not.
SIM_EXTRA = ("numpy", "matplotlib")


_POLICY_NAMES = ", ".join(policies.names())


_INSTALLED = ", ".join(sorted(policies.installed()))


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(message)


def error_line(exc: BaseException) -> str:
    """The one line of stderr that reports `exc`: its message without a leading 'gmlake: ' (the line adds its own)
    and on one line; for an OSError, the file and the reason."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    while text.startswith("gmlake: "):
        text = text[len("gmlake: "):]
    return text


def _size_type(what: str, minimum: int, maximum: int = (1 << 63) - 1,
               round_down: bool = False) -> Callable[[str], int]:
    """An argparse type: a byte size with optional unit (80GiB), in [minimum, maximum]. Argparse names the flag."""
    def parse(text: str) -> int:
        try:
            return parse_size(text, what=what, minimum=minimum, maximum=maximum, round_down=round_down)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _event_lag(text: str) -> int:
    """An argparse type: requests between an event's recording and its completion (Note [Event lag in replay])."""
    try:
        lag = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"event lag must be a whole number of requests, got {text!r}") from None
    if lag < 0:
        raise argparse.ArgumentTypeError(f"event lag must be 0 or more requests, got {text!r}")
    return min(lag, (1 << 63) - 1)      # any lag past the trace's length means "never"


_device_memory = _size_type("device memory", 1, MAX_DEVICE_MEMORY, round_down=True)   # 5.58GiB: about that


_cap = _size_type("a memory cap", 1, MAX_DEVICE_MEMORY, round_down=True)


_byte_count = _size_type("size", 0)


def _count(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    try:
        value = int(text.replace("_", "")) if len(text) <= 30 else -1
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def _env_knobs(specs: list[str]) -> list[dict[str, str]]:
    """GMLAKE_KNOBS, read as `GMLAKE=1` and `gmlake run` read it (env_knobs), for each of `specs` the knobs that mean
    something to that policy. A job exports the variable for the one policy it runs (GMLAKE_KNOBS=tail_page=2MiB for
    gmlake), while compare and replay run several: a knob that one of them refuses but another accepts is left out
    for that one, and one line on stderr says where it was not applied. A knob that none of them accepts (unknown,
    a bad value, or meaningless to each) is an error naming the variable, never a replay that quietly keeps the
    default."""
    knobs = env_knobs()
    if not knobs:
        return [{} for _ in specs]

    def takes(spec: str, name: str) -> str | None:
        try:
            policies.resolve(spec, {name: knobs[name]})
        except ValueError as exc:
            return error_line(exc)
        return None

    per_spec: list[dict[str, str]] = [{} for _ in specs]
    skipped: dict[str, list[str]] = {}
    for name, value in knobs.items():
        refusals = [takes(spec, name) for spec in specs]
        if all(refusals):
            raise ValueError(f"{KNOBS_VARIABLE}={os.environ[KNOBS_VARIABLE]}: {refusals[0]}")
        for kept, spec, refusal in zip(per_spec, specs, refusals):
            if refusal:
                skipped.setdefault(f"{name}={value}", []).append(spec)
            else:
                kept[name] = value
    if skipped:
        where = "; ".join(f"{knob} not applied to {', '.join(names)}" for knob, names in skipped.items())
        print(f"gmlake: {KNOBS_VARIABLE}: {where} (no effect there)", file=sys.stderr)
    return per_spec


def _policy_choices(specs: list[str] | None, settings: list[str] | None) -> list[policies.PolicyChoice]:
    """The chosen policies (default: every built-in one), each with GMLAKE_KNOBS (where it applies), then its --set
    knobs, then its inline knobs, validated."""
    specs = specs or policies.names()
    knobs = _env_knobs(specs)
    try:
        return policies.choose(specs, settings or [], base_knobs=knobs)
    except ValueError as exc:
        if not any(knobs):
            raise
        policies.choose(specs, settings or [])    # fails alike without GMLAKE_KNOBS: not the variable's fault
        raise ValueError(f"{KNOBS_VARIABLE}={os.environ[KNOBS_VARIABLE]}: {error_line(exc)}") from None


def _writable_folder(folder: Path, path: str, flag: str) -> None:
    """`folder`, where `path` (given to `flag`) is to be written, exists as a folder this process may write in."""
    if not folder.exists():
        raise UsageError(f"{flag} {path}: no such directory {str(folder)!r}")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: {str(folder)!r} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write in {str(folder)!r}: permission denied")


def _output_file(path: str, flag: str) -> Path:
    """An output file that can be created: its folder exists and may be written in, and it is not a folder itself.
    Checked before any work, so a bad path costs nothing."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    _writable_folder(out.parent, path, flag)
    return out


def _output_dir(path: str, flag: str) -> Path:
    """An output folder that exists, or that can be created in a folder that does (one level, as mkdir makes it: a
    missing folder above it is more likely a typo than a wish), and may be written in. Checked before any work."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {path}: {str(out)!r} is a file, not a folder")
    _writable_folder(out if out.exists() else out.parent, path, flag)
    return out


def _console(piped_width: int = 80, wide: bool = False):
    """The console tables print to: the terminal's width (or room for every column, `wide`); piped, `piped_width`
    unless COLUMNS is set."""
    # rich loads only when output is drawn, so importing this module stays light
    from rich.console import Console

    if wide:
        return Console(width=1000)
    # COLUMNS, where set, is the width asked for, piped too (rich reads it).
    return Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=piped_width)


def _write_atomically(files: dict[Path, Callable[[Path], object]]) -> None:
    """Write each file through `write(tmp_path)` to a temporary name, then rename them all; on failure remove the
    temporary files, so nothing is half-written."""
    tmps = {path: path.with_name(path.name + ".tmp") for path in files}
    try:
        for path, write in files.items():
            write(tmps[path])
        for path, tmp in tmps.items():
            tmp.replace(path)
    except BaseException:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        raise


def _torch_cuda_problem(what: str) -> str | None:
    """Why this interpreter's PyTorch cannot serve `gmlake {what}`, or None. `capture` records a run, so it also
    needs a usable device; `run` does not (the program decides what it does without one)."""
    # torch is optional (import gmlake stays light without it): loaded on first use
    from gmlake.torch.capture import torch_cuda_problem

    problem = torch_cuda_problem(device=what == "capture")
    return f"gmlake {what}: {problem}" if problem else None
