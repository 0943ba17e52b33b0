"""bench/harness.py: how a run starts and ends, the interleaved order, and the run loop the suites share (no GPU:
runs are made up, or a few lines of Python)."""
from __future__ import annotations

import json
import sys
import time

from bench.harness import (
    Results,
    alternate,
    expected_duration,
    finished_runs,
    launch,
    measured_run,
    run_in_order,
    run_order,
    run_process,
)

ORDER = [(0, "cnn", "native"), (0, "cnn", "gmlake"), (1, "vit", "gmlake"), (1, "vit", "native")]


def loop(tmp_path, deadline: float, runs: dict[str, dict]) -> tuple[dict, list, list]:
    """run_in_order over ORDER with runs made up per workload: the record, the calls made, and the summary each
    later run found written."""
    calls, summaries = [], []
    results = Results(tmp_path, "summary.json", {"runs": [], "rows": []}, deadline, slim=True)

    def run(index: int, item: tuple, timeout_s: float) -> dict:
        calls.append((index, item, timeout_s))
        if index:
            summaries.append(json.loads((tmp_path / "summary.json").read_text()))
        return {"round": item[0], "workload": item[1], "allocator": item[2], "per_step": [1, 2],
                **runs.get(item[1], {"wall_s": 1.0})}

    run_in_order(ORDER, results, timeout=300, run=run, expected=lambda item: 5.0 if item[1] == "vit" else 0.0,
                 label=lambda item: f"{item[1]} / {item[2]}", rows=lambda runs: [{"runs": len(runs)}], shown=("wall_s",))
    return results.record, calls, summaries


def test_every_run_in_order_and_the_summary_after_each(tmp_path, capsys):
    record, calls, summaries = loop(tmp_path, 0, {"vit": {"error": "Traceback ...", "returncode": 1}})
    assert [c[1] for c in calls] == ORDER and all(c[2] == 300 for c in calls)
    assert [len(s["runs"]) for s in summaries] == [1, 2, 3]          # rewritten after every run, a cut call keeps it
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert len(saved["runs"]) == 4 and saved["rows"] == [{"runs": 4}] and "wall_s" in saved
    assert all("per_step" not in r for r in saved["runs"]) and record["runs"][0]["per_step"] == [1, 2]
    assert "not_started" not in record
    out = capsys.readouterr().out
    assert "== [3/4] round 2 vit / gmlake at " in out and "   FAILED (exit 1): Traceback ..." in out


def test_the_deadline_starts_no_run_that_would_end_after_it(tmp_path, capsys):
    record, calls, _ = loop(tmp_path, 4.0, {})
    assert [c[1] for c in calls] == ORDER[:2]                        # vit expects 5 s, 4 were left
    assert all(c[2] <= 4.0 for c in calls)                           # a started run gets at most the time left
    assert record["not_started"] == ["vit / gmlake r1", "vit / native r1"]
    assert "deadline: 4 s left, the next run takes about 5 s; not starting more runs" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "summary.json").read_text())["runs"]) == 2


def test_finished_runs_per_allocator_and_a_row_for_one_that_only_failed():
    runs = [{"stage": 2, "allocator": "native"}, {"stage": 2, "allocator": "native", "error": "killed"},
            {"stage": 2, "allocator": "gmlake", "error": "OOM"}, {"stage": 3, "allocator": "gmlake"}]
    rows: list[dict] = []
    got = list(finished_runs(runs, "stage", 2, ["native", "gmlake", "expandable"], rows))
    assert got == [("native", [runs[0]], 1)]
    assert rows == [{"stage": 2, "allocator": "gmlake", "runs": 0, "failed": 1}]      # expandable never ran: no row


def test_rounds_alternate_direction_and_are_the_outer_loop():
    order = run_order(["vit", "bert"], ["A", "B", "C", "D"], rounds=2)
    assert [a for r, w, a in order if w == "vit"] == list("ABCDDCBA")
    assert [w for r, w, a in order][:8] == ["vit"] * 4 + ["bert"] * 4
    assert {r for r, w, a in order[:8]} == {0}
    assert alternate("AB", 3) == ["B", "A"]


def test_expected_duration_prefers_the_same_workload_and_ignores_failures():
    finished = [{"workload": "vit", "wall_s": 10.0}, {"workload": "bert", "wall_s": 30.0},
                {"workload": "vit", "wall_s": 50.0, "error": "oom"}]
    assert expected_duration("vit", finished) == 10.0
    assert expected_duration("cnn", finished) == 30.0
    assert expected_duration("cnn", []) == 0.0


def test_each_allocator_starts_by_torchs_setting_or_gmlake_run(monkeypatch):
    monkeypatch.setenv("GMLAKE", "1")                  # the caller's own environment never leaks into a run
    cmd, env = launch("expandable", ["python"], ["-m", "w"])
    assert cmd == ["python", "-m", "w"] and env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    cmd, env = launch("gmlake-paper", ["python"], ["-m", "w"])
    assert cmd == ["python", "-m", "gmlake", "run", "--policy", "gmlake-paper", "-m", "w"]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "" and "GMLAKE" not in env and env["NCCL_NVLS_ENABLE"] == "0"


def test_a_run_past_its_timeout_is_killed_with_its_children(tmp_path):
    """The whole process group goes: a child that the launcher started would otherwise outlive it."""
    marker = tmp_path / "child-still-ran"
    child = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).touch()"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"
    proc, killed = run_process([sys.executable, "-c", parent], {}, 1.0)
    assert killed and proc.returncode == -9 and "killed after 1 s" in proc.stderr
    time.sleep(3.5)
    assert not marker.exists()


def test_a_measured_run_keeps_the_summary_or_the_output_tail(tmp_path):
    summary = tmp_path / "s.json"
    write = f"import json; open({str(summary)!r}, 'w').write(json.dumps(" \
            "{'allocator': 'gmlake', 'max_memory_allocated': 3, 'max_memory_reserved': 4}))"
    run = measured_run([sys.executable, "-c", write], {}, summary, 60, {"workload": "w"}, log=tmp_path / "log")
    assert run["allocator_seen"] == "gmlake" and run["utilization"] == 0.75 and run["returncode"] == 0
    assert "allocator" not in run and "error" not in run and run["workload"] == "w"
    run = measured_run([sys.executable, "-c", "import sys; sys.exit('boom')"], {}, summary, 60, {})
    assert run["returncode"] == 1 and run["error"].strip() == "boom" and not summary.exists()
