"""Helpers of bench's tests."""
from __future__ import annotations

import subprocess
import sys

from bench import ROOT


def one_line_exit_2(cmd: list[str]) -> str:
    """Run `python CMD...` from the repository root and check it refused its input as every command here must: one
    line on stderr, nothing on stdout, exit status 2. Returns that line."""
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, check=False, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout, proc.stderr
    return proc.stderr
