"""torch.cuda's memory API under gmlake, and GMLAKE=1 under real launchers (skipped where no CUDA device exists).

Each scenario is a script in tests/gpu_scripts/ that prints PASS/FAIL lines and runs in its own processes.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SCRIPTS = Path(__file__).parent / "gpu_scripts"
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def run(cmd: list[str], *, gmlake: bool, timeout: int = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GMLAKE"}
    env.update(PYTHONUNBUFFERED="1", **NCCL_ENV, **({"GMLAKE": "1"} if gmlake else {}))
    proc = subprocess.run(cmd, capture_output=True, check=False, text=True, timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, f"{cmd} failed ({proc.returncode}):\n{output[-6000:]}"
    return proc.stdout


def gpus(most: int = 2) -> int:
    import torch

    return min(most, torch.cuda.device_count())


def test_memory_api_answers_with_torchs_keys_under_gmlake(tmp_path):
    native = run([sys.executable, str(SCRIPTS / "memory_api.py"), str(tmp_path / "native")], gmlake=False)
    ours = run([sys.executable, str(SCRIPTS / "memory_api.py"), str(tmp_path / "gmlake")], gmlake=True)
    native_result = json.loads(native.strip().splitlines()[-2])
    our_result = json.loads(ours.strip().splitlines()[-2])
    assert native_result["allocator"] == "native" and our_result["allocator"] == "gmlake"
    assert our_result["keys"] == native_result["keys"]
    assert "PASS the 100 MiB tensor was stitched" in ours


def test_memory_api_under_gmlake_run(tmp_path):
    out = run([sys.executable, "-m", "gmlake", "run", str(SCRIPTS / "memory_api.py"), str(tmp_path)], gmlake=False)
    assert "allocator: gmlake" in out and out.strip().endswith("ALL PASS")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_hf_trainer_with_memory_metrics_under_gmlake():
    out = run([sys.executable, str(SCRIPTS / "hf_trainer_memory_metrics.py")], gmlake=True)
    assert "allocator: gmlake" in out and "PASS gmlake served the run" in out


def test_gmlake_env_var_under_torchrun():
    n = gpus()
    out = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
               str(SCRIPTS / "env_train.py")], gmlake=True)
    assert out.count(": gmlake served this rank's allocations") == n, out


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
def test_gmlake_env_var_under_accelerate_launch():
    n = gpus()
    multi = ["--multi_gpu"] if n > 1 else []
    out = run([sys.executable, "-m", "accelerate.commands.launch", *multi, "--num_processes", str(n),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               str(SCRIPTS / "env_train.py")], gmlake=True)
    assert out.count(": gmlake served this rank's allocations") == n, out


def test_without_the_env_var_torch_keeps_its_own_allocator():
    code = "import torch; torch.zeros(1, device='cuda'); import gmlake.torch as g; print('enabled', g.is_enabled())"
    out = run([sys.executable, "-c", code], gmlake=False)
    assert "enabled False" in out
