"""Messages a new user meets first say what is wrong, in their terms: a CPU-only PyTorch, `capture -- python -c`, a
negative size, `--device` on a .gmtrace, a bare `gmlake`, a policy class without @dataclass, a policy module that
fails to import."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gmlake.cli import EXIT_BAD_INPUT, build_parser, main
from gmlake.torch import capture

TINY = "tests/data/tiny-gpt2-native.pickle.gz"


def one_error_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gmlake: error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.fixture
def cpu_torch(tmp_path) -> Path:
    """A stand-in for a CPU-only PyTorch build: a version, no CUDA, no CUDA allocator hooks in torch._C."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "__version__ = '2.13.0+cpu'\nfrom torch import version\nclass _C: pass\n"
        "class cuda:\n    @staticmethod\n    def is_initialized(): return False\n")
    (tmp_path / "torch" / "version.py").write_text("cuda = None\n")
    return tmp_path


def python(code: str, path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GMLAKE")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120,
                          env={**clean, "PYTHONPATH": str(path), **(env or {})})


def test_cpu_only_torch_under_gmlake_1_says_it_has_no_cuda(cpu_torch):
    """GMLAKE=1 reaching a CPU-only script is ignored, as PyTorch ignores expandable_segments without CUDA: one line."""
    proc = python("import torch", cpu_torch, {"GMLAKE": "1"})
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    last = lines[-1]
    assert "this PyTorch (2.13.0+cpu) has no CUDA" in last and "_cuda_customAllocator" not in proc.stderr
    assert "gmlake: gmlake:" not in last and "allocator: gmlake:" not in last


def test_cpu_only_torch_enable_says_it_has_no_cuda(cpu_torch):
    proc = python("import gmlake.torch\ntry:\n    gmlake.torch.enable()\nexcept RuntimeError as e:\n    print(e)",
                  cpu_torch)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("gmlake: cannot install gmlake as PyTorch's CUDA allocator: this PyTorch "
                                   "(2.13.0+cpu) has no CUDA (a CPU-only build); install a CUDA build of PyTorch")


def test_capture_takes_python_dash_c(tmp_path, monkeypatch):
    from gmlake.cli import job

    calls = []
    monkeypatch.setattr(job, "_torch_cuda_problem", lambda what: None)
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: calls.append(cmd) or 0)
    assert main(["capture", "-o", str(tmp_path / "c.pickle.gz"), "--", "python", "-c", "print(1)", "a"]) == 0
    assert calls[0][0] == sys.executable and calls[0][-3:] == ["-c", "print(1)", "a"]


def test_capture_runs_dash_c_code_as_python_does(tmp_path, monkeypatch):
    out = tmp_path / "ran.txt"
    monkeypatch.setattr(capture, "start", lambda: None)
    monkeypatch.setattr(capture.atexit, "register", lambda *a: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    capture.run(tmp_path / "c.pickle.gz", ["-c", f"import sys; open({str(out)!r}, 'w').write(repr(sys.argv))",
                                            "x"])
    assert out.read_text() == "['-c', 'x']"


def test_dash_c_without_code(tmp_path, capsys):
    assert main(["capture", "-o", str(tmp_path / "c.pickle.gz"), "--", "python", "-c"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "-c needs the code")


@pytest.mark.parametrize("flag, value, words", [
    ("--device-memory", "-5GiB", ["--device-memory", "at least 1 B", "-5GiB"]),
    ("--cap", "-1", ["--cap", "at least 1 B"]),
    ("--device-memory", "-0.5GiB", ["--device-memory", "-0.5GiB"]),
])
def test_a_negative_size_reaches_the_size_check(flag, value, words, capsys):
    assert main(["replay", TINY, flag, value]) == EXIT_BAD_INPUT
    err = one_error_line(capsys, *words)
    assert "expected one argument" not in err


def test_a_program_s_own_negative_arguments_are_left_alone():
    from gmlake.cli import _join_negative_values

    parser = build_parser()
    argv = ["run", "--limit", "-1", "--", "t.py", "--limit", "-1"]
    assert _join_negative_values(argv, parser) == ["run", "--limit=-1", "--", "t.py", "--limit", "-1"]


def test_device_on_a_gmtrace_is_refused(capsys):
    assert main(["replay", "opt350m-full-ckpt-native", "--device", "7"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "--device 7", "device 0's trace")
    assert main(["replay", "opt350m-full-ckpt-native", "--device", "0", "--policy", "caching", "--json"]) == 0


def test_bare_gmlake_lists_the_commands(capsys):
    assert main([]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    out = captured.out
    assert captured.err == "gmlake: error: name a command (listed above; gmlake COMMAND --help for one)\n"
    for command in ("replay", "explain", "compare", "tune", "traces", "capture", "run", "convert"):
        assert f"    {command} " in out, command


def test_a_policy_class_without_dataclass_is_told_to_decorate(tmp_path, capsys):
    (tmp_path / "mine.py").write_text("from typing import ClassVar\nfrom gmlake.policies import GMLakePolicy\n\n"
                                      "class Mine(GMLakePolicy):\n    name: ClassVar[str] = 'mine'\n"
                                      "    extra: int = 5\n")
    spec = f"{tmp_path / 'mine.py'}:Mine[extra=5]"
    assert main(["replay", TINY, "--policy", spec]) == EXIT_BAD_INPUT
    one_error_line(capsys, "Mine declares extra but is not a @dataclass(frozen=True)", "decorate the class")
    assert main(["replay", TINY, "--policy", f"{tmp_path / 'mine.py'}:Mine[name=x]"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "has no knob 'name'")                # a ClassVar is no knob, and nothing to decorate


@pytest.mark.parametrize("body, line, kind", [
    ("import os\n\nx = undefined_name + 1\n", 3, "NameError"),
    ("def f(:\n    pass\n", 1, "SyntaxError"),
    ("import os\n\n\ndef f():\n    raise RuntimeError('boom')\n\n\nf()\n", 5, "RuntimeError"),
])
def test_a_policy_module_that_fails_names_its_file_and_line(tmp_path, body, line, kind, capsys, monkeypatch):
    (tmp_path / "broken_policy_mod.py").write_text(body)
    assert main(["replay", TINY, "--policy", f"{tmp_path / 'broken_policy_mod.py'}:X"]) == EXIT_BAD_INPUT
    one_error_line(capsys, f"{kind} at {tmp_path / 'broken_policy_mod.py'}:{line}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "broken_policy_mod", raising=False)
    assert main(["replay", str(Path(__file__).parent.parent / TINY), "--policy", "broken_policy_mod:X"]) == \
        EXIT_BAD_INPUT
    one_error_line(capsys, "importing broken_policy_mod failed", f"{kind} at ", f"broken_policy_mod.py:{line}")
