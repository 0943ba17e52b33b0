"""bench cap probe without a GPU: caps given as fractions or bytes reach the probes in order and as fractions of
the device, outcomes are recorded per probe, and bad input is one line and exit 2."""
from __future__ import annotations

import json
import time

import pytest

from tests.conftest import one_line_exit_2

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

    monkeypatch.setattr(cap_probe, "device_total_memory", lambda: TOTAL)
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
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(cap_probe, "device_total_memory", lambda: TOTAL)

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
    (["vit:nosuch@0.1"], "no such allocator"),
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
    """--device-limit: each probe runs uncapped (fraction 1) with the device filled to leave CAP bytes (plus the
    workload's bytes outside the allocator, here given) free, the bytes reaching the workload as
    $GMLAKE_BENCH_LEAVE_FREE (workloads/common.py's limit_memory)."""
    import os

    seen = []

    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        seen.append((purpose, fraction, os.environ.get(cap_probe.LEAVE_FREE_ENV),
                     os.environ.get("CUDA_MODULE_LOADING")))
        return {"index": index, "workload": workload, "allocator": allocator, "fraction": fraction, "fit": True,
                "wall_s": 20.0}

    monkeypatch.setattr(cap_probe, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_probe.cap_search, "run_probe", fake_probe)
    monkeypatch.delenv(cap_probe.LEAVE_FREE_ENV, raising=False)
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    cap_probe.main(["opt1.3b-ckpt:gmlake@13540000000", "opt1.3b-ckpt:gmlake-paper@13300000000", "--device-limit",
                    "--outside", "opt1.3b-ckpt=0", "--out", str(tmp_path)])
    assert seen == [("device", 1.0, "13540000000", "EAGER"), ("device", 1.0, "13300000000", "EAGER")]
    assert cap_probe.LEAVE_FREE_ENV not in os.environ and "CUDA_MODULE_LOADING" not in os.environ  # nothing stays
    record = json.loads((tmp_path / "cap-probe.json").read_text())
    assert [p["limit"] for p in record["probes"]] == ["device", "device"]
    assert [p["cap_bytes"] for p in record["probes"]] == [13540000000, 13300000000]     # exact, as given
    says = one_line_exit_2(["-m", "bench", "cap", "probe", "vit:gmlake@0.1", "--device-limit"])
    assert "takes each CAP in bytes" in says


# ------------------------------------------------------------------ memory outside the allocator: the calibration

MiB = 1 << 20
OUTSIDE = 650 * MiB         # about what the H200's first device-limit probes lost outside their allocators


def test_the_filler_leaves_the_allocators_bytes_plus_the_bytes_outside():
    assert cap_probe.leave_free(7_620_000_000, OUTSIDE) == 7_620_000_000 + OUTSIDE
    assert cap_probe.leave_free(7_620_000_000, -3 * MiB) == 7_620_000_000       # noise below 0 counts as none
    assert cap_probe.outside_check({}, OUTSIDE) == {}                          # nothing measured, nothing said
    held = cap_probe.outside_check({"outside_allocator_bytes": OUTSIDE + 5 * MiB,
                                    "free_after_filler": 8_000_000_000}, OUTSIDE)
    assert held == {"outside_drift": 5 * MiB, "calibration_held": True,
                    "allocator_had": 8_000_000_000 - OUTSIDE - 5 * MiB}
    off = cap_probe.outside_check({"outside_allocator_bytes": OUTSIDE - 40 * MiB}, OUTSIDE)
    assert off == {"outside_drift": -40 * MiB, "calibration_held": False}
    assert cap_probe.outside_check({"outside_allocator_bytes": OUTSIDE + 32 * MiB}, OUTSIDE)["calibration_held"]


def fake_runs(outside_by_run: dict, calls: list, fit: dict | None = None):
    """A run_probe that records (workload, allocator, purpose, $LEAVE_FREE, $WARM) and reports, for a calibration
    or a probe, the bytes outside the allocator `outside_by_run[(workload, purpose)]` (None: the run crashed)."""
    import os

    def run_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        leave = int(os.environ[cap_probe.LEAVE_FREE_ENV])
        calls.append((workload, allocator, purpose, leave, os.environ.get(cap_probe.WARM_ENV)))
        outside = outside_by_run.get((workload, purpose))
        if outside is None:
            return {"index": index, "workload": workload, "allocator": allocator, "purpose": purpose,
                    "fraction": fraction, "fit": False, "error": "Traceback: boom", "wall_s": 5.0}
        ok = (fit or {}).get(allocator, True)
        return {"index": index, "workload": workload, "allocator": allocator, "purpose": purpose,
                "fraction": fraction, "fit": ok, "oom": not ok, "wall_s": 30.0, "leave_free": leave,
                "filler_bytes": 0 if purpose == "calibrate" else TOTAL // 2,
                "free_after_filler": leave if purpose != "calibrate" else TOTAL // 2,
                "reserved_at_filler": 0, "outside_allocator_bytes": outside}
    return run_probe


def test_a_calibration_per_workload_measures_what_each_probe_leaves_for_outside(monkeypatch, tmp_path, capsys):
    calls = []
    runs = {("opt1.3b-lora-ckpt", "calibrate"): OUTSIDE, ("opt1.3b-lora-ckpt", "device"): OUTSIDE + 3 * MiB,
            ("gpt2xl-lora-ckpt", "calibrate"): OUTSIDE + 20 * MiB, ("gpt2xl-lora-ckpt", "device"): OUTSIDE - 80 * MiB}
    monkeypatch.setattr(cap_probe, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_probe.cap_search, "run_probe", fake_runs(runs, calls, fit={"gmlake-paper": False}))
    cap_probe.main(["opt1.3b-lora-ckpt:gmlake@7600000000", "opt1.3b-lora-ckpt:gmlake-paper@7500000000",
                    "gpt2xl-lora-ckpt:gmlake@8500000000", "--device-limit", "--out", str(tmp_path)])
    # one calibration per workload, under native with no filler (the whole device left free), before its probes
    assert calls == [("opt1.3b-lora-ckpt", "native", "calibrate", TOTAL, None),
                     ("opt1.3b-lora-ckpt", "gmlake", "device", 7600000000 + OUTSIDE, None),
                     ("opt1.3b-lora-ckpt", "gmlake-paper", "device", 7500000000 + OUTSIDE, None),
                     ("gpt2xl-lora-ckpt", "native", "calibrate", TOTAL, None),
                     ("gpt2xl-lora-ckpt", "gmlake", "device", 8500000000 + OUTSIDE + 20 * MiB, None)]
    record = json.loads((tmp_path / "cap-probe.json").read_text())
    assert record["outside"]["opt1.3b-lora-ckpt"] == {"bytes": OUTSIDE, "from": "calibration", "calibration": 0}
    assert [c["purpose"] for c in record["calibrations"]] == ["calibrate", "calibrate"]
    first, second, third = record["probes"]
    assert first["outside_calibrated"] == OUTSIDE and first["leave_free"] == 7600000000 + OUTSIDE
    assert first["outside_drift"] == 3 * MiB and first["calibration_held"] is True
    assert first["allocator_had"] == 7600000000 - 3 * MiB
    assert second["fit"] is False and second["calibration_held"] is True
    assert third["outside_drift"] == -100 * MiB and third["calibration_held"] is False
    out = capsys.readouterr().out
    assert "OFF by more than 32 MiB" in out and out.count("OFF") == 1
    assert f"{OUTSIDE:,} B outside the allocator" in out


def test_a_failed_calibration_skips_its_workloads_probes(monkeypatch, tmp_path):
    calls = []
    runs = {("cnn", "calibrate"): OUTSIDE, ("cnn", "device"): OUTSIDE}      # bert's calibration crashes
    monkeypatch.setattr(cap_probe, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_probe.cap_search, "run_probe", fake_runs(runs, calls))
    cap_probe.main(["bert:gmlake@22000000000", "cnn:gmlake@13000000000", "bert:expandable@22000000000",
                    "--device-limit", "--warm", "--out", str(tmp_path)])
    assert [(w, p) for w, _, p, _, _ in calls] == [("bert", "calibrate"), ("cnn", "calibrate"), ("cnn", "device")]
    assert {warm for *_, warm in calls} == {"1"}                             # --warm reaches every run
    record = json.loads((tmp_path / "cap-probe.json").read_text())
    assert record["outside"]["bert"]["bytes"] is None
    assert [(s["workload"], s["allocator"]) for s in record["skipped"]] == [("bert", "gmlake"), ("bert", "expandable")]


def test_given_or_no_bytes_outside_need_no_calibration_and_calibrate_only_runs_no_probe(monkeypatch, tmp_path):
    calls = []
    runs = {("cnn", "calibrate"): OUTSIDE, ("cnn", "device"): OUTSIDE, ("vit", "device"): 0, ("vit", "calibrate"): 1}
    monkeypatch.setattr(cap_probe, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_probe.cap_search, "run_probe", fake_runs(runs, calls))
    cap_probe.main(["cnn:gmlake@13000000000", "--device-limit", "--outside", f"cnn={OUTSIDE}",
                    "--out", str(tmp_path / "a")])
    cap_probe.main(["vit:gmlake@21000000000", "--device-limit", "--no-calibrate", "--out", str(tmp_path / "b")])
    cap_probe.main(["cnn:gmlake@13000000000", "vit:gmlake@21000000000", "--device-limit", "--calibrate-only",
                    "--calibrate-with", "expandable", "--out", str(tmp_path / "c")])
    assert [(w, a, p, leave) for w, a, p, leave, _ in calls] == [
        ("cnn", "gmlake", "device", 13000000000 + OUTSIDE), ("vit", "gmlake", "device", 21000000000),
        ("cnn", "expandable", "calibrate", TOTAL), ("vit", "expandable", "calibrate", TOTAL)]
    only = json.loads((tmp_path / "c" / "cap-probe.json").read_text())
    assert only["probes"] == [] and only["outside"]["vit"]["bytes"] == 1


@pytest.mark.parametrize("args, says", [
    (["cnn:gmlake@13000000000", "--outside", "cnn=1"], "--outside goes with --device-limit"),
    (["cnn:gmlake@13000000000", "--warm"], "--warm goes with --device-limit"),
    (["cnn:gmlake@13000000000", "--device-limit", "--outside", "vit=1"], "WORKLOAD one of the probes'"),
    (["cnn:gmlake@13000000000", "--device-limit", "--outside", "cnn=-1"], "whole number >= 0"),
    (["cnn:gmlake@13000000000", "--device-limit", "--outside", "cnn=lots"], "whole number >= 0"),
    (["cnn:gmlake@13000000000", "--device-limit", "--no-calibrate", "--outside", "cnn=1"], "--no-calibrate"),
    (["cnn:gmlake@13000000000", "--device-limit", "--calibrate-with", "nosuch"], "invalid choice"),
    (["cnn:gmlake@13000000000", "--device-limit", "--calibrate-only", "--outside", "cnn=1"], "already has"),
])
def test_bad_calibration_options_are_one_line_and_exit_2(args, says):
    assert says in one_line_exit_2(["-m", "bench", "cap", "probe", *args])


def test_a_probe_record_carries_the_workloads_device_limit_figures(monkeypatch, tmp_path):
    """cap_search.run_probe keeps what the workload measured under a device limit: the filler, the free bytes after
    it, the bytes outside the allocator at the end (or at the out-of-memory) and after each step."""
    import sys

    summary = {"oom": True, "oom_step": 2, "max_memory_reserved": 5, "max_memory_allocated": 4, "leave_free": 9,
               "filler_bytes": 7, "free_after_filler": 9, "reserved_at_filler": 0, "warmed": False,
               "outside_allocator_bytes": 123, "per_step": [{"outside_allocator_bytes": 100},
                                                            {"outside_allocator_bytes": 120}]}

    def command(workload, allocator, settings, json_path):
        code = f"import json, sys; json.dump({summary!r}, open({str(json_path)!r}, 'w')); sys.exit(3)"
        return [sys.executable, "-c", code], None

    monkeypatch.setattr(cap_probe.cap_search, "probe_command", command)
    probe = cap_probe.cap_search.run_probe("cnn", "gmlake", "device", 1.0, 60, settings=None, out=tmp_path, index=0)
    assert probe["oom"] and not probe["fit"] and probe["oom_step"] == 2
    assert {k: probe[k] for k in ("filler_bytes", "free_after_filler", "outside_allocator_bytes")} == \
        {"filler_bytes": 7, "free_after_filler": 9, "outside_allocator_bytes": 123}
    assert probe["outside_by_step"] == [100, 120]


def test_the_workloads_measure_the_bytes_outside_their_allocator(monkeypatch):
    """workloads/common.py (which needs torch): the filler's size, and the bytes outside the allocator as the free
    bytes lost since the filler less the allocator's growth since; nothing without a device limit."""
    common = pytest.importorskip("bench.workloads.common")
    assert common.filler_bytes(10_000, 3_000) == 7_000 and common.filler_bytes(3_000, 10_000) == 0
    assert common.outside_allocator_bytes(free_after_filler=8_000, free_now=1_000, reserved_now=6_500) == 500
    assert common.outside_allocator_bytes(8_000, 1_000, 6_500, reserved_at_filler=200) == 700
    monkeypatch.setattr(common, "_device_limit", {})
    assert common.device_limit_fields() == {} and common.outside_now() == {}
    monkeypatch.setattr(common, "_device_limit", {"leave_free": 8_000, "filler_bytes": 90_000,
                                                  "free_after_filler": 8_000, "reserved_at_filler": 0})
    monkeypatch.setattr(common.torch.cuda, "mem_get_info", lambda: (1_000, 100_000))
    monkeypatch.setattr(common, "_reserved_now", lambda: 6_500)
    assert common.device_limit_fields() == {"leave_free": 8_000, "filler_bytes": 90_000, "free_after_filler": 8_000,
                                            "reserved_at_filler": 0, "outside_allocator_bytes": 500}
    assert common.outside_now() == {"outside_allocator_bytes": 500}

    def broken():
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(common.torch.cuda, "mem_get_info", broken)
    fields = common.device_limit_fields()                  # at an out-of-memory it must not raise
    assert "outside_allocator_bytes" not in fields and "out of memory" in fields["outside_allocator_error"]
    assert common.outside_now() == {}
