"""GMLAKE=1 turns gmlake on at `import torch`, through gmlake_autoload.pth in site-packages; unset, it costs nothing.

These run on the CPU (a stand-in `torch` package shows when the hook fires); the real runs under torchrun and
accelerate launch are in tests/test_torch_api_gpu.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

PTH = Path(sysconfig.get_path("purelib")) / "gmlake_autoload.pth"


def python(code: str, env: dict | None = None, extra_path: Path | None = None, importtime: bool = False):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GMLAKE")}
    if extra_path is not None:
        clean["PYTHONPATH"] = str(extra_path)
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", code]
    return subprocess.run(cmd, capture_output=True, check=False, text=True, timeout=120, env={**clean, **(env or {})})


@pytest.fixture
def fake_torch(tmp_path) -> Path:
    """A `torch` that only says when its module body runs (the hook must fire after it)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("print('torch body ran', flush=True)\n")
    return tmp_path


def test_the_pth_is_installed_in_site_packages():
    assert PTH.is_file(), f"{PTH} is missing: reinstall gmlake (pip install -e .)"
    source = Path(__file__).parents[1] / "gmlake" / "gmlake_autoload.pth"
    if source.is_file():        # run from a checkout; from an unpacked sdist against the wheel (.ci/run) there is none
        assert PTH.read_text() == source.read_text()


def test_unset_imports_nothing():
    proc = python("import sys; print(sorted(m for m in sys.modules if m.startswith(('gmlake', 'torch'))))",
                  importtime=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]"
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert imported and not [m for m in imported if m.split(".")[0] in ("gmlake", "torch")]   # every import, listed


@pytest.mark.parametrize("value", ["0", "off", "false", ""])
def test_off_values_leave_torch_alone(value, fake_torch):
    proc = python("import torch, sys; print('hooked', any(type(f).__name__ == '_EnableAfterTorch' "
                  "for f in sys.meta_path))", env={"GMLAKE": value}, extra_path=fake_torch)
    assert proc.returncode == 0 and "hooked False" in proc.stdout, proc.stderr


def test_set_waits_for_torch_and_imports_no_torch_early():
    proc = python("import sys; print('torch' in sys.modules, [type(f).__name__ for f in sys.meta_path][0])",
                  env={"GMLAKE": "1"})
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "_EnableAfterTorch"], proc.stderr


def test_failure_to_install_fails_the_torch_import_loudly(fake_torch):
    # A policy file is loaded when torch is (its code runs then, not at start-up), so a missing one fails there.
    proc = python("import torch", env={"GMLAKE": "1", "GMLAKE_POLICY": "no_such_dir/policy.py:Policy"},
                  extra_path=fake_torch)
    assert proc.returncode != 0
    assert proc.stdout.startswith("torch body ran")       # the hook fired after torch's own module ran
    assert "GMLAKE=1 is set, but gmlake could not be installed" in proc.stderr and "no_such_dir" in proc.stderr


def test_a_value_that_is_neither_on_nor_off_is_an_error(fake_torch):
    # Refused at start-up (tests/test_autoload_errors.py), in programs with torch and without.
    for code in ("import torch", "print('ok')"):
        proc = python(code, env={"GMLAKE": "yes please"}, extra_path=fake_torch)
        assert proc.returncode == 2 and "use 1 to turn gmlake on" in proc.stderr and proc.stdout == ""


def test_processes_without_torch_run_normally():
    proc = python("print(sum(range(10)))", env={"GMLAKE": "1"})
    assert proc.returncode == 0 and proc.stdout == "45\n" and proc.stderr == ""


@pytest.mark.parametrize("torch_version", ["2.13.0+cpu", "2.11.0"])
def test_a_cpu_only_torch_runs_the_script_with_one_line(tmp_path, torch_version):
    """GMLAKE=1 carried into a CPU-only script: a build without CUDA has no allocator to replace, so the script runs
    (see Note [GMLAKE=1 with a CPU-only PyTorch]), with at most one line on stderr and nothing on stdout from gmlake."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"__version__ = {torch_version!r}\nclass version:\n    cuda = None\n    hip = None\n"
        "def zeros(n):\n    return [0.0] * n\n")
    proc = python("import torch; print(torch.zeros(1))", env={"GMLAKE": "1"}, extra_path=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "[0.0]\n", proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "GMLAKE=1 ignored" in lines[0] and torch_version in lines[0], proc.stderr


def test_a_cpu_only_torch_still_refuses_a_bad_setting(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("__version__ = '2.13.0+cpu'\nclass version:\n    cuda = None\n")
    proc = python("import torch", env={"GMLAKE": "1", "GMLAKE_POLICY": "no_such_dir/policy.py:Policy"},
                  extra_path=tmp_path)
    assert proc.returncode != 0 and "no_such_dir" in proc.stderr


def test_the_real_cpu_only_torch_runs_with_gmlake_set():
    """CI's second run installs a CPU build of PyTorch: `import torch` with GMLAKE=1 works there."""
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed")
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of PyTorch: gmlake installs there (tests/test_torch_api_gpu.py)")
    proc = python("import torch; print(float(torch.zeros(1).sum()))", env={"GMLAKE": "1"})
    assert proc.returncode == 0 and proc.stdout == "0.0\n", proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "ignored" in proc.stderr
