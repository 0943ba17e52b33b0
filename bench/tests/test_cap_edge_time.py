"""bench cap edge-time without a GPU: the order of the runs (a point's rounds before the next point, A B then B A),
what each run is started with (a cap as a fraction of the device, a device limit as the filler's free bytes plus the
calibration's), the summary per point (ratio, spreads, resolved, out of memory), the deadline, the generated docs
table, and one-line refusals of bad input."""
from __future__ import annotations

import json
import math
import os

import pytest

from bench import RESULTS
from tests.conftest import one_line_exit_2

edge_time = pytest.importorskip("bench.cap_edge_time")
cap_probe = pytest.importorskip("bench.cap_probe")
TOTAL = 150109880320        # an H200's total memory as torch reports it
P = 7449601024              # opt1.3b-lora-ckpt's peak allocated in bench/plans/edge-probes.json
MiB = 1 << 20
OUTSIDE = 588 * MiB


def labels(steps):
    return [edge_time.label(s) for s in steps]


# ------------------------------------------------------------------------------------------------ the plan

def test_each_point_runs_all_its_rounds_before_the_next_and_the_rounds_alternate():
    steps = edge_time.plan(["opt1.3b-lora-ckpt"], ["cap", "device"], [1.02, 1.05], ["expandable", "gmlake"], 2)
    w = "opt1.3b-lora-ckpt"
    assert labels(steps) == [
        f"{w} cap 1.02x P r0 expandable", f"{w} cap 1.02x P r0 gmlake",
        f"{w} cap 1.02x P r1 gmlake", f"{w} cap 1.02x P r1 expandable",
        f"{w} cap 1.05x P r0 expandable", f"{w} cap 1.05x P r0 gmlake",
        f"{w} cap 1.05x P r1 gmlake", f"{w} cap 1.05x P r1 expandable",
        f"{w} calibrate",                                   # once, just before the workload's first device point
        f"{w} device 1.02x P r0 expandable", f"{w} device 1.02x P r0 gmlake",
        f"{w} device 1.02x P r1 gmlake", f"{w} device 1.02x P r1 expandable",
        f"{w} device 1.05x P r0 expandable", f"{w} device 1.05x P r0 gmlake",
        f"{w} device 1.05x P r1 gmlake", f"{w} device 1.05x P r1 expandable"]


def test_three_rounds_and_two_workloads_and_a_known_outside_need_no_calibration():
    steps = edge_time.plan(["cnn", "vit"], ["device"], [1.05], ["gmlake", "expandable"], 3, calibrated={"cnn"})
    assert labels(steps) == ["cnn device 1.05x P r0 gmlake", "cnn device 1.05x P r0 expandable",
                             "cnn device 1.05x P r1 expandable", "cnn device 1.05x P r1 gmlake",
                             "cnn device 1.05x P r2 gmlake", "cnn device 1.05x P r2 expandable",
                             "vit calibrate", "vit device 1.05x P r0 gmlake", "vit device 1.05x P r0 expandable",
                             "vit device 1.05x P r1 expandable", "vit device 1.05x P r1 gmlake",
                             "vit device 1.05x P r2 gmlake", "vit device 1.05x P r2 expandable"]
    assert [s["step"] for s in edge_time.plan(["cnn"], ["cap"], [1.02], ["gmlake", "expandable"], 1)] == ["run"] * 2


def test_p_comes_from_the_probes_plan_and_matches_replays_figures_for_the_same_trace():
    peaks = edge_time.read_peaks(edge_time.PLAN)
    assert peaks == {"opt1.3b-lora-ckpt": P, "gpt2xl-lora-ckpt": 8364897280, "opt1.3b-ckpt": 13226842112}
    figures = {row["peak_allocated"] for row in json.loads((RESULTS / "edge-figures.json")
                                                           .read_text())["rows"]}
    assert set(peaks.values()) <= figures


# ------------------------------------------------------------------------------------------------ the summary

def run(allocator, timed=None, oom=False, error=False, **more):
    fit = not oom and not error
    return {"allocator": allocator, "fit": fit, "oom": oom or None, "timed_s": timed if fit else None,
            **({"error": "boom"} if error else {}), **more}


def test_the_ratio_is_of_the_mean_times_and_resolved_only_outside_both_spreads():
    runs = [run("expandable", 10.0), run("gmlake", 9.0), run("gmlake", 9.2), run("expandable", 10.4)]
    got = edge_time.summarize(runs, ["expandable", "gmlake"], 2)
    assert got["ratio"] == pytest.approx(round(9.1 / 10.2, 4))
    assert got["allocators"]["expandable"]["spread"] == pytest.approx(0.04)
    assert got["allocators"]["gmlake"]["sum_s"] == pytest.approx(18.2)
    assert got["allocators"]["gmlake"]["times_s"] == [9.0, 9.2]
    assert got["resolved"] is True and got["verdict"] == "faster" and got["goal"] == "met" and got["complete"]
    # the same ratio inside a 15 % spread is not resolved; a ratio above 1 inside it: the goal not resolved either
    noisy = edge_time.summarize([run("expandable", 10.0), run("gmlake", 10.5), run("gmlake", 12.0),
                                 run("expandable", 11.5)], ["expandable", "gmlake"], 2)
    assert noisy["ratio"] == pytest.approx(round(11.25 / 10.75, 4))
    assert noisy["resolved"] is False and noisy["verdict"] == "within the spread" and noisy["goal"] == "not resolved"
    quicker = edge_time.summarize([run("expandable", 11.5), run("gmlake", 10.5), run("gmlake", 12.0),
                                   run("expandable", 12.0)], ["expandable", "gmlake"], 2)
    assert quicker["ratio"] < 1 and quicker["resolved"] is False and quicker["goal"] == "not resolved"
    slower = edge_time.summarize([run("expandable", 10.0), run("gmlake", 11.0), run("gmlake", 11.1),
                                  run("expandable", 10.1)], ["expandable", "gmlake"], 2)
    assert slower["resolved"] and slower["verdict"] == "slower" and slower["goal"] == "missed"


def test_one_run_a_side_is_never_resolved():
    got = edge_time.summarize([run("expandable", 10.0), run("gmlake", 5.0)], ["expandable", "gmlake"], 2)
    assert got["ratio"] == 0.5 and got["resolved"] is False and got["verdict"] == "one run a side"
    assert got["complete"] is False


def test_an_allocator_that_ran_out_of_memory_is_reported_so_not_timed():
    runs = [run("expandable", oom=True, oom_step=13), run("gmlake", 9.0), run("gmlake", 9.1),
            run("expandable", 10.0)]
    got = edge_time.summarize(runs, ["expandable", "gmlake"], 2)
    assert "ratio" not in got and got["verdict"] == "expandable out of memory" and got["goal"] == "met"
    assert got["allocators"]["expandable"]["out_of_memory"] == 1 and got["allocators"]["expandable"]["oom_steps"] == [13]
    assert got["allocators"]["expandable"]["times_s"] == [10.0]
    mine = edge_time.summarize([run("expandable", 10.0), run("gmlake", oom=True)], ["expandable", "gmlake"], 1)
    assert mine["verdict"] == "gmlake out of memory" and mine["goal"] == "missed"
    both = edge_time.summarize([run("expandable", oom=True), run("gmlake", oom=True)], ["expandable", "gmlake"], 1)
    assert both["verdict"] == "both out of memory" and both["goal"] is None


def test_profiled_kernel_time_is_summed_per_run_and_a_failed_profiled_step_gives_none():
    steps = [{"total_ms": 400.0, "kernels": 900}, {"total_ms": 410.5, "kernels": 905}]
    runs = [run("expandable", 10.0, gpu_time=steps), run("gmlake", 11.0, gpu_time=steps[:1]),
            run("gmlake", 11.2, gpu_time=[*steps, {"error": "OutOfMemoryError: ..."}]),
            run("expandable", 10.1)]
    got = edge_time.summarize(runs, ["expandable", "gmlake"], 2)
    assert got["allocators"]["expandable"]["kernel_ms"] == [810.5]
    assert got["allocators"]["gmlake"]["kernel_ms"] == [400.0]
    record = {"settings": {"allocators": ["expandable", "gmlake"]},
              "points": [{"workload": "w", "kind": "cap", "limit_p": 1.02, "limit_bytes": P, **got}]}
    columns, rows = edge_time.table_rows(record)
    assert columns[-1] == "kernel ms" and rows[0][-1] == "810 vs 400"
    plain = {**record, "points": [{**record["points"][0], "allocators": {
        x: {k: v for k, v in s.items() if k != "kernel_ms"} for x, s in got["allocators"].items()}}]}
    assert "kernel ms" not in edge_time.table_rows(plain)[0]


def test_errors_and_runs_cut_by_the_deadline_give_no_time():
    got = edge_time.summarize([run("expandable", error=True), run("gmlake", 9.0)], ["expandable", "gmlake"], 1)
    assert got["verdict"] == "errors" and got["goal"] is None and got["allocators"]["expandable"]["errors"] == 1
    cut = edge_time.summarize([run("expandable", 10.0), run("gmlake", error=True, cut=True)],
                              ["expandable", "gmlake"], 1)
    assert cut["allocators"]["gmlake"]["runs"] == 0 and cut["verdict"] == "no runs" and not cut["complete"]


# ------------------------------------------------------------------------------------------------ the runs

def alternating(allocator, index):
    """expandable 10.0 and 10.4 s, gmlake 9.0 and 9.2 s, by the run's index: A B B A gives each one of both."""
    return (10.0 + 0.4 * (index % 2)) if allocator == "expandable" else (9.0 + 0.2 * (index % 2))


def fake_gpu(monkeypatch, calls, times=alternating, oom=(), wall=30.0, killed=(), clock=None):
    """run_probe and device_total_memory without a GPU: each call recorded with the bytes the filler would leave
    ($GMLAKE_BENCH_LEAVE_FREE), a calibration measuring OUTSIDE, a run timed `times(allocator, index)` unless its
    index (counting runs and calibrations from 0) is in `oom` or in `killed`. With `clock` (a one-item list), time
    stands still but for the runs: each moves it on by `wall` seconds."""
    if clock is not None:
        monkeypatch.setattr(edge_time.time, "perf_counter", lambda: clock[0])

    def run_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        leave = os.environ.get(cap_probe.LEAVE_FREE_ENV)
        calls.append({"workload": workload, "allocator": allocator, "purpose": purpose, "fraction": fraction,
                      "leave": None if leave is None else int(leave), "index": index, "timeout": timeout_s})
        if clock is not None:
            clock[0] += min(wall, timeout_s)
        base = {"index": index, "workload": workload, "allocator": allocator, "purpose": purpose,
                "fraction": fraction, "wall_s": wall, "max_memory_reserved": 7_600_000_000}
        if index in killed:
            return {**base, "fit": False, "error": "killed", "killed": True}
        if purpose == "calibrate":
            return {**base, "fit": True, "timed_s": 6.0, "outside_allocator_bytes": OUTSIDE}
        device = leave is not None
        extra = {"outside_allocator_bytes": OUTSIDE + 2 * MiB, "free_after_filler": int(leave)} if device else {}
        if index in oom:
            return {**base, "fit": False, "oom": True, "oom_step": 13, **extra}
        return {**base, "fit": True, "timed_s": times(allocator, index), "driver_busy_after_s": 0.02 if allocator == "gmlake"
                else None, **extra}

    monkeypatch.setattr(edge_time.cap_search, "run_probe", run_probe)
    monkeypatch.setattr(edge_time, "device_total_memory", lambda: TOTAL)
    monkeypatch.delenv(cap_probe.LEAVE_FREE_ENV, raising=False)


def test_caps_are_fractions_of_the_device_and_device_limits_leave_the_bytes_plus_the_calibrations(
        monkeypatch, tmp_path, capsys):
    calls = []
    fake_gpu(monkeypatch, calls, oom={0})
    edge_time.main(["--workloads", "opt1.3b-lora-ckpt", "--out", str(tmp_path)])
    cap_102, cap_105 = math.ceil(1.02 * P), math.ceil(1.05 * P)
    assert [c["purpose"] for c in calls] == ["cap-1.02x"] * 4 + ["cap-1.05x"] * 4 + ["calibrate"] + \
        ["device-1.02x"] * 4 + ["device-1.05x"] * 4
    assert [c["allocator"] for c in calls[:4]] == ["expandable", "gmlake", "gmlake", "expandable"]
    assert calls[0]["fraction"] == pytest.approx(cap_102 / TOTAL) and calls[0]["leave"] is None
    assert calls[4]["fraction"] == pytest.approx(cap_105 / TOTAL)
    assert calls[8]["leave"] == TOTAL and calls[8]["allocator"] == "native"        # the calibration: no filler
    assert {c["fraction"] for c in calls[9:]} == {1.0}
    assert [c["leave"] for c in calls[9:]] == [cap_102 + OUTSIDE] * 4 + [cap_105 + OUTSIDE] * 4
    assert [c["index"] for c in calls] == list(range(17))                         # every run its own summary file
    assert cap_probe.LEAVE_FREE_ENV not in os.environ
    record = json.loads((tmp_path / "edge-time.json").read_text())
    assert record["outside"]["opt1.3b-lora-ckpt"] == {"bytes": OUTSIDE, "from": "calibration", "calibration": 0}
    assert record["peaks"]["opt1.3b-lora-ckpt"]["bytes"] == P
    first = record["runs"][0]
    assert first["kind"] == "cap" and first["limit_p"] == 1.02 and first["round"] == 0 and first["oom"]
    device = record["runs"][8]
    assert device["kind"] == "device" and device["outside_drift"] == 2 * MiB and device["calibration_held"]
    assert device["cap_bytes"] == cap_102 and "limit" not in device
    assert [(p["kind"], p["limit_p"]) for p in record["points"]] == [("cap", 1.02), ("cap", 1.05), ("device", 1.02),
                                                                     ("device", 1.05)]
    oom_point, timed = record["points"][0], record["points"][1]
    assert oom_point["verdict"] == "expandable out of memory" and oom_point["limit_bytes"] == cap_102
    assert timed["ratio"] == pytest.approx(round(9.1 / 10.2, 4)) and timed["resolved"]
    assert timed["allocators"]["gmlake"]["driver_busy_s"] == [0.02, 0.02]
    assert record["points"][2]["allocators"]["gmlake"]["outside_drift"] == [2 * MiB, 2 * MiB]
    out = capsys.readouterr().out
    assert "expandable out of memory" in out and "0.892" in out and "OOM in 1 of 2" in out
    columns, rows = edge_time.table_rows(record)
    assert dict(zip(columns, rows[0])) == {
        "workload": "opt1.3b-lora-ckpt", "kind": "cap", "limit": "1.02x P", "GiB": "7.077",
        "expandable s": "OOM in 1 of 2 (step 13)", "expandable spread": "-", "gmlake s": "9.20 / 9.00",
        "gmlake spread": "2.2%", "gmlake / expandable": "-", "verdict": "expandable out of memory",
        "gmlake <= expandable": "met", "gmlake driver s": "0.020 / 0.020", "peak reserved GiB": "7.08 / 7.08",
        "outside drift MiB": "-"}
    assert rows[3][columns.index("outside drift MiB")] == "+2 to +2"


def test_the_deadline_stops_between_runs_and_leaves_whole_points(monkeypatch, tmp_path):
    calls = []
    fake_gpu(monkeypatch, calls, wall=20.0, clock=[0.0])
    edge_time.main(["--workloads", "opt1.3b-lora-ckpt", "--kinds", "cap", "--deadline", "130",
                    "--out", str(tmp_path)])
    record = json.loads((tmp_path / "edge-time.json").read_text())
    # runs of 20 s from 0: the sixth ends at 120, and 10 s are too few for a seventh
    assert record["stopped"] == ("deadline: 10 s left, opt1.3b-lora-ckpt cap 1.05x P r1 gmlake takes about 20 s")
    assert len(calls) == 6 and len(record["runs"]) == 6
    assert record["not_started"][0] == edge_time.label(edge_time.plan(
        ["opt1.3b-lora-ckpt"], ["cap"], [1.02, 1.05], ["expandable", "gmlake"], 2)[len(calls)])
    assert record["points"][0]["complete"] and "ratio" in record["points"][0]
    assert not record["points"][1]["complete"]
    # every run started with its timeout shortened to the time left, never past the deadline
    assert all(c["timeout"] <= 130 for c in calls)


def third_run_killed(monkeypatch, tmp_path, deadline: str) -> tuple[list, dict]:
    """One point (cap 1.05x P) under --deadline `deadline`, its third run (of 30 s each) killed: the calls made, and
    the record written."""
    calls = []
    fake_gpu(monkeypatch, calls, killed={2}, clock=[0.0])
    edge_time.main(["--workloads", "opt1.3b-lora-ckpt", "--kinds", "cap", "--limits", "1.05", "--deadline", deadline,
                    "--out", str(tmp_path)])
    return calls, json.loads((tmp_path / "edge-time.json").read_text())


def test_a_run_the_deadline_killed_stops_the_runs_and_counts_for_nothing(monkeypatch, tmp_path):
    calls, record = third_run_killed(monkeypatch, tmp_path, deadline="100")
    assert calls[2]["timeout"] == 40                # the deadline's 40 s left, not --timeout's 300
    assert len(calls) == 3 and record["runs"][2]["cut"] and "stopped at it" in record["stopped"]
    point = record["points"][0]
    assert point["allocators"]["gmlake"]["runs"] == 1 and point["allocators"]["gmlake"]["errors"] == 0
    assert record["not_started"] == ["opt1.3b-lora-ckpt cap 1.05x P r1 expandable"]


def test_a_run_killed_at_its_own_timeout_is_an_error_and_the_runs_go_on(monkeypatch, tmp_path):
    calls, record = third_run_killed(monkeypatch, tmp_path, deadline="500")
    assert len(calls) == 4 and "stopped" not in record and not record["runs"][2].get("cut")
    point = record["points"][0]
    assert point["allocators"]["gmlake"]["errors"] == 1 and point["verdict"] == "one run a side"


def test_the_first_runs_deadline_estimate_is_the_typical_time_then_the_runs_own(monkeypatch):
    step = {"step": "run", "workload": "opt1.3b-lora-ckpt", "kind": "device", "limit_p": 1.02, "round": 0,
            "allocator": "gmlake"}
    record = {"runs": [{"workload": "opt1.3b-lora-ckpt", "kind": "cap", "wall_s": 20.0}], "calibrations": []}
    assert edge_time.estimate(step, record) == edge_time.TYPICAL_S["opt1.3b-lora-ckpt"][1]   # no device run yet
    record["runs"].append({"workload": "opt1.3b-lora-ckpt", "kind": "device", "wall_s": 41.0})
    assert edge_time.estimate(step, record) == 41.0


def test_a_dry_run_lists_the_runs_and_where_the_deadline_cuts_them_and_touches_no_device(monkeypatch, capsys):
    def no_gpu():
        raise AssertionError("a dry run read the device")

    monkeypatch.setattr(edge_time, "device_total_memory", no_gpu)
    monkeypatch.setattr(edge_time.cap_search, "run_probe", no_gpu)
    edge_time.main(["--workloads", "opt1.3b-lora-ckpt", "gpt2xl-lora-ckpt", "--dry-run", "--deadline", "560"])
    out = capsys.readouterr().out
    assert "[  1] opt1.3b-lora-ckpt cap 1.02x P r0 expandable (7,598,593,045 B)" in out
    assert "32 runs and 2 calibrations" in out and out.count("likely cuts here") == 1
    cut = out.index("likely cuts here")
    assert "gpt2xl-lora-ckpt" in out[:cut] and "opt1.3b-lora-ckpt device 1.05x P r1 expandable" in out[:cut]


# ------------------------------------------------------------------------------------------------ the docs table

def test_the_generated_docs_table_is_the_results_files(monkeypatch, tmp_path):
    report_docs = pytest.importorskip("bench.report_docs")
    record = {"environment": {"gpu": "NVIDIA H200", "nvidia_driver": "580", "torch": "2.11", "date": "2026-12-03T1"},
              "settings": {"allocators": ["expandable", "gmlake"], "rounds": 2, "steps": 20, "warmup": 5},
              "not_started": ["a", "b"], "stopped": "deadline",
              "points": [{"workload": "opt1.3b-lora-ckpt", "kind": "device", "limit_p": 1.05,
                          "limit_bytes": math.ceil(1.05 * P), "complete": True, "ratio": 0.98, "resolved": False,
                          "verdict": "within the spread", "goal": "not resolved",
                          "allocators": {
                              "expandable": edge_time.allocator_summary([run("expandable", 6.0), run("expandable", 6.2)]),
                              "gmlake": edge_time.allocator_summary([run("gmlake", 5.9), run("gmlake", 6.1)])}}]}
    (tmp_path / "edge-time.json").write_text(json.dumps(record))
    monkeypatch.setattr(report_docs, "RESULTS", tmp_path)
    monkeypatch.setattr(report_docs, "EDGE_TIME", ["edge-time.json"])
    text = report_docs.render("<!-- generated: edge-time -->\n<!-- end generated -->")
    assert "| opt1.3b-lora-ckpt | device | 1.05x P | 7.285 | 6.00 / 6.20 | 3.3% | 5.90 / 6.10 | 3.4% | 0.980 | " \
           "within the spread | not resolved |" in text
    assert "NVIDIA H200 (driver 580), torch 2.11, 2026-12-03." in text and "2 runs not started" in text


# ------------------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("args, says", [
    (["--workloads", "nosuch"], "invalid choice"),
    (["--workloads", "vit"], "no peak allocated P for vit"),
    (["--limits", "1.0"], "above 1"), (["--limits", "0.98"], "above 1"), (["--limits", "nan"], "above 1"),
    (["--limits", "inf"], "above 1"), (["--limits", "x"], "above 1"),
    (["--rounds", "0"], "--rounds >= 1"), (["--rounds", "x"], "invalid int"),
    (["--allocators", "gmlake", "gmlake"], "two different"), (["--allocators", "gmlake"], "expected 2"),
    (["--allocators", "expandable", "nosuch"], "invalid choice"),
    (["--kinds", "ceiling"], "invalid choice"),
    (["--peak", "vit=1"], "one of --workloads"), (["--peak", "opt1.3b-lora-ckpt=0"], "above 0"),
    (["--peak", "opt1.3b-lora-ckpt=lots"], "above 0"),
    (["--outside", "opt1.3b-lora-ckpt=-1"], "whole number >= 0"),
    (["--outside", "vit=1"], "one of --workloads"),
    (["--kinds", "cap", "--warm"], "--warm goes with --kinds device"),
    (["--calibrate-with", "nosuch"], "invalid choice"),
    (["--plan", "/no/such/plan.json"], "not a bench cap plan file"),
    (["--steps", "0"], "--steps"), (["--deadline", "-1"], "--deadline"),
    (["--gpu-time-steps", "-1"], "0 <= --gpu-time-steps <= --steps"),
    (["--gpu-time-steps", "21"], "0 <= --gpu-time-steps <= --steps"), (["--gpu-time-steps", "x"], "invalid int"),
    (["--bogus"], "unrecognized"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    assert says in one_line_exit_2(["-m", "bench", "cap", "edge-time", *args])


def test_a_peak_given_for_every_workload_needs_no_plan_and_a_limit_over_the_device_is_refused(monkeypatch, capsys):
    args = edge_time.parse_args(["--workloads", "vit", "--peak", "vit=1000", "--plan", "/no/such/plan.json"])
    assert args.peaks == {"vit": {"bytes": 1000, "from": "--peak"}}
    monkeypatch.setattr(edge_time, "device_total_memory", lambda: TOTAL)
    with pytest.raises(SystemExit) as exit_:
        edge_time.main(["--workloads", "vit", "--peak", f"vit={TOTAL}", "--kinds", "cap"])
    assert exit_.value.code == 2 and "more than the device" in capsys.readouterr().err
