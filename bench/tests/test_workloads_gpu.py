"""bench's training workloads on a GPU (skipped where no CUDA device exists)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import ROOT, child_env

pytestmark = pytest.mark.gpu


def test_the_workloads_time_their_kernels_under_gmlake_and_native(tmp_path):
    """Note [GPU time]: the profiler sees the kernels of the extra steps under gmlake as under native, so the suites'
    kernel-time column compares like with like."""
    out = {}
    for name, gmlake in (("native", False), ("gmlake", True)):
        path = tmp_path / f"{name}.json"
        cmd = [sys.executable, *(["-m", "gmlake", "run"] if gmlake else []), "-m", "bench.workloads.dynamic",
               "--workload", "cnn", "--size", "small", "--steps", "4", "--gpu-time-steps", "2", "--json", str(path)]
        proc = subprocess.run(cmd, capture_output=True, check=False, text=True, timeout=300, cwd=ROOT,
                              env=child_env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = json.loads(path.read_text())["gpu_time"]
    for name, steps in out.items():
        assert len(steps) == 2 and all("error" not in s and s["kernels"] > 10 and s["total_ms"] > 0 for s in steps), \
            (name, steps)
    # the same shapes launch the same kernels under either allocator (2 %: a library may pick another algorithm)
    for ours, theirs in zip(out["gmlake"], out["native"]):
        assert abs(ours["kernels"] - theirs["kernels"]) <= 0.02 * theirs["kernels"], (ours, theirs)
