"""The command-line parts every bench command shares: one-line errors and the common argument types."""
from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr, `PROG: message`, and exit status 2, not argparse's usage block:
    a bad command line to a benchmark reads as clearly as one to `gmlake` itself."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def parser(prog: str, doc: str | None, **kwargs) -> OneLineParser:
    """The parser of the bench command `prog` ("bench micro"), described by the first paragraph of `doc`."""
    first = (doc or "").strip().split("\n\n")[0]
    return OneLineParser(prog=prog, description=" ".join(first.split()), **kwargs)


def error_line(exc: BaseException) -> str:
    """One line that reports `exc`: for an OSError the file and the reason, else its message on one line."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def json_object(text: str | bytes, where: str, what: str = "a JSON object") -> dict:
    """The JSON object in `text`; ValueError (not JSON) or TypeError (not an object: not `what`) naming `where`."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{where}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise TypeError(f"{where}: not {what} (a JSON {type(data).__name__})")
    return data


def add_run_options(parser: argparse.ArgumentParser, steps: int, size: str | None = "full") -> None:
    """How each workload run goes (steps, warm-up, seed, the dynamic workloads' model size) and the deadline: the
    options bench speed, cap search and cap time share; `check_run_options` checks them. `size` None: chosen by
    the device (full on cuda, small on cpu)."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, help="steps not timed (default: the first quarter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=("full", "small"), default=size, help="the dynamic workloads' models")
    parser.add_argument("--deadline", type=float, default=0, help="seconds from the start: start no run that would "
                        "likely end after it, and stop one still running at it (0: none)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one run may take")


def check_run_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad run options in one line (exit 2), and fill in the default warm-up."""
    args.warmup = args.steps // 4 if args.warmup is None else args.warmup
    if args.steps < 1 or not 0 <= args.warmup < args.steps:
        parser.error("need --steps >= 1 and 0 <= --warmup < --steps")
    if not args.deadline >= 0 or not args.timeout > 0:
        parser.error("need --deadline >= 0 and --timeout > 0")


def cell(value, fmt: str, unit: str = "") -> str:
    """A table's cell: `value` formatted by `fmt`, then `unit` ("x", "%"), or "-" where there is no value."""
    return "-" if value is None else format(value, fmt) + unit


def render_table(title: str, columns: list[str], rows: list, left: tuple[str, ...] = (),
                 no_wrap: tuple[str, ...] = (), width: int = 200, borders: bool = True,
                 fold: tuple[str, ...] = ()) -> str:
    """A result table as text: rich's, `width` columns wide, where rich is installed (`left` columns flush left, the
    rest right; `no_wrap` never folded; `fold` folded anywhere rather than cut short; `borders=False`: columns two
    spaces apart, no lines), else one plain line a row."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:             # plain text where rich is missing
        return "\n".join([title, *("  ".join(row) for row in [columns, *rows])])
    table = Table(title=title) if borders else Table(title=title, box=None)
    for name in columns:
        table.add_column(name, justify="left" if name in left else "right", no_wrap=name in no_wrap,
                         overflow="fold" if name in fold else "ellipsis")
    for row in rows:
        table.add_row(*row)
    console = Console(width=width, record=True)
    with console.capture() as captured:
        console.print(table)
    return "".join(line.rstrip() + "\n" for line in captured.get().splitlines())
