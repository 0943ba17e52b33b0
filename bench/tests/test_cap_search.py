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

from bench import ROOT
from gmlake.sim import cap  # the bisection the search drives
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
    result, probed = cap.drive(cap.bisect_fraction(0.1, 0.2, resolution), threshold_oracle(threshold))
    assert result.largest_fail < threshold <= result.smallest_fit
    assert result.smallest_fit <= result.largest_fail * (1 + resolution)
    assert 0.1 not in probed and 0.2 not in probed               # bounds known to hold are not spent on
    assert len(probed) <= math.ceil(math.log2(math.log(2) / math.log1p(resolution))) + 1


def test_bounds_already_within_the_resolution_cost_no_probe():
    result, probed = cap.drive(cap.bisect_fraction(0.2, 0.2009, 0.01), threshold_oracle(0.2005))
    assert probed == [] and result == (0.2009, 0.2)


def test_an_upper_bound_that_fails_is_widened_until_one_fits():
    result, probed = cap.drive(cap.bisect_fraction(0.1, 0.2, 0.01, hi_fits=False),
                                      threshold_oracle(0.3))
    assert probed[:2] == [0.2, pytest.approx(0.22)]               # the bound first, then up by WIDEN
    assert result.largest_fail < 0.3 <= result.smallest_fit <= result.largest_fail * 1.01
    assert max(probed) <= 0.3 * cap.WIDEN


def test_nothing_fits_up_to_the_ceiling():
    result, probed = cap.drive(cap.bisect_fraction(0.5, 0.6, 0.01, hi_fits=False),
                                      lambda f: False)
    assert result == (None, 1.0) and probed[-1] == 1.0 and max(probed) == 1.0


def test_an_upper_bound_that_fits_when_probed_then_bisects():
    result, probed = cap.drive(cap.bisect_fraction(0.1, 0.2, 0.01, hi_fits=False),
                                      threshold_oracle(0.15))
    assert probed[0] == 0.2 and result.largest_fail < 0.15 <= result.smallest_fit


def test_a_lower_bound_that_fits_is_widened_down_until_one_fails():
    result, probed = cap.drive(cap.bisect_fraction(0.1, 0.2, 0.01, lo_fails=False),
                                      threshold_oracle(0.05))
    assert probed[:2] == [0.1, pytest.approx(0.1 / cap.WIDEN)]
    assert result.largest_fail < 0.05 <= result.smallest_fit <= result.largest_fail * 1.01


def test_a_lower_bound_that_fails_when_probed_then_bisects():
    result, probed = cap.drive(cap.bisect_fraction(0.1, 0.2, 0.01, lo_fails=False),
                                      threshold_oracle(0.15))
    assert probed[0] == 0.1 and result.largest_fail < 0.15 <= result.smallest_fit


def test_everything_fits_down_to_the_floor():
    result, probed = cap.drive(cap.bisect_fraction(0.1, 0.2, 0.01, lo_fails=False), lambda f: True)
    assert result == (cap.FLOOR, None) and min(probed) == cap.FLOOR


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


def run_search(device: FakeDevice, workloads=("vit",), allocators=("expandable", "gmlake"),
               deadline: float | None = None, resolution: float = 0.01) -> dict:
    record: dict = {"probes": [], "pairs": []}
    time_left = (lambda: deadline - device.clock) if deadline is not None else (lambda: None)
    cap_search.search(list(workloads), list(allocators), TOTAL, resolution, device, time_left, 300, record,
                      lambda: None)
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


def test_verdicts_say_who_fit_where_the_other_ran_out_of_memory():
    outcomes = {"a": {"smallest_fit": 0.2, "smallest_fit_probed": 0.19, "largest_fail": 0.18},
                "b": {"smallest_fit": 0.21, "largest_fail": 0.19}}
    assert cap_search.verdicts("w", outcomes) == [{"workload": "w", "below": "a", "above": "b", "fit": 0.19,
                                                   "other_failed": 0.19}]


# ---- command lines ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--resolution", "0"], "--resolution"), (["--resolution", "x"], "--resolution"),
    (["--workloads", "gpt"], "invalid choice"), (["--allocators", "tcmalloc"], "invalid choice"),
    (["--steps", "0"], "--steps"), (["--deadline", "-1"], "--deadline"),
    (["--bogus"], "unrecognized"), (["--predict", "t5=x.gmtrace"], "unrecognized")])
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
