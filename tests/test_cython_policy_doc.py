"""docs/policies.md's Cython path runs as written: its files (the seam's .pyx, the build script, the policy file)
written to one folder, its commands run there; the policy file imports the module built beside it, as a script
would (`--policy FILE.py:Class` puts the file's folder first on sys.path)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "policies.md"
SECTION = DOC.read_text().split("## The Cython path", 1)[1].split("\n## ", 1)[0]
FILES = dict(re.findall(r"```(?:python|cython)\n# ([\w.]+)\n(.*?)```", SECTION, flags=re.DOTALL))
(COMMANDS,) = re.findall(r"```\n(python build_seams.py\n.*?)```", SECTION, flags=re.DOTALL)


def test_the_section_has_the_three_files_and_the_commands():
    assert set(FILES) == {"my_seams.pyx", "build_seams.py", "my_policy.py"}
    assert "my_policy.py:NeverSplitLarge" in COMMANDS


def test_the_cython_policy_runs_as_written(tmp_path):
    pytest.importorskip("Cython")
    for name, text in FILES.items():
        (tmp_path / name).write_text(f"# {name}\n{text}")
    bin_dir = str(Path(sys.executable).parent)          # this environment's python and gmlake
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env.pop("PYTHONPATH", None)
    outputs = []
    for line in COMMANDS.strip().splitlines():
        proc = subprocess.run(shlex.split(line), cwd=tmp_path, env=env, capture_output=True, text=True,
                              check=False, timeout=600)
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    table = outputs[-1]
    assert "NeverSplitLarge" in table and "gmlake" in table


def test_a_policy_file_imports_a_module_beside_it_from_another_folder(tmp_path):
    """Run from elsewhere, by path: the file's folder comes first on sys.path, not the current folder's."""
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "helper.py").write_text("PIECES = 2\n")
    (folder / "pol.py").write_text("from dataclasses import dataclass\nimport helper\n"
                                   "from gmlake.policies import GMLakePolicy\n\n\n@dataclass(frozen=True)\n"
                                   "class P(GMLakePolicy):\n    min_saved_chunks: int = helper.PIECES\n")
    (tmp_path / "helper.py").write_text("raise ImportError('the current folder came first')\n")
    proc = subprocess.run([sys.executable, "-m", "gmlake", "policies", "policies/pol.py:P"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"min_saved_chunks\s*│\s*2\b", proc.stdout), proc.stdout
