"""bench cap time without a GPU: the A B B A order of uncapped and capped runs, the ratio and spreads, pairs read
from a real cap search's cap.json, and one-line refusals of bad input."""
from __future__ import annotations

import json
import time

import pytest

from bench import RESULTS
from tests.conftest import one_line_exit_2

cap_time = pytest.importorskip("bench.cap_time")
CAP_JSON = RESULTS / "train" / "cap-2026-11-30c" / "cap.json"


def test_pairs_from_a_real_cap_search_are_timed_at_1_05x_their_smallest_fit():
    pairs = cap_time.pairs_from_cap(CAP_JSON)
    assert [(w, a) for w, a, _ in pairs] == [("gpt2xl-lora-ckpt", "gmlake"), ("opt1.3b-lora-ckpt", "gmlake")]
    assert pairs[0][2] == pytest.approx(1.05 * 0.05607225050624221)
    assert pairs[1][2] == pytest.approx(1.05 * 0.049924496200827395)


def test_runs_alternate_uncapped_and_capped_and_the_ratio_is_of_their_means(monkeypatch, tmp_path):
    times = iter([10.0, 11.0, 12.0, 10.5, 9.0, 11.0, 10.0, 9.5])
    calls = []

    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        calls.append((purpose, fraction))
        return {"index": index, "workload": workload, "allocator": allocator, "purpose": purpose,
                "fraction": fraction, "fit": True, "timed_s": next(times)}

    monkeypatch.setattr(cap_time.cap_search, "run_probe", fake_probe)
    cap_time.main(["--workload", "opt1.3b-lora-ckpt", "--allocator", "gmlake", "--fraction", "0.05",
                   "--rounds", "2", "--out", str(tmp_path)])
    assert [p for p, _ in calls] == ["uncapped", "capped", "capped", "uncapped"] * 2
    assert {f for p, f in calls if p == "capped"} == {0.05} and {f for p, f in calls if p == "uncapped"} == {None}
    pair = json.loads((tmp_path / "cap-time.json").read_text())["pairs"][0]
    uncapped, capped = [10.0, 10.5, 9.0, 9.5], [11.0, 12.0, 11.0, 10.0]
    assert pair["ratio"] == pytest.approx(round(sum(capped) / sum(uncapped), 4))
    assert pair["uncapped_spread"] == pytest.approx(round(10.5 / 9.0 - 1, 4))
    assert pair["capped_spread"] == pytest.approx(round(12.0 / 10.0 - 1, 4))
    assert pair["resolved"] is False          # 1.109 is inside the capped runs' 20 % spread


def test_a_run_that_fails_under_the_cap_is_counted_not_timed(monkeypatch, tmp_path):
    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        fit = fraction is None
        return {"index": index, "fraction": fraction, "fit": fit, "oom": not fit, "timed_s": 5.0 if fit else None}

    monkeypatch.setattr(cap_time.cap_search, "run_probe", fake_probe)
    cap_time.main(["--workload", "opt1.3b-lora-ckpt", "--allocator", "gmlake", "--fraction", "0.05",
                   "--rounds", "1", "--out", str(tmp_path)])
    pair = json.loads((tmp_path / "cap-time.json").read_text())["pairs"][0]
    assert pair["out_of_memory"] == 2 and pair["errors"] == 0 and "ratio" not in pair and pair["uncapped_s"] == [5.0, 5.0]


@pytest.mark.parametrize("args, says", [
    ([], "need --workload"), (["--workload", "vit", "--allocator", "gmlake"], "need --workload"),
    (["--workload", "vit", "--allocator", "gmlake", "--fraction", "0"], "--fraction"),
    (["--workload", "vit", "--allocator", "gmlake", "--fraction", "x"], "--fraction"),
    (["--workload", "vit", "--allocator", "nosuch", "--fraction", "0.1"], "invalid choice"),
    (["--from-cap", "/no/such/cap.json"], "not a cap search's cap.json"),
    (["--from-cap", str(CAP_JSON), "--workload", "vit"], "either --from-cap"),
    (["--workload", "vit", "--allocator", "gmlake", "--fraction", "0.1", "--rounds", "0"], "--rounds"),
    (["--bogus"], "unrecognized"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    assert says in one_line_exit_2(["-m", "bench", "cap", "time", *args])


def test_no_run_starts_that_the_deadline_would_cut(monkeypatch, tmp_path):
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(clock)))

    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        return {"index": index, "fraction": fraction, "fit": True, "timed_s": 5.0, "wall_s": 20.0}

    monkeypatch.setattr(cap_time.cap_search, "run_probe", fake_probe)
    cap_time.main(["--workload", "opt1.3b-lora-ckpt", "--allocator", "gmlake", "--fraction", "0.05",
                   "--rounds", "3", "--deadline", "75", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "cap-time.json").read_text())
    assert record["stopped"].startswith("deadline") and 0 < len(record["runs"]) < 12
    assert record["pairs"][0]["errors"] == 0
