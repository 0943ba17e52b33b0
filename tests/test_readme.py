"""README.md as a newcomer reads it: short, gmlake turned on early, no lab notebook in it or in docs/, and its custom
policy runs as written."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}


def test_the_readme_is_short_and_turns_gmlake_on_within_its_first_60_lines():
    lines = README.splitlines()
    assert len(lines) <= 250
    first = "\n".join(lines[:60])
    assert all(way in first for way in ("GMLAKE=1", "gmlake run", "gmlake.torch.enable()"))


@pytest.mark.parametrize("name", sorted(DOCS))
def test_no_diary_entry_commit_hash_or_issue_number(name):
    """Docs are a manual: history lives in git. (A hash: 7-12 hex digits with a digit and a letter, in backticks,
    after `code`/`commit`/`at`, or alone in parentheses.)"""
    text = DOCS[name]
    assert not re.search(r"\b[Ss]ession \d+", text)
    assert not re.search(r"\b[Ii]ssue \d+", text)
    hashes = re.findall(r"(?:code|commit|at|\(|`)\s*([0-9a-f]{7,12})\b", text)
    assert not [h for h in hashes if re.search(r"[a-f]", h) and re.search(r"\d", h)]


def test_the_readmes_custom_policy_replays_as_written(tmp_path):
    """The README's policy file, copied out as it stands, and its compare command on one bundled trace."""
    block = re.search(r"```python\n# my_policies.py\n(.*?)```", README, re.DOTALL)
    assert block, "the README's custom policy block"
    (tmp_path / "my_policies.py").write_text(block.group(1))
    command = re.search(r"^gmlake compare --policy gmlake --policy '([^']+)'", README, re.MULTILINE)
    assert command, "the README's compare command for it"
    proc = subprocess.run([sys.executable, "-m", "gmlake", "compare", "opt1.3b-lora-native", "--policy", "gmlake",
                           "--policy", command.group(1), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, check=False, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = (tmp_path / "out" / "compare.jsonl").read_text().splitlines()
    rows = {row["policy"]: row for row in map(json.loads, lines)}
    mine = rows["no-small-stitches(threshold=1GiB)"]
    assert mine["stitches"] < rows["gmlake"]["stitches"]       # the veto changed what the default would stitch
