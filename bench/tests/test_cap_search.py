"""bench cap search without a GPU: the bisection as a pure coroutine against fake "fits(f)" oracles, the search's
order, bookkeeping and deadline with a fake probe runner, the command line's refusals, the probes' command lines
(dynamic.py's and train_hf.py's), and the workloads' --memory-fraction checks and out-of-memory exit."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import RESULTS, ROOT
from tests.conftest import one_line_exit_2

cap_search = pytest.importorskip("bench.cap_search")
# dynamic.py and the run environment import torch; CI's machine has none (the bookkeeping tests run there)
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
# train_hf.py builds its models with transformers
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                        or importlib.util.find_spec("transformers") is None,
                                        reason="needs torch and transformers")

GIB = 1 << 30
TOTAL = 140 * GIB


def threshold_oracle(threshold: float):
    """fits(f): a run completes exactly at caps at or above `threshold`."""
    return lambda f: f >= threshold


@pytest.mark.parametrize("threshold", [0.1001, 0.123, 0.15, 0.1777, 0.1999])
@pytest.mark.parametrize("resolution", [0.01, 0.002])
def test_bisection_converges_to_the_threshold_within_the_resolution(threshold, resolution):
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.1, 0.2, resolution), threshold_oracle(threshold))
    assert result.largest_fail < threshold <= result.smallest_fit
    assert result.smallest_fit <= result.largest_fail * (1 + resolution)
    assert 0.1 not in probed and 0.2 not in probed               # bounds known to hold are not spent on
    assert len(probed) <= math.ceil(math.log2(math.log(2) / math.log1p(resolution))) + 1


def test_bounds_already_within_the_resolution_cost_no_probe():
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.2, 0.2009, 0.01), threshold_oracle(0.2005))
    assert probed == [] and result == (0.2009, 0.2)


def test_an_upper_bound_that_fails_is_widened_until_one_fits():
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.1, 0.2, 0.01, hi_fits=False),
                                      threshold_oracle(0.3))
    assert probed[:2] == [0.2, pytest.approx(0.22)]               # the bound first, then up by WIDEN
    assert result.largest_fail < 0.3 <= result.smallest_fit <= result.largest_fail * 1.01
    assert max(probed) <= 0.3 * cap_search.WIDEN


def test_nothing_fits_up_to_the_ceiling():
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.5, 0.6, 0.01, hi_fits=False),
                                      lambda f: False)
    assert result == (None, 1.0) and probed[-1] == 1.0 and max(probed) == 1.0


def test_an_upper_bound_that_fits_when_probed_then_bisects():
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.1, 0.2, 0.01, hi_fits=False),
                                      threshold_oracle(0.15))
    assert probed[0] == 0.2 and result.largest_fail < 0.15 <= result.smallest_fit


def test_a_lower_bound_that_fits_is_widened_down_until_one_fails():
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.1, 0.2, 0.01, lo_fails=False),
                                      threshold_oracle(0.05))
    assert probed[:2] == [0.1, pytest.approx(0.1 / cap_search.WIDEN)]
    assert result.largest_fail < 0.05 <= result.smallest_fit <= result.largest_fail * 1.01


def test_a_lower_bound_that_fails_when_probed_then_bisects():
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.1, 0.2, 0.01, lo_fails=False),
                                      threshold_oracle(0.15))
    assert probed[0] == 0.1 and result.largest_fail < 0.15 <= result.smallest_fit


def test_everything_fits_down_to_the_floor():
    result, probed = cap_search.drive(cap_search.bisect_fraction(0.1, 0.2, 0.01, lo_fails=False), lambda f: True)
    assert result == (cap_search.FLOOR, None) and min(probed) == cap_search.FLOOR


# ---- the search over pairs, with a fake probe runner ----------------------------------------------------------

class FakeDevice:
    """Probes answered from per-allocator thresholds (fractions of TOTAL) and uncapped peaks, with a clock."""

    def __init__(self, thresholds: dict[str, float], peaks: dict[str, tuple[float, float]], wall_s: float = 10.0,
                 errors: set[str] = frozenset()) -> None:
        self.thresholds, self.peaks, self.wall_s, self.errors = thresholds, peaks, wall_s, errors
        self.calls: list[tuple[str, str, str, float | None]] = []
        self.clock = 0.0

    def __call__(self, workload, allocator, purpose, fraction, timeout_s) -> dict:
        self.calls.append((workload, allocator, purpose, fraction))
        self.clock += self.wall_s
        probe = {"index": len(self.calls) - 1, "workload": workload, "allocator": allocator, "purpose": purpose,
                 "fraction": fraction, "wall_s": self.wall_s, "returncode": 0}
        if allocator in self.errors and purpose == "bisect":
            return {**probe, "fit": False, "returncode": 1, "error": "Segmentation fault", "killed": False}
        if fraction is not None and fraction < self.thresholds[allocator]:
            return {**probe, "fit": False, "returncode": 3, "oom": True, "oom_step": 7}
        allocated, reserved = self.peaks[allocator]
        return {**probe, "fit": True, "timed_s": 2.0 if fraction is None else 2.2,
                "max_memory_allocated": int(allocated * TOTAL), "max_memory_reserved": int(reserved * TOTAL),
                # gmlake's driver time over the timed steps, more under a cap; torch's allocators measure none
                "driver_busy_after_s": None if allocator == "expandable" else 0.01 if fraction is None else 0.05}


def run_search(device: FakeDevice, workloads=("vit",), allocators=("expandable", "gmlake"), bounds=None,
               deadline: float | None = None, resolution: float = 0.01) -> dict:
    record: dict = {"probes": [], "pairs": []}
    time_left = (lambda: deadline - device.clock) if deadline is not None else (lambda: None)
    cap_search.search(list(workloads), list(allocators), TOTAL, resolution, bounds or {}, device, time_left, 300,
                      record, lambda: None)
    return record


def test_every_pair_brackets_its_threshold_and_is_timed_near_it():
    device = FakeDevice({"expandable": 0.155, "gmlake": 0.152}, {"expandable": (0.15, 0.16), "gmlake": (0.15, 0.17)})
    record = run_search(device)
    pairs = {p["allocator"]: p for p in record["pairs"]}
    for allocator, pair in pairs.items():
        threshold = device.thresholds[allocator]
        assert pair["status"] == "done"
        assert pair["largest_fail"] < threshold <= pair["smallest_fit"] <= pair["largest_fail"] * 1.01
        assert pair["floor"] == pytest.approx(0.15, rel=1e-6)
        assert pair["timed_fraction"] == pytest.approx(1.05 * pair["smallest_fit"])
        assert pair["time_ratio"] == pytest.approx(1.1) and pair["probes"] == len(
            [c for c in device.calls if c[1] == allocator])
    purposes = [c[2] for c in device.calls if c[1] == "gmlake"]
    assert purposes[0] == "reference" and purposes[-1] == "timed" and set(purposes[1:-1]) == {"bisect"}
    assert device.calls[0][3] is None                             # the reference runs uncapped


def test_allocators_alternate_within_a_workload_and_workloads_run_in_turn():
    device = FakeDevice({"A": 0.155, "B": 0.155}, {"A": (0.15, 0.16), "B": (0.15, 0.16)})
    run_search(device, workloads=("vit", "bert"), allocators=("A", "B"))
    order = [(w, a) for w, a, _, _ in device.calls]
    vit = [a for w, a in order if w == "vit"]
    assert vit[:4] == ["A", "B", "B", "A"]
    assert order.index(("bert", "A")) > max(i for i, (w, _) in enumerate(order) if w == "vit")


def test_bounds_from_elsewhere_are_verified_and_widened_when_they_fail():
    device = FakeDevice({"gmlake": 0.2}, {"gmlake": (0.15, 0.21)})
    record = run_search(device, allocators=("gmlake",), bounds={("vit", "gmlake"): 0.18})
    refs = [c[3] for c in device.calls if c[2] == "reference"]
    assert refs == [0.18, pytest.approx(0.198), pytest.approx(0.2178)]
    pair = record["pairs"][0]
    assert pair["status"] == "done" and pair["reference"]["fraction"] == pytest.approx(0.2178)
    assert pair["largest_fail"] < 0.2 <= pair["smallest_fit"] <= pair["largest_fail"] * 1.01
    assert min(c[3] for c in device.calls if c[2] == "bisect") > 0.198      # the failed reference bounds it


def test_a_reference_whose_peak_contradicts_a_failed_cap_keeps_to_what_was_shown():
    """Runs are not perfectly repeatable: a capped reference that fit at 0.2178 after failing at 0.198, yet peaked
    at 0.19, bisects between 0.198 and 0.2178 rather than trusting the peak."""
    device = FakeDevice({"gmlake": 0.2}, {"gmlake": (0.15, 0.19)})
    pair = run_search(device, allocators=("gmlake",), bounds={("vit", "gmlake"): 0.18})["pairs"][0]
    assert pair["status"] == "done" and pair["upper_bound"] == pytest.approx(0.2178)
    assert pair["largest_fail"] < 0.2 <= pair["smallest_fit"] <= pair["largest_fail"] * 1.01


def test_a_probe_that_crashes_ends_its_pair_as_an_error_and_the_other_goes_on():
    device = FakeDevice({"A": 0.155, "B": 0.155}, {"A": (0.15, 0.16), "B": (0.15, 0.16)}, errors={"A"})
    pairs = {p["allocator"]: p for p in run_search(device, allocators=("A", "B"))["pairs"]}
    assert pairs["A"]["status"] == "error" and "Segmentation" in pairs["A"]["error"]
    assert pairs["B"]["status"] == "done"


def test_the_deadline_stops_new_probes_and_marks_what_is_left():
    device = FakeDevice({"A": 0.155, "B": 0.155}, {"A": (0.15, 0.16), "B": (0.15, 0.16)})
    record = run_search(device, workloads=("vit", "bert"), allocators=("A", "B"), deadline=35)
    assert len(device.calls) == 3 and "deadline" in record["stopped"]
    statuses = {(p["workload"], p["allocator"]): p["status"] for p in record["pairs"]}
    assert statuses == {("vit", "A"): "unfinished", ("vit", "B"): "unfinished", ("bert", "A"): "not started",
                        ("bert", "B"): "not started"}
    table = cap_search.table({**record, "device_total_memory": TOTAL, "settings": {"steps": 20, "resolution": 0.01}})
    assert "unfinished" in table and "not started" in table


def test_a_timed_pair_under_gmlake_says_how_much_driver_time_the_cap_added():
    device = FakeDevice({"expandable": 0.155, "gmlake": 0.152}, {"expandable": (0.15, 0.16), "gmlake": (0.15, 0.16)})
    record = run_search(device)
    pairs = {p["allocator"]: p for p in record["pairs"]}
    assert pairs["gmlake"]["driver_added_s"] == pytest.approx(0.04)
    assert pairs["gmlake"]["reference"]["driver_busy_after_s"] == 0.01
    assert "driver_added_s" not in pairs["expandable"]
    record["device_total_memory"], record["settings"] = TOTAL, {"steps": 20, "resolution": 0.01}
    assert "+0.040" in cap_search.table(record) and "driver s added" in cap_search.table(record)


def test_driver_time_after_warm_up_is_the_largest_ranks_and_none_where_unmeasured():
    one = {"gmlake_after_warmup": {"driver_busy_s": 0.2}}
    assert cap_search.driver_busy_after_warmup(one) == 0.2
    assert cap_search.driver_busy_after_warmup({"ranks": [one, {"gmlake_after_warmup": {"driver_busy_s": 0.5}}]}) == 0.5
    assert cap_search.driver_busy_after_warmup({"gmlake_after_warmup": {"stitches": 1}}) is None     # before 12-01
    assert cap_search.driver_busy_after_warmup({"gmlake_after_warmup": None}) is None                # torch's
    assert cap_search.driver_busy_after_warmup({}) is None
def test_the_table_shows_each_pairs_cap_in_gib_and_its_time_ratio():
    device = FakeDevice({"gmlake": 0.155}, {"gmlake": (0.15, 0.16)})
    record = run_search(device, allocators=("gmlake",))
    table = cap_search.table({**record, "device_total_memory": TOTAL, "settings": {"steps": 20, "resolution": 0.01}})
    pair = record["pairs"][0]
    assert f"{pair['smallest_fit'] * 140:.3f}" in table and "1.100" in table and "22.40" in table   # 0.16 x 140


def test_bounds_are_read_from_a_speed_suite_summary(tmp_path):
    summary = {"runs": [{"workload": "vit", "allocator": "gmlake", "max_memory_reserved": 14 * GIB},
                        {"workload": "vit", "allocator": "gmlake", "max_memory_reserved": 21 * GIB},
                        {"workload": "vit", "allocator": "native", "error": "killed"}]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    bounds = cap_search.read_bounds(str(tmp_path / "summary.json"), TOTAL)
    assert bounds == {("vit", "gmlake"): pytest.approx(0.15)}


# ---- replay's brackets, probed first (--predict) -----------------------------------------------------------------

def test_a_replayed_bracket_that_holds_settles_a_pair_in_two_probes():
    """Replay 0.1 % apart, right: the two ends are probed first and the search ends there, far finer than the
    1 % bisection would have gone, so two allocators 0.4 % apart are told apart."""
    device = FakeDevice({"expandable": 0.1069, "gmlake": 0.1065}, {"expandable": (0.104, 0.115),
                                                                   "gmlake": (0.104, 0.107)})
    predictions = {("vit", "expandable"): (0.10685, 0.10695), ("vit", "gmlake"): (0.10645, 0.10655)}
    record: dict = {"probes": [], "pairs": []}
    cap_search.search(["vit"], ["expandable", "gmlake"], TOTAL, 0.01, {}, device, lambda: None, 300, record,
                      lambda: None, predictions)
    pairs = {p["allocator"]: p for p in record["pairs"]}
    for allocator, (fail, fit) in predictions.items():
        pair = pairs[allocator[1]]
        assert pair["status"] == "done" and pair["prediction_held"]
        assert (pair["largest_fail"], pair["smallest_fit"]) == (fail, fit)
        assert [c[2:] for c in device.calls if c[1] == allocator[1]] == [
            ("reference", None), ("bisect", fit), ("bisect", fail), ("timed", pytest.approx(1.05 * fit))]
    assert pairs["gmlake"]["smallest_fit"] < pairs["expandable"]["largest_fail"]
    table = cap_search.table({**record, "device_total_memory": TOTAL, "settings": {"steps": 20, "resolution": 0.01}})
    assert f"{0.10645 * 140:.3f} / {0.10655 * 140:.3f}" in table and "missed" not in table


# ---- settling probes: replay's thresholds tell apart what a bisection calls a tie (Note [Settling probes]) ------

def settle_search(device: FakeDevice, predictions: dict, thresholds: dict, resolution: float = 0.002) -> dict:
    record: dict = {"probes": [], "pairs": []}
    cap_search.search(["bert"], ["expandable", "gmlake"], TOTAL, resolution, {}, device, lambda: None, 300, record,
                      lambda: None, predictions, thresholds)
    return record


def test_a_probe_at_the_others_failure_settles_what_the_bisection_left_a_tie():
    """BERT in session 13: gmlake's uncapped peak was within 0.2 % of its floor, so it was never probed lower, and
    expandable segments failed at 0.14938, under gmlake's fit (0.14946). Replay has gmlake fit from 0.149342: one
    probe of gmlake at expandable segments' failure shows it below."""
    device = FakeDevice({"expandable": 0.14949, "gmlake": 0.14934}, {"expandable": (0.14917, 0.15002),
                                                                     "gmlake": (0.14917, 0.14946)})
    predictions = {("bert", "expandable"): (0.14938, 0.14959), ("bert", "gmlake"): (0.149167, 0.14946)}
    thresholds = {("bert", "expandable"): 0.149503, ("bert", "gmlake"): 0.149342}
    without = settle_search(FakeDevice(device.thresholds, device.peaks), predictions, {})
    assert without["verdicts"] == []                                  # the bisection alone: a tie
    record = settle_search(device, predictions, thresholds)
    settles = [c for c in device.calls if c[2] == "settle"]
    fail_b = next(p for p in record["pairs"] if p["allocator"] == "expandable")["largest_fail"]
    assert settles == [("bert", "gmlake", "settle", fail_b)]
    assert [(v["below"], v["above"]) for v in record["verdicts"]] == [("gmlake", "expandable")]
    gmlake = next(p for p in record["pairs"] if p["allocator"] == "gmlake")
    assert gmlake["smallest_fit_probed"] == fail_b and gmlake["probes"] == 1 + len(
        [c for c in device.calls if c[1] == "gmlake" and c[2] != "reference"])


def test_two_probes_at_the_midpoint_settle_two_allocators_that_fit_at_the_same_cap():
    """ResNet-50 in session 13: both fit 0.090274 and nothing below was probed for gmlake. Replay's thresholds
    (0.09018 and 0.09029; the GPU's expandable threshold 0.04 % under replay's) put the probe at their midpoint:
    gmlake fits there and expandable segments run out of memory."""
    device = FakeDevice({"expandable": 0.09025, "gmlake": 0.09018}, {"expandable": (0.09010, 0.09044),
                                                                     "gmlake": (0.09010, 0.09044)})
    predictions = {("bert", "expandable"): (0.090274, 0.090447), ("bert", "gmlake"): (0.090101, 0.090274)}
    thresholds = {("bert", "expandable"): 0.09029, ("bert", "gmlake"): 0.09018}
    record = settle_search(device, predictions, thresholds)
    settles = [c[1:] for c in device.calls if c[2] == "settle"]
    assert {a for a, _, _ in settles} == {"gmlake", "expandable"}
    assert all(f == pytest.approx(0.090235) for _, _, f in settles)
    assert [(v["below"], v["above"]) for v in record["verdicts"]] == [("gmlake", "expandable")]


@pytest.mark.parametrize("case, thresholds", [
    ("already shown below", {"a": 0.100, "b": 0.102}),
    ("replay has a above b", {"a": 0.1021, "b": 0.1020}),
    ("replay's thresholds closer than its margin", {"a": 0.10150, "b": 0.10151}),
])
def test_no_settling_probe_where_none_can_tell(case, thresholds):
    a = {"status": "done", "smallest_fit": 0.1016, "largest_fail": 0.1012}
    b = {"status": "done", "smallest_fit": 0.1017, "largest_fail": 0.1014}
    if case == "already shown below":
        a["smallest_fit"] = 0.1013
    assert cap_search.settle_plan({"a": a, "b": b}, thresholds) == [], case


def test_a_settling_probe_is_planned_only_for_finished_pairs_and_where_replay_has_the_other_fail():
    a = {"status": "done", "smallest_fit": 0.1016}
    b = {"status": "done", "smallest_fit": 0.1017, "largest_fail": 0.1014}
    assert cap_search.settle_plan({"a": a, "b": b}, {"a": 0.1010, "b": 0.1015}) == [(0.1014, ["a"], "a", "b")]
    assert cap_search.settle_plan({"a": a, "b": {**b, "status": "unfinished"}}, {"a": 0.1010, "b": 0.1015}) == []
    assert cap_search.settle_plan({"a": a, "b": b}, {"a": 0.1010, "b": 0.1013}) == []     # b would fit at 0.1014
    assert cap_search.settle_plan({"a": a, "b": b}, {"a": 0.1010}) == []                  # nothing replayed for b
    # b's failure too close to a's threshold: the midpoint instead, both probed
    (cap, probes, *_), = cap_search.settle_plan({"a": a, "b": b}, {"a": 0.10139, "b": 0.1016})
    assert cap == pytest.approx((0.10139 + 0.1016) / 2) and probes == ["a", "b"]


def test_verdicts_say_who_fit_where_the_other_ran_out_of_memory():
    outcomes = {"a": {"smallest_fit": 0.2, "smallest_fit_probed": 0.19, "largest_fail": 0.18},
                "b": {"smallest_fit": 0.21, "largest_fail": 0.19}}
    assert cap_search.verdicts("w", outcomes) == [{"workload": "w", "below": "a", "above": "b", "fit": 0.19,
                                                   "other_failed": 0.19}]


@pytest.mark.parametrize("threshold", [0.1031, 0.1081, 0.1149])
def test_a_replayed_bracket_that_misses_is_moved_until_it_brackets_the_threshold(threshold):
    device = FakeDevice({"gmlake": threshold}, {"gmlake": (0.1, 0.115)})
    record: dict = {"probes": [], "pairs": []}
    cap_search.search(["vit"], ["gmlake"], TOTAL, 0.002, {}, device, lambda: None, 300, record, lambda: None,
                      {("vit", "gmlake"): (0.1059, 0.1061)})
    pair = record["pairs"][0]
    assert pair["status"] == "done" and not pair["prediction_held"]
    assert pair["largest_fail"] < threshold <= pair["smallest_fit"] <= pair["largest_fail"] * 1.002
    ceiling = 0.115 + cap_search.SLACK / TOTAL                                    # the reference's peak reserved
    assert all(0.1 <= c[3] <= ceiling for c in device.calls if c[2] == "bisect")   # inside what it showed
    assert "(missed)" in cap_search.table({**record, "device_total_memory": TOTAL,
                                           "settings": {"steps": 20, "resolution": 0.002}})


def test_replay_policies_of_the_suites_allocators(monkeypatch):
    assert [cap_search.replay_policy(a) for a in ("native", "expandable", "gmlake", "gmlake-paper-8m", "gmlake-wait")
            ] == ["caching", "expandable", "gmlake", "gmlake-paper[chunk_size=8388608]",
                  "gmlake[cross_stream_wait=true]"]
    with pytest.raises(ValueError, match="no replay policy"):
        cap_search.replay_policy("tcmalloc")
    monkeypatch.setitem(cap_search.train_suite.ALLOCATORS, "odd", ["--policy", "gmlake", "--trace-to", "x"])
    with pytest.raises(ValueError, match="no replay policy for allocator 'odd'"):     # a flag replay has no knob for
        cap_search.replay_policy("odd")


def test_predicted_brackets_are_replays_smallest_caps_as_fractions():
    from gmlake.sim.cap import smallest_cap
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    trace_path = str(ROOT / "tests" / "data" / "tiny-gpt2-native.pickle.gz")
    brackets, rows = cap_search.predict_brackets({"t5": [trace_path]}, ["expandable", "gmlake"], TOTAL)
    for allocator, policy in (("expandable", "expandable"), ("gmlake", "gmlake")):
        fit, fail, _ = smallest_cap(load(trace_path), policy)
        lo, hi = brackets["t5", allocator]
        assert int(lo * TOTAL) <= fail < fit <= int(hi * TOTAL) <= fit + cap_search.SLACK
        row = next(r for r in rows if r["allocator"] == allocator)
        assert {"workload": "t5", "allocator": allocator, "policy": policy, "largest_fail": fail,
                "smallest_fit": fit}.items() <= row.items()
        # replay's threshold to 0.01 %, for settling probes: inside the bracket, and replay fits there
        assert fail < row["threshold"] <= fit
        assert replay(load(trace_path), policy, cap=row["threshold"], samples=0).ooms == 0
        assert replay(load(trace_path), policy, cap=int(row["threshold"] / (1 + 2 * cap_search.SETTLE_RESOLUTION)),
                      samples=0).ooms > 0
    thresholds = cap_search.replay_thresholds(rows, TOTAL)
    assert thresholds == {("t5", r["allocator"]): r["threshold"] / TOTAL for r in rows}



def test_a_workload_of_several_rank_traces_takes_its_largest_ranks_bracket(tmp_path):
    """FSDP: every rank runs under the same cap, so the job's smallest cap is its largest rank's. The tiny trace's
    requests doubled in size make the larger rank; whichever order the ranks come in, its bracket is the one."""
    from gmlake.sim.trace import load, save_compact

    small = load(ROOT / "tests" / "data" / "tiny-gpt2-native.pickle.gz")
    large = type(small)(small.events.copy(), dict(small.meta))
    large.events["size"] *= 2
    paths = [str(save_compact(t, tmp_path / f"rank{i}.gmtrace")) for i, t in enumerate((small, large))]
    alone, _ = cap_search.predict_brackets({"fsdp": [paths[1]]}, ["expandable", "gmlake"], TOTAL)
    for ranks in (paths, paths[::-1]):
        brackets, rows = cap_search.predict_brackets({"fsdp": ranks}, ["expandable", "gmlake"], TOTAL)
        assert brackets == alone and len(rows) == 4
    smaller, _ = cap_search.predict_brackets({"fsdp": [paths[0]]}, ["gmlake"], TOTAL)
    assert smaller["fsdp", "gmlake"][1] < alone["fsdp", "gmlake"][1]


def fake_capture_run(snapshot_for_rank: dict[int, Path], returncode: int = 0):
    """A subprocess.run that plays a capture run: writes the given snapshot of each rank where the command's
    --snapshot puts it (ranks r > 0 as fsdp_train.py names them, for an FSDP job only), and records the command."""
    calls = []

    def run(cmd, env, **kwargs):
        calls.append((cmd, env))
        target = cmd[cmd.index("--snapshot") + 1]
        if returncode == 0:
            from bench.workloads.fsdp_train import rank_path

            for rank, source in snapshot_for_rank.items():
                if rank == 0 or "bench.workloads.fsdp_train" in cmd:    # ranks: FSDP's alone
                    Path(rank_path(target, rank)).write_bytes(source.read_bytes())
        return subprocess.CompletedProcess(cmd, returncode, "", "" if returncode == 0 else "Traceback...\nboom")
    return run, calls


@needs_torch
def test_capture_runs_each_workload_once_uncapped_under_native_and_keeps_its_traces(tmp_path, monkeypatch):
    tiny = ROOT / "tests" / "data" / "tiny-gpt2-native.pickle.gz"
    run, calls = fake_capture_run({0: tiny, 1: tiny})
    monkeypatch.setattr(cap_search.harness, "run_process", as_process(run))
    settings = cap_search.parse_args(["--workloads", "t5", "opt1.3b-fsdp-lora-ckpt", "--capture"])
    traces, records = cap_search.capture_traces(settings.capture, settings, tmp_path, 60, lambda: None)
    assert [c[0][c[0].index("--snapshot") + 1] for c in calls] == [
        str(tmp_path / "traces" / "t5.pickle.gz"), str(tmp_path / "traces" / "opt1_3b-fsdp-lora-ckpt.pickle.gz")]
    for cmd, env in calls:
        assert "--memory-fraction" not in cmd and "gmlake" not in cmd           # torch's native allocator, no cap
        assert "expandable" not in env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    assert calls[0][0][calls[0][0].index("--steps") + 1] == "20"               # as its probes run
    assert [len(traces[w]) for w in ("t5", "opt1.3b-fsdp-lora-ckpt")] == [1, 2]
    assert traces["opt1.3b-fsdp-lora-ckpt"][1].endswith("opt1_3b-fsdp-lora-ckpt.rank1.gmtrace")
    assert not list((tmp_path / "traces").glob("*.pickle.gz"))                 # kept compact
    assert [r["returncode"] for r in records] == [0, 0] and all("traces" in r for r in records)


@needs_torch
def test_a_capture_that_fails_or_has_no_time_leaves_its_workload_unpredicted(tmp_path, monkeypatch):
    run, _ = fake_capture_run({}, returncode=1)
    monkeypatch.setattr(cap_search.harness, "run_process", as_process(run))
    settings = cap_search.parse_args(["--workloads", "t5", "--capture", "t5"])
    traces, records = cap_search.capture_traces(["t5"], settings, tmp_path, 60, lambda: None)
    assert traces == {} and "boom" in records[0]["error"]
    traces, records = cap_search.capture_traces(["t5"], settings, tmp_path, 60, lambda: 5.0)
    assert traces == {} and records[0]["error"].startswith("deadline")


@needs_torch
def test_main_with_capture_predicts_from_the_captured_trace(tmp_path, monkeypatch, capsys):
    tiny = ROOT / "tests" / "data" / "tiny-gpt2-native.pickle.gz"
    brackets, _ = cap_search.predict_brackets({"t5": [str(tiny)]}, ["expandable", "gmlake"], TOTAL)
    middle = {a: math.sqrt(lo * hi) for (_, a), (lo, hi) in brackets.items()}
    device = FakeDevice(middle, {a: (brackets["t5", a][0] * 0.99, brackets["t5", a][1] * 1.05) for a in middle})
    run, calls = fake_capture_run({0: tiny})
    monkeypatch.setattr(cap_search.harness, "run_process", as_process(run))
    monkeypatch.setattr(cap_search, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_search, "environment", lambda: {"torch": "none"})
    monkeypatch.setattr(cap_search, "run_probe", lambda *args, settings, out, index: {**device(*args), "index": index})
    cap_search.main(["--workloads", "t5", "--out", str(tmp_path), "--capture"])
    record = json.loads((tmp_path / "cap.json").read_text())
    assert len(calls) == 1 and record["captures"][0]["traces"] == [str(tmp_path / "traces" / "t5.gmtrace")]
    assert all(p["status"] == "done" and p["prediction_held"] for p in record["pairs"])
    assert {r["trace"] for r in record["predictions"]} == {str(tmp_path / "traces" / "t5.gmtrace")}
    assert "capture t5" in capsys.readouterr().out


# ---- command lines ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--resolution", "0"], "--resolution"), (["--resolution", "x"], "--resolution"),
    (["--workloads", "gpt"], "invalid choice"), (["--allocators", "tcmalloc"], "invalid choice"),
    (["--steps", "0"], "--steps"), (["--deadline", "-1"], "--deadline"),
    (["--bounds-from", "/no/such/summary.json"], "no such file"), (["--bogus"], "unrecognized"),
    (["--workloads", "t5", "--predict", "t5"], "WORKLOAD=TRACE"),
    (["--workloads", "t5", "--predict", "vit=tests/data/tiny-gpt2-native.pickle.gz"], "one of --workloads"),
    (["--workloads", "t5", "--predict", "t5=/no/such.gmtrace"], "no such file"),
    (["--workloads", "t5", "--capture", "vit"], "--capture vit"),
    (["--workloads", "t5", "--predict", "t5=tests/data/tiny-gpt2-native.pickle.gz", "--capture", "t5"], "--capture t5"),
    (["--workloads", "t5", "--predict", "t5=tests/data/tiny-gpt2-native.pickle.gz", "--capture"], "every workload")])
def test_cap_search_refuses_bad_input_in_one_line(args, says):
    assert says in one_line_exit_2(["-m", "bench", "cap", "search", *args])


def test_cap_search_takes_both_suites_workloads_each_with_its_own_allocators():
    args = cap_search.parse_args(["--workloads", "vit", "gpt2xl-lora-ckpt", "opt1.3b-offload", "--allocators",
                                  "expandable", "gmlake"])
    assert args.workloads == ["vit", "gpt2xl-lora-ckpt", "opt1.3b-offload"]
    assert cap_search.parse_args(["--workloads", "opt1.3b-lora", "--allocators", "gmlake-paper-8m"]).allocators == [
        "gmlake-paper-8m"]
    assert cap_search.parse_args([]).workloads == ["vit", "bert", "t5", "cnn"]      # the default stays the quick ones


def as_process(fake):
    """A stand-in for harness.run_process from a fake of subprocess.run (cmd, env) -> CompletedProcess."""
    return lambda cmd, env, timeout_s: (fake(cmd, env), False)


def flag(cmd: list[str], name: str) -> str:
    """The value after `name` in a command line."""
    return cmd[cmd.index(name) + 1]


def captured_probe(monkeypatch, tmp_path, workload: str, allocator: str, fraction: float | None,
                   settings_args: list[str]) -> tuple[list[str], dict, dict]:
    """run_probe with subprocess.run faked: the command and environment it started, and its probe record (the fake
    answers as a workload out of memory under the cap at step 2 does)."""
    started = {}

    def fake_run(cmd, env, **kwargs):
        started.update(cmd=cmd, env=env)
        Path(flag(cmd, "--json")).write_text(json.dumps({"oom": True, "oom_step": 2, "max_memory_allocated": 1,
                                                         "max_memory_reserved": 2}))
        return subprocess.CompletedProcess(cmd, cap_search.OOM_EXIT, "", "train_hf.py: out of memory at step 2")

    monkeypatch.setattr(cap_search.harness, "run_process", as_process(fake_run))
    settings = cap_search.parse_args(["--workloads", workload, "--allocators", allocator, *settings_args])
    probe = cap_search.run_probe(workload, allocator, "bisect", fraction, 60, settings=settings, out=tmp_path,
                                 index=4)
    return started["cmd"], started["env"], probe


@pytest.mark.parametrize("allocator, launcher, alloc_conf", [
    ("gmlake", ["-m", "gmlake", "run"], ""),
    ("gmlake-paper-8m", ["-m", "gmlake", "run", "--policy", "gmlake-paper", "--chunk-size", str(8 << 20)], ""),
    ("expandable", [], "expandable_segments:True"),
    ("native", [], "")])
def test_a_train_workload_probe_is_train_hf_started_as_the_train_suite_starts_it(monkeypatch, tmp_path, allocator,
                                                                                 launcher, alloc_conf):
    cmd, env, probe = captured_probe(monkeypatch, tmp_path, "gpt2xl-lora-ckpt", allocator, 0.06,
                                     ["--steps", "12", "--seed", "7"])
    script = cmd.index("bench.workloads.train_hf")
    assert cmd[:script] == [sys.executable, *launcher, "-m"] and env["PYTORCH_CUDA_ALLOC_CONF"] == alloc_conf
    assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)         # the workload is this checkout's
    assert cmd[script + 1:script + 5] == ["--model", "gpt2-xl", "--lora", "--ckpt"]
    assert (flag(cmd, "--steps"), flag(cmd, "--warmup"), flag(cmd, "--seed")) == ("12", "3", "7")
    assert (flag(cmd, "--min-batch"), flag(cmd, "--max-batch")) == ("2", "8")        # train_suite.py's defaults
    assert flag(cmd, "--json") == str(tmp_path / "probes" / f"004-gpt2xl-lora-ckpt-{allocator}-bisect.json")
    assert "." not in Path(flag(cmd, "--json")).stem       # no dot before the suffix: FSDP ranks add .rank<r>
    assert flag(cmd, "--gpu-time-steps") == "0" and cmd[-2:] == ["--memory-fraction", "0.06"]
    assert "--max-batch-search" not in cmd and "--cap-gib" not in cmd and "--offload" not in cmd
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert probe["oom"] and not probe["fit"] and probe["oom_step"] == 2 and "error" not in probe


def test_a_reference_probe_runs_uncapped_and_a_dynamic_workload_still_runs_dynamic_py(monkeypatch, tmp_path):
    cmd, _, _ = captured_probe(monkeypatch, tmp_path, "opt1.3b-offload", "gmlake", None, [])
    assert "--memory-fraction" not in cmd and cmd[cmd.index("--model") + 1:cmd.index("--steps")] == [
        "opt-1.3b", "--offload"]
    cmd, env, _ = captured_probe(monkeypatch, tmp_path, "t5", "expandable", 0.1, ["--warmup", "2"])
    assert cmd[1:3] == ["-m", "bench.workloads.dynamic"] and flag(cmd, "--workload") == "t5"
    assert flag(cmd, "--warmup") == "2" and flag(cmd, "--gpu-time-steps") == "0" and cmd[-1] == "0.1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and "--min-batch" not in cmd


def test_an_fsdp_probe_is_a_torchrun_job_whose_rank_tells_out_of_memory(monkeypatch, tmp_path):
    """FSDP runs under torchrun on every visible GPU; a rank that runs out of memory under the cap writes its own
    summary (rank r > 0 beside the probe's, as NAME.rank<r>.json) and torchrun ends the job with its own status:
    the rank's file makes it an out-of-memory probe, its absence a crash."""
    started = {}

    def fake_run(cmd, env, **kwargs):
        started.update(cmd=cmd)
        json_path = Path(flag(cmd, "--json"))
        if started.get("oom"):
            rank1 = json_path.with_name(json_path.stem + ".rank1" + json_path.suffix)
            rank1.write_text(json.dumps({"rank": 1, "oom": True, "oom_step": 5, "max_memory_allocated": 3,
                                         "max_memory_reserved": 4}))
        return subprocess.CompletedProcess(cmd, 1, "", "torch.distributed.elastic...ChildFailedError")

    monkeypatch.setattr(cap_search.harness, "run_process", as_process(fake_run))
    workload = "opt1.3b-fsdp-lora-ckpt"
    settings = cap_search.parse_args(["--workloads", workload, "--allocators", "gmlake", "--steps", "12"])
    started["oom"] = True
    probe = cap_search.run_probe(workload, "gmlake", "bisect", 0.05, 60, settings=settings, out=tmp_path, index=7)
    cmd = started["cmd"]
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
    assert cmd[5:10] == ["-m", "gmlake", "run", "-m", "bench.workloads.fsdp_train"]
    assert (flag(cmd, "--steps"), flag(cmd, "--warmup")) == ("12", "3") and "--seed" not in cmd
    assert flag(cmd, "--gpu-time-steps") == "0" and cmd[-2:] == ["--memory-fraction", "0.05"]
    assert probe["oom"] and not probe["fit"] and probe["oom_step"] == 5 and "error" not in probe
    started["oom"] = False                               # the same exit, no rank's summary: a crash, and stale
    probe = cap_search.run_probe(workload, "gmlake", "bisect", 0.05, 60, settings=settings, out=tmp_path, index=7)
    assert not probe.get("oom") and "ChildFailedError" in probe["error"]       # files of an earlier probe removed


@pytest.mark.parametrize("args, says", [
    (["--memory-fraction", "2"], "needs a number in (0, 1]"), (["--memory-fraction", "x"], "needs a number"),
    (["--memory-fraction", "0.5", "--gpu-time-steps", "2"], "--gpu-time-steps N > 0"),
    (["--steps", "4", "--warmup", "4"], "--warmup")])
def test_fsdp_train_refuses_bad_input_before_starting_in_one_line(args, says):
    pytest.importorskip("torch")
    assert says in one_line_exit_2(["-m", "bench.workloads.fsdp_train", *args])


def test_bounds_are_read_from_a_train_suite_results_file(tmp_path):
    results = {"environment": {}, "runs": [
        {"workload": "opt1.3b-offload", "allocator": "gmlake", "returncode": 0, "max_memory_reserved": 14 * GIB,
         "max_batch_under_cap": 40},
        {"workload": "gpt2xl-lora-ckpt", "allocator": "gmlake", "returncode": 1, "error": "Traceback ..."}]}
    (tmp_path / "train.json").write_text(json.dumps(results))
    assert cap_search.read_bounds(str(tmp_path / "train.json"), TOTAL) == {
        ("opt1.3b-offload", "gmlake"): pytest.approx(0.1)}


def test_an_fsdp_runs_bound_is_its_largest_rank():
    """The FSDP suite's JSON records peaks per rank (bench/results/train/fsdp-2026-11-30d: gmlake's ranks reserved 6.77
    and 7.25 GiB in its first run, 6.71 and 7.33 in its second)."""
    path = RESULTS / "train" / "fsdp-2026-11-30d" / "train-fsdp.json"
    runs = json.loads(path.read_text())["runs"]
    largest = max(rank["max_memory_reserved"] for run in runs if run["allocator"] == "gmlake" for rank in run["ranks"])
    bounds = cap_search.read_bounds(str(path), TOTAL)
    assert bounds[("opt1.3b-fsdp-lora-ckpt", "gmlake")] == pytest.approx((largest + cap_search.SLACK) / TOTAL)
    assert set(bounds) == {("opt1.3b-fsdp-lora-ckpt", a) for a in ("native", "expandable", "gmlake", "gmlake-page4m")}


@needs_torch
@pytest.mark.parametrize("value", ["0", "1.5", "-0.1", "nan", "abc", "inf"])
def test_dynamic_refuses_a_memory_fraction_outside_0_1(value):
    err = one_line_exit_2(["-m", "bench.workloads.dynamic", "--workload", "cnn", "--memory-fraction", value])
    assert "--memory-fraction needs a number in (0, 1]" in err


@needs_torch
def test_dynamic_refuses_a_memory_fraction_on_the_cpu():
    err = one_line_exit_2(["-m", "bench.workloads.dynamic", "--workload", "cnn", "--device", "cpu", "--size", "small",
                           "--memory-fraction", "0.5"])
    assert "needs --device cuda" in err


@needs_torch
def test_dynamic_refuses_a_snapshot_on_the_cpu():
    err = one_line_exit_2(["-m", "bench.workloads.dynamic", "--workload", "cnn", "--device", "cpu", "--size", "small",
                           "--snapshot", "x.pickle.gz"])
    assert "--snapshot" in err and "needs --device cuda" in err


@needs_torch
@pytest.mark.parametrize("args, says", [
    (["--memory-fraction", "2", "--device", "cpu"], "--memory-fraction needs a number in (0, 1], got 2"),
    (["--memory-fraction", "x"], "--memory-fraction needs a number in (0, 1], got 'x'"),
    (["--memory-fraction", "0.5", "--device", "cpu"], "--memory-fraction needs --device cuda"),
    (["--memory-fraction", "0.5", "--max-batch-search"], "--memory-fraction takes no --max-batch-search")])
def test_train_hf_refuses_a_bad_memory_fraction_in_one_line(args, says):
    err = one_line_exit_2(["-m", "bench.workloads.train_hf", "--model", "tiny-gpt2", *args])
    assert err.startswith("train_hf.py: --memory-fraction ") and says in err and "Traceback" not in err


def run_train_hf(tmp_path, *args: str) -> dict:
    """A CPU smoke run of train_hf.py on the tiny GPT-2, its summary."""
    out = tmp_path / "train.json"
    proc = subprocess.run([sys.executable, "-m", "bench.workloads.train_hf", "--model", "tiny-gpt2", "--device", "cpu",
                           "--min-batch", "1", "--max-batch", "2", "--min-seq", "16", "--max-seq", "64",
                           "--json", str(out), *args], check=False, capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@needs_transformers
@pytest.mark.parametrize("args, warmup", [([], 1), (["--warmup", "3"], 3)])
def test_train_hf_times_the_steps_after_warmup(tmp_path, args, warmup):
    summary = run_train_hf(tmp_path, "--steps", "5", "--gpu-time-steps", "1", *args)
    timed = summary["per_step"][warmup:]
    assert summary["warmup_steps"] == warmup and len(summary["per_step"]) == 5
    assert summary["timed_s"] == pytest.approx(sum(s["step_s"] for s in timed), rel=1e-12)
    assert summary["timed_s"] < sum(s["step_s"] for s in summary["per_step"])
    assert summary["tokens_per_s"] == pytest.approx(sum(s["batch"] * s["seq"] for s in timed) / summary["timed_s"])
    assert len(summary["gpu_time"]) == 1 and "oom" not in summary and "memory_fraction" not in summary


@pytest.fixture
def capped_train_hf(monkeypatch, tmp_path):
    """train_hf.main() as under `--memory-fraction 0.06` on a CUDA device, with CUDA faked: the cap is recorded and
    training replaced by `fake_train` (set by the test); returns (run, calls)."""
    pytest.importorskip("torch")
    train_hf = pytest.importorskip("bench.workloads.train_hf")
    from bench.workloads import common

    calls: list = []
    peaks = {"max_memory_allocated": 3 * GIB, "max_memory_reserved": 4 * GIB}
    monkeypatch.setattr(train_hf.torch.cuda, "set_per_process_memory_fraction", lambda f: calls.append(("cap", f)))
    monkeypatch.setattr(common, "memory_peaks", lambda: peaks)
    monkeypatch.setattr(train_hf, "memory_peaks", lambda: peaks)

    def run(fake_train, *args: str) -> dict:
        monkeypatch.setattr(train_hf, "train", fake_train)
        monkeypatch.setattr(sys, "argv", ["train_hf.py", "--model", "tiny-gpt2", "--steps", "8", "--memory-fraction",
                                          "0.06", "--json", str(tmp_path / "out.json"), *args])
        train_hf.main()
        return json.loads((tmp_path / "out.json").read_text())

    return run, calls


def fake_steps(calls: list, steps: list[dict], count: int) -> None:
    """What train() appends for `count` completed steps, noting that training began."""
    calls.append(("train",))
    steps += [{"batch": 2, "seq": 64, "step_s": 0.5, "loss": 1.0} for _ in range(count)]


@needs_torch
def test_train_hf_out_of_memory_under_its_cap_writes_the_summary_and_exits_3(capped_train_hf, tmp_path, capsys):
    import torch

    run, calls = capped_train_hf

    def out_of_memory(args, device, steps):
        fake_steps(calls, steps, 3)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    with pytest.raises(SystemExit) as stopped:
        run(out_of_memory)
    assert stopped.value.code == 3 == cap_search.OOM_EXIT
    assert calls[:2] == [("cap", 0.06), ("train",)]                   # the cap before the model is built
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["oom"] is True and summary["oom_step"] == 3 and summary["memory_fraction"] == 0.06
    assert summary["max_memory_reserved"] == 4 * GIB and summary["model"] == "tiny-gpt2"
    assert summary["warmup_steps"] == 2 and len(summary["per_step"]) == 3
    assert summary["error"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert capsys.readouterr().err == "train_hf.py: out of memory at step 3 under memory fraction 0.06\n"


@needs_torch
def test_train_hf_under_a_cap_raises_any_other_error_and_runs_nothing_after_training(capped_train_hf):
    run, calls = capped_train_hf

    def crash(args, device, steps):
        fake_steps(calls, steps, 1)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        run(crash)

    def fits(args, device, steps):
        fake_steps(calls, steps, args.steps)
        return (lambda batch, seq: calls.append(("extra step", batch, seq))), None

    summary = run(fits)
    assert summary["oom"] is False and summary["memory_fraction"] == 0.06 and summary["timed_s"] == 3.0
    assert "gpu_time" not in summary and summary["max_batch_under_cap"] is None
    assert not [c for c in calls if c[0] == "extra step"]             # no profiled steps, no batch search


def test_dynamic_knows_gmlakes_out_of_memory_error_and_torchs():
    dynamic = pytest.importorskip("bench.workloads.dynamic")
    torch = pytest.importorskip("torch")
    assert dynamic.parse_fraction(None) is None and dynamic.parse_fraction("1") == 1.0
    assert dynamic.out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert dynamic.out_of_memory(RuntimeError("gmlake: CUDA out of memory on device 0: tried to allocate 2.00 MiB"))
    assert not dynamic.out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not dynamic.out_of_memory(ValueError("out of memory"))


@needs_torch
def test_a_probe_is_a_fresh_dynamic_py_process_started_as_the_speed_suite_starts_it(tmp_path):
    """The plumbing on the CPU (a fraction needs CUDA, so the capped probe is refused, which is an error, not an
    out-of-memory answer): exit 0 and its JSON make a fit, any exit but 3 an error that stops the pair."""
    settings = cap_search.parse_args(["--steps", "3", "--size", "small"])
    settings.device = "cpu"
    fit = cap_search.run_probe("cnn", "native", "reference", None, 120, settings=settings, out=tmp_path, index=0)
    assert fit["fit"] and fit["returncode"] == 0 and fit["timed_s"] > 0 and "error" not in fit
    assert (tmp_path / "probes" / "000-cnn-native-reference.json").exists()
    capped = cap_search.run_probe("cnn", "native", "bisect", 0.5, 120, settings=settings, out=tmp_path, index=1)
    assert not capped["fit"] and capped["returncode"] == 2 and "needs --device cuda" in capped["error"]
    assert "oom" not in capped and capped["killed"] is False


@needs_torch
def test_main_writes_cap_json_after_every_probe_and_prints_the_table(tmp_path, monkeypatch, capsys):
    device = FakeDevice({"expandable": 0.155, "gmlake": 0.152}, {"expandable": (0.15, 0.16), "gmlake": (0.15, 0.16)})
    saved: list[int] = []

    def fake_probe(workload, allocator, purpose, fraction, timeout_s, *, settings, out, index):
        if (out / "cap.json").exists():
            saved.append(len(json.loads((out / "cap.json").read_text())["probes"]))
        return {**device(workload, allocator, purpose, fraction, timeout_s), "index": index}

    monkeypatch.setattr(cap_search, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_search, "run_probe", fake_probe)
    cap_search.main(["--workloads", "vit", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "cap.json").read_text())
    assert len(record["probes"]) == len(device.calls) and saved == list(range(1, len(device.calls)))
    assert [p["status"] for p in record["pairs"]] == ["done", "done"] and record["device_total_memory"] == TOTAL
    assert "torch" in record["environment"] and record["settings"]["resolution"] == 0.01
    assert "smallest memory fraction" in capsys.readouterr().out


def test_main_with_predict_replays_the_trace_first_and_probes_its_bracket(tmp_path, monkeypatch, capsys):
    """--predict end to end, with a fake device whose thresholds lie inside replay's brackets of the tiny trace: the
    predictions land in cap.json, each pair is settled by its two predicted probes, and the table shows them."""
    trace = str(ROOT / "tests" / "data" / "tiny-gpt2-native.pickle.gz")
    brackets, _ = cap_search.predict_brackets({"t5": [trace]}, ["expandable", "gmlake"], TOTAL)
    middle = {a: math.sqrt(lo * hi) for (_, a), (lo, hi) in brackets.items()}
    device = FakeDevice(middle, {a: (brackets["t5", a][0] * 0.99, brackets["t5", a][1] * 1.05) for a in middle})
    monkeypatch.setattr(cap_search, "device_total_memory", lambda: TOTAL)
    monkeypatch.setattr(cap_search, "environment", lambda: {"torch": "none"})
    monkeypatch.setattr(cap_search, "run_probe", lambda *args, settings, out, index: {**device(*args), "index": index})
    cap_search.main(["--workloads", "t5", "--out", str(tmp_path), "--predict", f"t5={trace}"])
    record = json.loads((tmp_path / "cap.json").read_text())
    assert {(r["allocator"], r["policy"]) for r in record["predictions"]} == {("expandable", "expandable"),
                                                                             ("gmlake", "gmlake")}
    for pair in record["pairs"]:
        lo, hi = brackets["t5", pair["allocator"]]
        assert pair["status"] == "done" and pair["prediction_held"]
        assert (pair["largest_fail"], pair["smallest_fit"]) == (pytest.approx(lo), pytest.approx(hi))
        assert [c[3] for c in device.calls if c[1] == pair["allocator"] and c[2] == "bisect"] == [
            pytest.approx(hi), pytest.approx(lo)]
    assert "replay OOM / fit GiB" in capsys.readouterr().out


def test_counters_since_warm_up_carry_the_measured_driver_time():
    """bench/workloads/common.py: the seconds measured inside the driver's calls (Driver.busy_seconds) are
    differenced like the counters, beside the call counts replay prices."""
    pytest.importorskip("torch")
    from bench.workloads import common

    before = {**dict.fromkeys(common.GMLAKE_COUNTERS, 0), "calls": {"map": 3}, "handles": {"map": 3},
              "driver_busy_s": 0.5}
    after = {**before, "stitches": 2, "stream_waits": 1, "calls": {"map": 5, "event_wait": 1},
             "handles": {"map": 7, "event_wait": 0}, "driver_busy_s": 0.75}
    since = common.counters_since(before, after)
    assert since["driver_busy_s"] == pytest.approx(0.25) and since["driver_calls"] == 3
    assert since["stitches"] == 2 and since["stream_waits"] == 1
    older = {k: v for k, v in before.items() if k != "driver_busy_s"}      # a reading from before it was recorded
    assert "driver_busy_s" not in common.counters_since(older, after)


def test_settling_plans_session_13s_hand_placed_probes_from_its_real_searches(monkeypatch):
    """Session 13's BERT and ResNet-50 searches (bench/results/train/cap-2026-12-01h), with replay's thresholds from
    the traces they captured: the plan is the probes placed by hand there (bench cap probe, at 22,421,000,000 and
    13,540,000,000 bytes), and replay expects each planned probe to settle the order. Those searches ran gmlake's
    default before re-backing, replayed as it is spelled now."""
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    as_run = "gmlake[capped_page_large=4MiB,reback_slot=0,restitch_limit=0,device_reserve=0,edge_page=0]"
    policy_of = cap_search.replay_policy
    monkeypatch.setattr(cap_search, "replay_policy", lambda a: as_run if a == "gmlake" else policy_of(a))

    record = json.loads((RESULTS / "train" / "cap-2026-12-01h" / "cap.json").read_text())
    total = record["device_total_memory"]
    planned = {}
    for workload in ("bert", "cnn"):
        trace = str(ROOT / "tests" / "data" / "results" / "traces" / f"{workload}-20steps-native.gmtrace")
        _, rows = cap_search.predict_brackets({workload: [trace]}, ["expandable", "gmlake"], total)
        thresholds = {a: t for (_, a), t in cap_search.replay_thresholds(rows, total).items()}
        outcomes = {p["allocator"]: p for p in record["pairs"] if p["workload"] == workload}
        (cap, probes, below, above), = cap_search.settle_plan(outcomes, thresholds)
        assert (below, above) == ("gmlake", "expandable")
        planned[workload] = (int(cap * total), probes)
        assert replay(load(trace), as_run, cap=int(cap * total), samples=0).ooms == 0
        assert replay(load(trace), "expandable", cap=int(cap * total), samples=0).ooms > 0
    assert planned["bert"] == (pytest.approx(22_423_378_995, abs=1), ["gmlake"])      # expandable's failure there
    assert planned["cnn"][1] == ["gmlake", "expandable"]                              # the midpoint, both probed
    assert 13_537_191_484 < planned["cnn"][0] < 13_550_976_220
