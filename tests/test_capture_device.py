"""`gmlake capture` on a machine with a CUDA build of PyTorch but no usable device (no NVIDIA driver, no GPU visible):
one line saying so and exit status 2, before any program runs; the command-line fuzz test passes there too. A
stand-in torch module plays that machine's PyTorch."""
from __future__ import annotations

import contextlib
import io
import sys
import types

import pytest

from gmlake.cli import main
from gmlake.torch.capture import torch_cuda_problem


def cuda_build_of_torch(devices: int) -> types.ModuleType:
    """A PyTorch built with CUDA (it has CUDA's allocator entry points) that sees `devices` devices."""
    torch = types.ModuleType("torch")
    torch.__version__ = "2.13.0+cu128"
    torch.version = types.SimpleNamespace(cuda="12.8")
    torch._C = types.SimpleNamespace(_cuda_customAllocator=object())

    def is_available() -> bool:
        if not devices:
            import warnings

            warnings.warn("CUDA initialization: Found no NVIDIA driver on your system.", UserWarning, stacklevel=2)
        return devices > 0

    torch.cuda = types.SimpleNamespace(is_available=is_available, device_count=lambda: devices)
    return torch


@pytest.fixture
def no_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", cuda_build_of_torch(0))


def gmlake(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_capture_with_a_cuda_build_and_no_device_is_one_line_exit_2(no_device, tmp_path):
    for program in (["-m", "python"], ["python", "-m", "json.tool"]):
        status, out, err = gmlake("capture", "-o", str(tmp_path / "c.pickle.gz"), "--", *program)
        assert status == 2 and not out, err
        (line,) = err.strip().splitlines()
        assert line.startswith("gmlake: error: gmlake capture: no usable CUDA device") and "12.8" in line
    assert not list(tmp_path.iterdir())


def test_the_device_check_asks_for_a_device_only_where_one_is_needed(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", cuda_build_of_torch(0))
    assert torch_cuda_problem() is None                           # `gmlake run`: the program decides
    assert "no usable CUDA device" in torch_cuda_problem(device=True)
    monkeypatch.setitem(sys.modules, "torch", cuda_build_of_torch(1))
    assert torch_cuda_problem(device=True) is None


def test_command_line_fuzz_on_a_cuda_build_without_a_device(no_device):
    import test_cli_fuzz

    test_cli_fuzz.test_command_line_fuzz()
