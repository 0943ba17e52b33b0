"""A bad GMLAKE* setting is refused at start-up, before the program runs, as the gmlake command refuses bad input:
one line on stderr naming the variable and what it accepts, exit status 2; GMLAKE_TRACEBACK=1 adds the traceback.
These need no torch: the check runs from gmlake_autoload.pth in every Python process that GMLAKE=1 is set for."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GMLAKE")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, check=False, text=True, timeout=120,
                          env={**clean, **env})


# (environment, what the line must say: the variable, and words of what it accepts)
BAD = [
    ({"GMLAKE": "maybe"}, ["GMLAKE='maybe'", "use 1 to turn gmlake on, 0 or unset for off"]),
    ({"GMLAKE": "1", "GMLAKE_KNOBS": "nosuch=1"}, ["GMLAKE_KNOBS=nosuch=1", "no knob 'nosuch'", "min_saved_chunks"]),
    ({"GMLAKE": "1", "GMLAKE_KNOBS": "stitch"}, ["GMLAKE_KNOBS=stitch", "knob=value"]),
    ({"GMLAKE": "1", "GMLAKE_KNOBS": "chunk_size=abc"}, ["GMLAKE_KNOBS=chunk_size=abc", "whole number", "MiB"]),
    ({"GMLAKE": "1", "GMLAKE_KNOBS": "chunk_size=8MiB"}, ["GMLAKE_KNOBS=chunk_size=8MiB", "does nothing",
                                                         "expandable_page_large"]),
    ({"GMLAKE": "1", "GMLAKE_LIMIT": "abc"}, ["GMLAKE_LIMIT", "whole number", "80GiB"]),
    ({"GMLAKE": "1", "GMLAKE_LIMIT": "-1GiB"}, ["GMLAKE_LIMIT"]),
    ({"GMLAKE": "1", "GMLAKE_STITCH": "maybe"}, ["GMLAKE_STITCH", "true/1/yes/on or false/0/no/off"]),
    ({"GMLAKE": "1", "GMLAKE_POLICY": "nosuch"}, ["GMLAKE_POLICY=nosuch", "gmlake, gmlake-paper, caching"]),
    ({"GMLAKE": "1", "GMLAKE_POLICY": "gmlake[nosuch=1]"}, ["GMLAKE_POLICY=gmlake[nosuch=1]", "no knob 'nosuch'"]),
    ({"GMLAKE": "on", "GMLAKE_CHUNK_SIZE": "lots"}, ["GMLAKE_CHUNK_SIZE", "whole number"]),
    ({"GMLAKE": "1", "GMLAKE_MAX_CACHED_SBLOCKS": "many"}, ["GMLAKE_MAX_CACHED_SBLOCKS", "whole number"]),
    ({"GMLAKE": "1", "GMLAKE_IPC": "yes"}, ["GMLAKE_IPC must be 0 or 1", "not 'yes'"]),
]


@pytest.mark.parametrize(("env", "words"), BAD, ids=[" ".join(f"{k}={v}" for k, v in e.items()) for e, _ in BAD])
def test_a_bad_setting_is_one_line_and_status_2_before_the_program_runs(env, words):
    proc = python("print('the program ran')", env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""                      # before the program
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gmlake: error: "), proc.stderr
    assert [w for w in words if w not in lines[0]] == [], lines[0]


def test_traceback_on_request():
    proc = python("pass", {"GMLAKE": "1", "GMLAKE_LIMIT": "abc", "GMLAKE_TRACEBACK": "1"})
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("gmlake: error: GMLAKE_LIMIT")


@pytest.mark.parametrize("env", [{"GMLAKE": "1"}, {"GMLAKE": "0", "GMLAKE_LIMIT": "abc"},
                                 {"GMLAKE": "1", "GMLAKE_POLICY": "caching", "GMLAKE_LIMIT": "24GiB"},
                                 {"GMLAKE": "1", "GMLAKE_KNOBS": "min_saved_chunks=0,expandable_page_large=8MiB"},
                                 {"GMLAKE": "1", "GMLAKE_POLICY": "gmlake-paper", "GMLAKE_CHUNK_SIZE": "8MiB"},
                                 {"GMLAKE": "1", "GMLAKE_IPC": "1"}])
def test_good_settings_and_gmlake_off_run_the_program(env):
    proc = python("print('the program ran')", env)
    assert proc.returncode == 0 and proc.stdout == "the program ran\n" and proc.stderr == "", proc.stderr


def test_a_policy_file_is_not_run_at_start_up(tmp_path):
    """A module:Class or file.py:Class policy is the user's code: it runs when torch is imported, not in every
    process GMLAKE=1 reaches; its knobs are parsed (as text) at start-up, and typed by it then."""
    policy = tmp_path / "pol.py"
    policy.write_text("print('policy file ran')\n")
    proc = python("print('the program ran')", {"GMLAKE": "1", "GMLAKE_POLICY": f"{policy}:P"})
    assert proc.returncode == 0 and proc.stdout == "the program ran\n", proc.stderr
    bad = python("pass", {"GMLAKE": "1", "GMLAKE_POLICY": f"{policy}:P", "GMLAKE_KNOBS": "k"})
    assert bad.returncode == 2 and "GMLAKE_KNOBS=k" in bad.stderr and "policy file ran" not in bad.stdout


def test_torch_is_not_imported_by_the_check():
    proc = python("import sys; print('torch' in sys.modules)", {"GMLAKE": "1"})
    assert proc.returncode == 0 and proc.stdout == "False\n", proc.stderr
