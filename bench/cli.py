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

