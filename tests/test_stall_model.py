"""The stall model (issue 10): replay prices a policy's driver calls and predicts the training time they cost.

Checked against the H200 runs of 2026-11-30 in bench/results/train: replay reproduces the GPU run's driver calls
call for call (so its priced time is the GPU run's), and priced time x the stall factor lands within 30 % of the
measured loss where the GPU can resolve it."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gmlake.replay import driver_costs, driver_seconds, replay
from gmlake.trace import load

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "train"
STALL = RESULTS / "stall-2026-11-30"
SPEED = RESULTS / "speed-2026-11-30c"


def gpu_run(workload: str, allocator: str) -> dict:
    """The first run of `workload` under `allocator` in the speed suite of 2026-11-30 (session 4)."""
    with tarfile.open(SPEED / "runs.tar.gz") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if member.name.endswith(f"-{workload}-{allocator}.json"):
                return json.load(tar.extractfile(member))
    raise LookupError(workload)


@pytest.mark.parametrize("workload", ["bert", "cnn"])
def test_replay_reproduces_the_gpu_runs_driver_calls(workload):
    """The trace captured under native, replayed through the default policy, makes the calls the GPU run under
    gmlake made (same shapes, same seed): same stitches, same priced driver time, same peak reserved."""
    real = gpu_run(workload, "gmlake")
    result = replay(load(STALL / f"{workload}-native.pickle.gz"), "gmlake")
    assert result.stats["stitches"] == real["gmlake"]["stitches"]
    assert result.driver_seconds == pytest.approx(driver_seconds(real["gmlake"]), rel=0.01)
    assert result.peak_reserved == real["max_memory_reserved"]


def test_replay_reports_the_predicted_time_lost():
    result = replay(load(STALL / "cnn-native.pickle.gz"), "gmlake-paper")
    factor = driver_costs()["stall_factor"]
    assert result.step_time_lost == pytest.approx(result.driver_seconds * factor)
    assert result.summary()["step_time_lost_seconds"] == pytest.approx(result.step_time_lost, abs=1e-6)
    assert result.step_time_lost > 0.5       # the paper's 2 MiB stitching costs time here; the default does not
    assert replay(load(STALL / "cnn-native.pickle.gz"), "gmlake").step_time_lost < 0.1


def stall_check_module():
    """bench/stall_check.py as a module (bench/ is not a package)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import stall_check as module
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def stall_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "stall_check.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_the_stall_factor_predicts_the_measured_loss_within_30_percent(tmp_path):
    out = tmp_path / "rows.json"
    proc = stall_check(str(SPEED), str(STALL / "vit-paper.json"), str(STALL / "t5-paper.json"), "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    judged = [r for r in json.loads(out.read_text()) if r["judged"]]
    assert {r["workload"] for r in judged} == {"vit", "t5"}          # the paper policy's runs; the default's loss
    assert all(abs(r["error"]) <= 0.3 for r in judged)                 # is below what native's spread resolves


def test_a_factor_far_off_fails_the_check(tmp_path, monkeypatch):
    """The check can fail: with the stall ignored (factor 1) the prediction misses the T5 run by more than 30 %."""
    module = stall_check_module()
    costs = {**driver_costs(), "stall_factor": 1.0}
    rows = module.check(module.load_runs([SPEED, STALL / "t5-paper.json"]), 0.3, costs)
    assert [r["ok"] for r in rows if r["judged"]] == [False]


def test_stall_check_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = stall_check(str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such results" in proc.stderr


def test_replay_prices_the_steps_after_warm_up_from_the_step_markers(tmp_path):
    """With a capture's per-step request counts, stall_check replays only the steps after warm-up: all of the
    trace's driver time when warm-up ends before the first request, none when it ends after the last."""
    module = stall_check_module()
    trace = tmp_path / "cnn-native.pickle.gz"
    trace.write_bytes((STALL / "cnn-native.pickle.gz").read_bytes())
    allocs = int((load(trace).requests()["action"] == 0).sum())
    costs = driver_costs()
    priced = {}
    for marker in (0, allocs // 2, allocs):
        (tmp_path / "cnn-capture.json").write_text(json.dumps({"per_step": [{"allocations_before": marker}]}))
        priced[marker] = module.replayed_after_warmup(tmp_path, "cnn", "gmlake-paper", 0, costs)
    assert priced[0] == pytest.approx(replay(load(trace), "gmlake-paper").driver_seconds)
    assert priced[allocs] == 0
    assert 0 < priced[allocs // 2] < priced[0]
    (tmp_path / "cnn-capture.json").write_text(json.dumps({"per_step": [{"allocations_before": allocs + 1}]}))
    with pytest.raises(ValueError, match="truncated"):
        module.replayed_after_warmup(tmp_path, "cnn", "gmlake-paper", 0, costs)
