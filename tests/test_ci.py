"""CI (.ci/run) runs exactly README's two commands, install and test, and then checks the package as an index
would serve it: `python -m build` (the wheel built from the sdist), the wheel's tag, and the tests against that
wheel installed in a fresh venv."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = (ROOT / ".ci" / "run").read_text()
README = (ROOT / "README.md").read_text()


def _block_after(heading: str) -> str:
    section = README.split(f"## {heading}\n", 1)[1]
    return re.search(r"```\n(.*?)```", section, flags=re.DOTALL).group(1).strip()


def test_ci_runs_the_readmes_install_and_test_commands_as_written():
    lines = [line.strip() for line in CI.splitlines()]
    install, test = _block_after("Install"), _block_after("Tests")
    assert install in lines and test in lines
    assert lines.index(install) < lines.index(test)


def test_ci_builds_the_wheel_from_the_sdist_and_tests_it_in_a_fresh_venv():
    after = CI.split(_block_after("Tests"), 1)[1]
    build = after.index("python -m build")
    assert "--sdist" not in after[build:build + 60] and "--wheel" not in after[build:build + 60]  # both, wheel from sdist
    assert "-m venv" in after[build:] and '$wheel[test]' in after[build:]
    assert "tar -xzf dist/gmlake-*.tar.gz" in after and re.search(r'\$scratch/venv/bin/pytest', after)
    assert '-"$tag"-"$tag"-linux_' in after       # the wheel names the Python and ABI it was built for
