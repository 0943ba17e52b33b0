"""What the document modules of bench.report_docs share: the generated sections' mark, reading a result record,
the prose helpers (numbers in words, ranges, paragraphs) and running a gmlake command as a terminal would."""
from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

from bench import RESULTS

GiB = 1 << 30
MiB = 1 << 20
MARK = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)


def _json(relative: str) -> dict | list:
    return json.loads((RESULTS / relative).read_text())


def _env_line(envs: list[dict]) -> str:
    dates = sorted(e.get("date", "?")[:10] for e in envs)
    span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    first = envs[0]
    return (f"{first.get('gpu', '?')} (driver {first.get('nvidia_driver', '?')}), torch {first.get('torch', '?')}, "
            f"{span}.")


def _runs_by_key(files: list[tuple[str, dict[str, str | None] | None]]) -> tuple[dict, list[dict]]:
    runs: dict[tuple[str, str], list[dict]] = {}
    envs = []
    for relative, relabel in files:
        data = _json(relative)
        envs.append(data["environment"])
        for run in data["runs"]:
            if run.get("returncode") != 0:
                continue
            label = run["allocator"] if relabel is None else relabel.get(run["allocator"])
            if label is not None:
                runs.setdefault((run["workload"], label), []).append(run)
    return runs, envs


def _fill(text: str, width: int, indent: str = "") -> str:
    """`text` as a paragraph (or a list item, with `indent`) of `width` columns; names keep their hyphens."""
    return textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def _pct(values: list[float]) -> str:
    """Percentages as the README writes them: one figure where the ends agree, tenths below 10 %."""
    lo, hi = min(values), max(values)
    digits = 1 if hi < 10 else 0
    a, b = f"{lo:.{digits}f}", f"{hi:.{digits}f}"
    return a if a == b else f"{a}-{b}"


def _span(values: list[float], digits: int) -> str:
    a, b = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return a if a == b else f"{a}-{b}"


def _less(ours: float, theirs: float) -> float:
    """How much less `ours` is than `theirs`, in % of theirs."""
    return 100 * (1 - ours / theirs)


_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
          10: "ten", 11: "eleven", 12: "twelve", 13: "thirteen"}


def _n(count: int) -> str:
    return _WORDS.get(count, str(count))


def _of(count: int, total: int) -> str:
    """"all eleven" or "ten of the eleven"."""
    return f"all {_n(total)}" if count == total else f"{_n(count)} of the {_n(total)}"


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + items[-1]


def _terminal(call: Callable[[], int | None], columns: int = 80, cwd: Path | None = None) -> tuple[int, str, str]:
    """`call()` run here as in a terminal of `columns`: its exit status, and what it wrote to stdout and stderr."""
    import contextlib
    import io
    import os

    out, err, before, here = io.StringIO(), io.StringIO(), os.environ.get("COLUMNS"), Path.cwd()
    os.environ["COLUMNS"] = str(columns)
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = call() or 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return rc, out.getvalue(), err.getvalue()


def _run_cli(args: list[str], columns: int = 80, cwd: Path | None = None) -> tuple[int, str, str]:
    """`gmlake ARGS` run here as a terminal of `columns` would: its exit status, stdout and stderr."""
    from gmlake.cli import main as gmlake_main

    return _terminal(lambda: gmlake_main(args), columns, cwd)
