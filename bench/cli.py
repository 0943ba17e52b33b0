"""The command-line parts every bench command shares: one-line errors and the common argument types."""
from __future__ import annotations

import argparse
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


def cell(value, fmt: str, unit: str = "") -> str:
    """A table's cell: `value` formatted by `fmt`, then `unit` ("x", "%"), or "-" where there is no value."""
    return "-" if value is None else format(value, fmt) + unit


def render_table(title: str, columns: list[str], rows: list, left: tuple[str, ...] = (),
                 no_wrap: tuple[str, ...] = (), width: int = 200, borders: bool = True) -> str:
    """A result table as text: rich's, `width` columns wide, where rich is installed (`left` columns flush left, the
    rest right; `no_wrap` never folded; `borders=False`: columns two spaces apart, no lines), else one plain line a
    row."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:             # plain text where rich is missing
        return "\n".join([title, *("  ".join(row) for row in [columns, *rows])])
    table = Table(title=title) if borders else Table(title=title, box=None)
    for name in columns:
        table.add_column(name, justify="left" if name in left else "right", no_wrap=name in no_wrap)
    for row in rows:
        table.add_row(*row)
    console = Console(width=width, record=True)
    with console.capture() as captured:
        console.print(table)
    return "".join(line.rstrip() + "\n" for line in captured.get().splitlines())
