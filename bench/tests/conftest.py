"""Fixtures of bench's own tests. bench is lab tooling run from a checkout; these tests import it from there (the
repository root is on pytest's pythonpath), while gmlake's product tests under tests/ import nothing of it."""
from __future__ import annotations

import functools
import subprocess
import sys

import pytest

import gmlake
from bench import ROOT


@functools.lru_cache(maxsize=1)
def _cuda_ok() -> bool:
    return gmlake.cuda_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="no CUDA device here")
    for item in items:
        if "gpu" in item.keywords and item.path.is_relative_to(ROOT / "bench"):
            item.add_marker(skip)


def one_line_exit_2(cmd: list[str]) -> str:
    """Run `python CMD...` from the repository root and check it refused its input as every command here must: one
    line on stderr, nothing on stdout, exit status 2. Returns that line."""
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, check=False, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout, proc.stderr
    return proc.stderr
