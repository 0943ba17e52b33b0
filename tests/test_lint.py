"""The Python sources pass ruff (the rules and settings in pyproject.toml), so a lint slip fails CI, not review."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_gmlake_bench_and_tests():
    pytest.importorskip("ruff", reason="ruff is in the test extras: pip install -e '.[test]'")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "gmlake", "bench", "tests"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
