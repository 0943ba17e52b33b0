"""Every table of the gmlake command fits an 80-column terminal by default, and 120: no column, header or caption
cut to an ellipsis, no line past the width; `--wide` shows every column, however wide. Run with COLUMNS set, as a
terminal of that width sets it (the command honours COLUMNS piped too)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "tiny-gpt2-native.pickle.gz")

COMMANDS = {
    "compare": ["compare", "--out", "{tmp}"],
    "compare-failed": ["compare", "gpt2l-lora-ckpt-native", "--device-memory", "12GiB", "--out", "{tmp}"],
    "compare-smallest-cap": ["compare", TINY, "--smallest-cap", "--jobs", "1", "--out", "{tmp}"],
    "replay": ["replay", "opt350m-full-ckpt-native"],
    "replay-smallest-cap": ["replay", TINY, "--smallest-cap"],
    "tune": ["tune", TINY, "--jobs", "2"],
    "tune-fit": ["tune", TINY, "--fit", "120MiB", "--jobs", "2"],
    "traces": ["traces"],
}
BOX = "│┃┏┗┡└┌├"


def gmlake(args: list[str], columns: int, tmp: Path) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    proc = subprocess.run([sys.executable, "-m", "gmlake", *(a.format(tmp=tmp) for a in args)], env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode in (0, 3), proc.stderr
    return proc.stdout


def table_lines(out: str) -> list[str]:
    """The table's lines: from its title to its caption (the lines a table prints before the recommendation)."""
    lines = out.splitlines()
    ends = [i for i, line in enumerate(lines) if line[:1] in "└"]
    return lines[:ends[-1] + 4] if ends else lines


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_table_fits_without_cropping(name, columns, tmp_path):
    out = gmlake(COMMANDS[name], columns, tmp_path)
    table = [line for line in table_lines(out) if not line.startswith(("wrote ", "recommended:", "  "))
             or line[:1] in BOX]
    assert any(line[:1] in BOX for line in table), out
    assert "…" not in out, out
    too_wide = [line for line in table if len(line) > columns]
    assert too_wide == [], "\n".join(too_wide)


def test_wide_shows_every_column_uncropped(tmp_path):
    out = gmlake(["replay", "opt350m-full-ckpt-native", "--wide"], 80, tmp_path)
    assert "…" not in out
    for header in ("int frag MiB", "ext@growth", "evictions", "re-backed", "driver calls", "time lost s"):
        assert header in out, header
    tune = gmlake(["tune", TINY, "--wide", "--jobs", "2"], 80, tmp_path)
    assert "…" not in tune and "stitches" in tune and "device" in tune


PIPED = {**COMMANDS, "explain": ["explain", TINY], "policies": ["policies"], "tune-big": ["tune", "opt1.3b-lora-native",
                                                                                            "--fit", "18.4GiB"]}


@pytest.mark.parametrize("name", list(PIPED))
def test_piped_output_fits_80_columns(name, tmp_path):
    """stdout not a terminal and no COLUMNS (a pipe, a file, CI): every line of the output fits 80 columns, the
    words and the commands to paste too (it used to be 89-96 columns wide, and the recommendation one line)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "gmlake", *(a.format(tmp=tmp_path) for a in PIPED[name])], env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode in (0, 3), proc.stderr
    too_wide = [line for line in proc.stdout.splitlines() if len(line) > 80]
    assert proc.stdout and too_wide == [], "\n".join(too_wide)
