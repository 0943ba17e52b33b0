"""Small things a newcomer meets: an unknown trace name, and the unit of a custom policy's size knob."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import one_line_exit_2


def test_an_unknown_trace_name_says_so_and_hints_gmlake_traces():
    line = one_line_exit_2(["-m", "gmlake", "replay", "no-such-trace"])
    assert "no trace file or bundled trace named 'no-such-trace'" in line and "gmlake traces" in line
    line = one_line_exit_2(["-m", "gmlake", "compare", "gpt2l-lora-ckpt-native", "gpt2l"])
    assert "'gpt2l'" in line and "gmlake traces" in line


def test_a_missing_trace_file_by_path_names_the_file():
    line = one_line_exit_2(["-m", "gmlake", "replay", "no/such/run.pickle.gz"])
    assert "no/such/run.pickle.gz" in line and "no such file" in line


POLICY = '''
from dataclasses import dataclass
from gmlake.policies import GMLakePolicy
from gmlake.policies.base import knob


@dataclass(frozen=True)
class Sized(GMLakePolicy):
    max_piece: int = knob(64 << 20, unit="bytes")
    max_pieces: int = 67108864
'''


def test_a_custom_size_knob_shows_with_its_unit_by_its_declaration(tmp_path: Path):
    (tmp_path / "sized.py").write_text(POLICY)
    proc = subprocess.run([sys.executable, "-m", "gmlake", "policies", "sized.py:Sized"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"max_piece\s*│\s*64MiB\s*│\s*bytes", proc.stdout), proc.stdout
    # Declared a plain int: a count, whatever its value.
    assert re.search(r"max_pieces\s*│\s*67108864\s*│\s*count\s*│", proc.stdout), proc.stdout
