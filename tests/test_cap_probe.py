"""bench cap probe without a GPU: caps given as fractions or bytes reach the probes in order and as fractions of
the device, outcomes are recorded per probe, and bad input is one line and exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_line_exit_2

ROOT = Path(__file__).resolve().parents[1]
cap_probe = pytest.importorskip("bench.cap_probe")
TOTAL = 150109880320        # an H200's total memory as torch reports it


def test_caps_in_bytes_and_fractions_are_probed_in_order(monkeypatch, tmp_path):
    calls = []

    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        calls.append((workload, allocator, purpose, fraction))
        fit = allocator == "gmlake"
        return {"index": index, "workload": workload, "allocator": allocator, "purpose": purpose,
                "fraction": fraction, "fit": fit, "oom": not fit, "oom_step": None if fit else 3,
                "max_memory_reserved": 13_539_000_000 if fit else None, "wall_s": 12.0}

    monkeypatch.setattr(cap_probe.cap_search, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_probe.cap_search, "run_probe", fake_probe)
    cap_probe.main(["cnn:gmlake@13540000000", "cnn:expandable@13540000000", "vit:expandable@0.15201",
                    "--out", str(tmp_path)])
    assert [(w, a, p) for w, a, p, _ in calls] == [("cnn", "gmlake", "fixed"), ("cnn", "expandable", "fixed"),
                                                   ("vit", "expandable", "fixed")]
    assert calls[0][3] == pytest.approx(13540000000 / TOTAL) and calls[2][3] == 0.15201
    record = json.loads((tmp_path / "cap-probe.json").read_text())
    assert record["device_total_memory"] == TOTAL
    assert [p["fit"] for p in record["probes"]] == [True, False, False]
    assert abs(record["probes"][0]["cap_bytes"] - 13540000000) <= 1


def test_no_probe_starts_that_the_deadline_would_cut(monkeypatch, tmp_path):
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(cap_probe.time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(cap_probe.cap_search, "device_total_memory", lambda: TOTAL)

    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        return {"index": index, "workload": workload, "fraction": fraction, "fit": True, "wall_s": 40.0}

    monkeypatch.setattr(cap_probe.cap_search, "run_probe", fake_probe)
    cap_probe.main(["bert:gmlake@0.1", "bert:gmlake@0.1", "bert:gmlake@0.1", "--deadline", "45",
                    "--out", str(tmp_path)])
    record = json.loads((tmp_path / "cap-probe.json").read_text())
    assert record["stopped"].startswith("deadline") and 1 <= len(record["probes"]) < 3


@pytest.mark.parametrize("args, says", [
    ([], "the following arguments are required"),
    (["vit:gmlake"], "expected WORKLOAD:ALLOCATOR@CAP"),
    (["vit@0.1"], "expected WORKLOAD:ALLOCATOR@CAP"),
    (["nosuch:gmlake@0.1"], "no such workload"),
    (["vit:gmlake-paper-8m@0.1"], "takes no allocator"),
    (["vit:gmlake@x"], "CAP must be"),
    (["vit:gmlake@-1"], "CAP must be"),
    (["vit:gmlake@nan"], "CAP must be"),
    (["vit:gmlake@0.1", "--steps", "0"], "--steps"),
    (["vit:gmlake@0.1", "--bogus"], "unrecognized"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    assert says in one_line_exit_2(["-m", "bench", "cap", "probe", *args])


def test_a_cap_in_bytes_over_the_device_is_refused():
    with pytest.raises(ValueError, match="more than the device"):
        cap_probe.as_fraction(2.0 * TOTAL, TOTAL)
    assert cap_probe.as_fraction(0.5, TOTAL) == 0.5


def test_device_limit_probes_leave_the_bytes_free_at_memory_fraction_1(monkeypatch, tmp_path):
    """--device-limit: each probe runs uncapped (fraction 1) with the device filled to leave CAP bytes free, the
    bytes reaching the workload as $GMLAKE_BENCH_LEAVE_FREE (workloads/common.py's limit_memory)."""
    import os

    seen = []

    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        seen.append((purpose, fraction, os.environ.get(cap_probe.LEAVE_FREE_ENV),
                     os.environ.get("CUDA_MODULE_LOADING")))
        return {"index": index, "workload": workload, "allocator": allocator, "fraction": fraction, "fit": True,
                "wall_s": 20.0}

    monkeypatch.setattr(cap_probe.cap_search, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_probe.cap_search, "run_probe", fake_probe)
    monkeypatch.delenv(cap_probe.LEAVE_FREE_ENV, raising=False)
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    cap_probe.main(["opt1.3b-ckpt:gmlake@13540000000", "opt1.3b-ckpt:gmlake-paper@13300000000", "--device-limit",
                    "--out", str(tmp_path)])
    assert seen == [("device", 1.0, "13540000000", "EAGER"), ("device", 1.0, "13300000000", "EAGER")]
    assert cap_probe.LEAVE_FREE_ENV not in os.environ and "CUDA_MODULE_LOADING" not in os.environ  # nothing stays
    record = json.loads((tmp_path / "cap-probe.json").read_text())
    assert [p["limit"] for p in record["probes"]] == ["device", "device"]
    assert abs(record["probes"][1]["cap_bytes"] - 13300000000) <= 1
    says = one_line_exit_2(["-m", "bench", "cap", "probe", "vit:gmlake@0.1", "--device-limit"])
    assert "takes each CAP in bytes" in says
