"""bench/suite.py: the run loop bench speed and bench deepspeed share (no GPU: runs are made up)."""
from __future__ import annotations

import json
import time

from bench.suite import finished_runs, run_in_order

ORDER = [(0, "cnn", "native"), (0, "cnn", "gmlake"), (1, "vit", "gmlake"), (1, "vit", "native")]


def loop(tmp_path, deadline: float, runs: dict[str, dict]) -> tuple[dict, list, list]:
    """run_in_order over ORDER with runs made up per workload: the record, the calls made, and the summary each
    later run found written."""
    calls, summaries = [], []
    record = {"runs": [], "rows": []}

    def run(index: int, item: tuple, timeout_s: float) -> dict:
        calls.append((index, item, timeout_s))
        if index:
            summaries.append(json.loads((tmp_path / "summary.json").read_text()))
        return {"round": item[0], "workload": item[1], "allocator": item[2], "per_step": [1, 2],
                **runs.get(item[1], {"wall_s": 1.0})}

    run_in_order(ORDER, record, tmp_path, started=time.perf_counter(), deadline=deadline, timeout=300, run=run,
                 expected=lambda item: 5.0 if item[1] == "vit" else 0.0, kind=lambda item: item[1],
                 label=lambda item: f"{item[1]} / {item[2]}", name=lambda item: f"{item[1]}:{item[2]}:r{item[0]}",
                 rows=lambda runs: [{"runs": len(runs)}], shown=("wall_s",))
    return record, calls, summaries


def test_every_run_in_order_and_the_summary_after_each(tmp_path, capsys):
    record, calls, summaries = loop(tmp_path, 0, {"vit": {"error": "Traceback ...", "returncode": 1}})
    assert [c[1] for c in calls] == ORDER and all(c[2] == 300 for c in calls)
    assert [len(s["runs"]) for s in summaries] == [1, 2, 3]          # rewritten after every run, a cut call keeps it
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert len(saved["runs"]) == 4 and saved["rows"] == [{"runs": 4}] and "suite_wall_s" in saved
    assert all("per_step" not in r for r in saved["runs"]) and record["runs"][0]["per_step"] == [1, 2]
    assert "not_started" not in record
    out = capsys.readouterr().out
    assert "== [3/4] round 2 vit / gmlake at " in out and "   FAILED (exit 1): Traceback ..." in out


def test_the_deadline_starts_no_run_that_would_end_after_it(tmp_path, capsys):
    record, calls, _ = loop(tmp_path, 4.0, {})
    assert [c[1] for c in calls] == ORDER[:2]                        # vit expects 5 s, 4 were left
    assert all(c[2] <= 4.0 for c in calls)                           # a started run gets at most the time left
    assert record["not_started"] == ["vit:gmlake:r1", "vit:native:r1"]
    assert "deadline: 4 s left, a vit run takes about 5 s; not starting the last 2 runs" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "summary.json").read_text())["runs"]) == 2


def test_finished_runs_per_allocator_and_a_row_for_one_that_only_failed():
    runs = [{"stage": 2, "allocator": "native"}, {"stage": 2, "allocator": "native", "error": "killed"},
            {"stage": 2, "allocator": "gmlake", "error": "OOM"}, {"stage": 3, "allocator": "gmlake"}]
    rows: list[dict] = []
    got = list(finished_runs(runs, "stage", 2, ["native", "gmlake", "expandable"], rows))
    assert got == [("native", [runs[0]], 1)]
    assert rows == [{"stage": 2, "allocator": "gmlake", "runs": 0, "failed": 1}]      # expandable never ran: no row
