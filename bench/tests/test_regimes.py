"""bench report regimes (no torch, no GPU): which probe tracks the slow steps, on runs made up to have one answer."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from bench import ROOT, regimes


def suite_json(tmp_path: Path) -> Path:
    """Three runs of one workload, 16 steps of the same shapes; the launch path is slow in the second half of run 1
    and step times follow it, while the GPU clock and the host CPU only jitter."""
    rng = random.Random(0)
    shapes = [rng.uniform(0.2, 0.5) for _ in range(16)]
    runs = []
    for i, allocator in enumerate(("native", "expandable", "gmlake")):
        steps = []
        for k, base in enumerate(shapes):
            launch = 2.0 if i == 1 and k >= 8 else 1.0
            steps.append({"batch": 4, "seq": 128, "step_s": base * (0.7 + 0.3 * launch) * rng.uniform(0.99, 1.01),
                          "gpu_spin_ms": rng.uniform(0.49, 0.51), "launch_ms": launch * rng.uniform(0.98, 1.02),
                          "cpu_ms": rng.uniform(0.9, 1.1)})
        runs.append({"workload": "opt1.3b-ckpt", "allocator": allocator, "per_step": steps})
    path = tmp_path / "train-gpu0.json"
    path.write_text(json.dumps({"environment": {}, "runs": runs}))
    return path


def test_the_probe_that_moved_with_the_steps_is_named(tmp_path):
    result = regimes.analyse(regimes.load([suite_json(tmp_path)]))
    corr = result["workloads"]["opt1.3b-ckpt"]
    assert corr["launch_ms"] > 0.9
    assert abs(corr["gpu_spin_ms"]) < 0.5 and abs(corr["cpu_ms"]) < 0.5
    slow = {r["allocator"]: r["slowness"] for r in result["runs"]}
    assert slow["expandable"] > 1.1 > slow["native"] and abs(slow["native"] - slow["gmlake"]) < 0.05


def test_fsdp_runs_with_parallel_lists_are_read(tmp_path):
    """The FSDP workload keeps each rank's step times and probes as two lists; rank 0's read as per-step records."""
    data = json.loads(suite_json(tmp_path).read_text())
    for run in data["runs"]:
        steps = run.pop("per_step")
        run["ranks"] = [{"step_s": [s["step_s"] for s in steps],
                         "probes": [{p: s[p] for p in regimes.PROBES} for s in steps]}, {"step_s": []}]
    path = tmp_path / "train-fsdp.json"
    path.write_text(json.dumps(data))
    assert regimes.analyse(regimes.load([path])) == regimes.analyse(regimes.load([suite_json(tmp_path)])) | {
        "runs": [r | {"source": str(path)} for r in regimes.analyse(regimes.load([suite_json(tmp_path)]))["runs"]]}


def test_bad_input_gets_one_line_and_exit_2(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"runs": []}))
    for arg in (str(tmp_path / "missing"), str(empty)):
        proc = subprocess.run([sys.executable, "-m", "bench", "report", "regimes", arg], check=False,
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
