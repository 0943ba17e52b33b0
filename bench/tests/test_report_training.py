"""bench report training (no GPU): issue 10's goals per workload, judged from made-up runs with known answers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import ROOT, report_training

GiB = 1 << 30


def runs_of(workload: str, tokens: dict[str, list[float]], reserved: dict[str, float], allocated: float = 9.9):
    return [{"workload": workload, "allocator": a, "returncode": 0, "steps": 24, "tokens_per_s": t,
             "median_step_s": 1000 / t, "max_memory_reserved": int(reserved[a] * GiB),
             "max_memory_allocated": int(allocated * GiB), "gmlake": None}
            for a, ts in tokens.items() for t in ts]


def test_speed_is_missed_only_where_every_run_is_slower():
    reserved = {"native": 20, "expandable": 10.5, "gmlake": 10}
    runs = (runs_of("clear-loss", {"native": [100, 104], "expandable": [101, 103], "gmlake": [90, 92]}, reserved)
            + runs_of("noise", {"native": [100, 130], "expandable": [101, 125], "gmlake": [95, 120]}, reserved)
            + runs_of("win", {"native": [100, 101], "expandable": [99, 100], "gmlake": [103, 104]}, reserved))
    rows = report_training.pool(runs)
    assert report_training.goals(rows, "clear-loss")["speed"] == "missed"
    assert report_training.goals(rows, "noise")["speed"] == "not resolved"
    assert report_training.goals(rows, "win")["speed"] == "met"


def test_memory_needs_both_utilization_and_less_than_expandable():
    tokens = {"native": [100], "expandable": [100], "gmlake": [100]}
    rows = report_training.pool(
        runs_of("tight", tokens, {"native": 20, "expandable": 10.5, "gmlake": 10.05})       # 0.985, less
        + runs_of("loose", tokens, {"native": 20, "expandable": 10.5, "gmlake": 10.4})      # 0.952
        + runs_of("above", tokens, {"native": 20, "expandable": 10.0, "gmlake": 10.05}))    # 0.985, more
    memory = [report_training.goals(rows, w)["memory"] for w in ("tight", "loose", "above")]
    assert memory == ["met", "missed", "missed"]


def test_bad_input_gets_one_line_and_exit_2(tmp_path):
    not_json = tmp_path / "notes.json"
    not_json.write_text("not json")
    no_runs = tmp_path / "other.json"
    no_runs.write_text(json.dumps({"runs": "none"}))
    for path in (not_json, no_runs, tmp_path / "missing.json", tmp_path):
        proc = subprocess.run([sys.executable, "-m", "bench", "report", "training", "--speed", str(path)],
                              capture_output=True, check=False, text=True, cwd=ROOT)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_speed_table_prints_medians_and_spreads(tmp_path):
    path = tmp_path / "train.json"
    runs = runs_of("w", {"native": [100, 120], "expandable": [110], "gmlake": [99, 109]},
                   {"native": 20, "expandable": 10.5, "gmlake": 10})
    for r, kernel_ms in zip(runs, (100.0, 102.0, None, 104.0, 106.0)):     # native, native, expandable, gmlake x2
        if kernel_ms:
            r["gpu_time"] = [{"total_ms": kernel_ms, "copy": 0.0, "gemm": 0.0, "other": kernel_ms, "kernels": 1}]
    path.write_text(json.dumps({"environment": {}, "runs": runs}))
    out = subprocess.run([sys.executable, "-m", "bench", "report", "training", "--speed", str(path)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    gmlake = next(line for line in out.splitlines() if line.startswith("| w | gmlake |"))
    assert "| 2 | 99, 109 | 0.945 | 0.945 | 10.1% | 1.040 (1.9%) | 10.00 | 0.990 |" in gmlake
    expandable = next(line for line in out.splitlines() if line.startswith("| w | expandable |"))
    assert "| 0.0% |  | 10.50 |" in expandable


def test_speed_table_takes_repeats_that_reserved_differently(tmp_path):
    """FSDP under cross-stream sharing reserves a little differently run to run; --speed reports per run, so it
    must not refuse them as the pooled table does."""
    path = tmp_path / "train.json"
    runs = runs_of("w", {"native": [100], "expandable": [110], "gmlake": [99, 109]},
                   {"native": 20, "expandable": 10.5, "gmlake": 10})
    runs[-1]["max_memory_reserved"] += 1 << 20
    path.write_text(json.dumps({"environment": {}, "runs": runs}))
    out = subprocess.run([sys.executable, "-m", "bench", "report", "training", "--speed", str(path)],
                         capture_output=True, check=False, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert any(line.startswith("| w | gmlake | 2 | 99, 109 |") for line in out.stdout.splitlines())


def test_only_report_docs_writes_the_readme_figure(tmp_path):
    """docs/training.png has one writer, `bench report docs`: report training draws a figure only where --png names
    one, and takes result files, not a default that matches none."""
    path = tmp_path / "train.json"
    runs = runs_of("w", {"native": [100, 101], "expandable": [99, 100], "gmlake": [103, 104]},
                   {"native": 20, "expandable": 10.5, "gmlake": 10})
    path.write_text(json.dumps({"environment": {}, "runs": runs}))
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-m", "bench", "report", "training", str(path)], capture_output=True,
                         check=False, text=True, cwd=work, env=env)
    assert out.returncode == 0, out.stderr
    assert "| w | met | met |" in out.stdout and not list(work.iterdir())
    missing = subprocess.run([sys.executable, "-m", "bench", "report", "training"], capture_output=True,
                             check=False, text=True, cwd=work, env=env)
    assert missing.returncode == 2 and "the following arguments are required: results" in missing.stderr
