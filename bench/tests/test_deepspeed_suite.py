"""bench deepspeed's bookkeeping and the DeepSpeed workload's command line (no torch, no deepspeed, no GPU): the
interleaved order and how each run starts, the commands, the table's figures, the preflight's fallback, and bad
input refused in one line. One test runs the suite for real on the CPU where deepspeed is installed (slow)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import one_line_exit_2

suite = pytest.importorskip("bench.deepspeed_suite")
workload = pytest.importorskip("bench.workloads.deepspeed_train")

GIB = 1 << 30


def args_for(argv: list[str] | None = None):
    parser = suite.build_parser("bench deepspeed")
    args = parser.parse_args(argv or [])
    suite.check_args(parser, args)
    return args


def test_each_stage_runs_a_b_c_c_b_a_and_round_one_starts_gmlake_both_ways():
    args = args_for()
    order = suite.run_order(args.stages, args.allocators, args.rounds)
    for stage in (2, 3):
        assert [a for r, s, a in order if s == stage] == ["native", "expandable", "gmlake", "gmlake", "expandable",
                                                          "native"]
    assert {r for r, s, a in order[:6]} == {0}         # rounds outermost: a deadline keeps round 1 of both stages
    launches = {(r, s): suite.launch_of(r, args.stages.index(s), "alternate") for r, s, a in order}
    assert launches == {(0, 2): "deepspeed", (0, 3): "direct", (1, 2): "direct", (1, 3): "deepspeed"}
    assert suite.launch_of(1, 0, "deepspeed") == "deepspeed" and suite.launch_of(0, 0, "direct") == "direct"


def test_first_round_one_continues_with_the_reversed_order_and_swapped_launches(tmp_path, monkeypatch):
    """`--first-round 1 --rounds 1` runs what round index 1 of a whole suite runs: C B A per stage, each stage
    started the other way than in round 0, and writes that order and the round into the summary."""
    started = []

    def fake_run_one(index, round_, stage, allocator, launch, args, timeout_s):
        started.append((round_, stage, allocator, launch))
        return {**run(index, allocator, 1.0, 3.0, stage=stage), "round": round_, "launch": launch, "wall_s": 1.0}

    monkeypatch.setattr(suite, "preflight", lambda args: ({"preflight": "ok"}, None))
    monkeypatch.setattr(suite, "run_one", fake_run_one)
    assert suite.main(["--first-round", "1", "--rounds", "1", "--out", str(tmp_path)]) == 0
    whole = suite.run_order([2, 3], list(suite.ALLOCATORS), 2)
    assert [(r, s, a) for r, s, a, _ in started] == [o for o in whole if o[0] == 1]
    assert [a for r, s, a, _ in started if s == 2] == ["gmlake", "expandable", "native"]
    assert {(s, launch) for r, s, a, launch in started} == {(2, "direct"), (3, "deepspeed")}
    first = {(s, suite.launch_of(0, [2, 3].index(s), "alternate")) for s in (2, 3)}
    assert first == {(2, "deepspeed"), (3, "direct")}                  # round 0: each stage the other way
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["order"][0] == "zero2:gmlake:r1:direct" and summary["settings"]["first_round"] == 1
    assert len(summary["runs"]) == 6 and {r["round"] for r in summary["runs"]} == {1}


def test_commands_start_each_allocator_as_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("GMLAKE", "1")                  # the suite's own environment never leaks into a run
    args = args_for(["--steps", "12", "--warmup", "2", "--layers", "4"])
    out = tmp_path / "r.json"
    launcher = ["/x/deepspeed"]
    cmd, env = suite.command(2, "gmlake", "deepspeed", args, out, 29611, launcher)
    assert cmd[:6] == ["/x/deepspeed", "--num_gpus", "1", "--master_port", "29611", "bench/workloads/deepspeed_train.py"]
    assert env["GMLAKE"] == "1" and env["PYTORCH_CUDA_ALLOC_CONF"] == "" and env["NCCL_NVLS_ENABLE"] == "0"
    assert cmd[cmd.index("--layers") + 1] == "4" and cmd[-2:] == ["--json", str(out)]
    cmd, env = suite.command(3, "gmlake", "direct", args, out, 29612)
    assert cmd[1:6] == ["-m", "gmlake", "run", "-m", "bench.workloads.deepspeed_train"] and "GMLAKE" not in env
    assert env["MASTER_PORT"] == "29612" and cmd[cmd.index("--stage") + 1] == "3"
    cmd, env = suite.command(2, "expandable", "deepspeed", args, out, 29613, launcher)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and "GMLAKE" not in env
    cmd, env = suite.command(2, "native", "direct", args, out, 29614)
    assert cmd[:3] == [sys.executable, "-m", "bench.workloads.deepspeed_train"] and env["PYTORCH_CUDA_ALLOC_CONF"] == ""
    # the workload accepts every flag the suite passes
    assert workload.parse_args(cmd[3:]).layers == 4


def test_loss_diff_is_the_largest_step_difference():
    assert suite.loss_diff([1.0, 2.0, 3.0], [1.0, 2.5, 2.9]) == pytest.approx(0.5)
    assert suite.loss_diff([1.0], [1.0]) == 0.0
    assert suite.loss_diff([1.0, 2.0], [1.0]) is None and suite.loss_diff([], []) is None


def run(index: int, allocator: str, step_s: float, reserved_gib: float, losses=(4.0, 3.0), stage: int = 2,
        gmlake: bool = False) -> dict:
    """A finished run as the workload reports it, 2 GiB allocated at its peak."""
    out = {"index": index, "stage": stage, "allocator": allocator, "launch": "deepspeed", "optimizer": "cpu-adam",
           "median_step_s": step_s, "max_memory_reserved": reserved_gib * GIB, "max_memory_allocated": 2 * GIB,
           "utilization": 2 / reserved_gib, "losses": list(losses), "num_alloc_retries": 0}
    if gmlake:
        out["gmlake_after_warmup"] = {"stitches": 5, "driver_calls": 12, "driver_busy_s": 0.01}
        out["gmlake"] = {"stitches": 9, "calls": {"create": 10, "map": 20}}
    return out


def test_rows_compare_memory_time_and_losses_with_native_and_expandable():
    runs = [run(0, "native", 1.0, 4.0), run(1, "expandable", 1.1, 3.0), run(2, "gmlake", 1.2, 2.5, gmlake=True),
            run(3, "gmlake", 1.0, 2.5, losses=(4.0, 3.25), gmlake=True), run(4, "expandable", 0.9, 3.0),
            run(5, "native", 1.2, 4.0),
            {"index": 6, "stage": 3, "allocator": "gmlake", "launch": "direct", "error": "killed"}]
    rows = {(r["stage"], r["allocator"]): r for r in suite.table_rows(runs, [2, 3], ["native", "expandable", "gmlake"])}
    native, expandable, gm = rows[2, "native"], rows[2, "expandable"], rows[2, "gmlake"]
    assert native["median_step_s"] == pytest.approx(1.1) and native["spread_pct"] == pytest.approx(100 * 0.2 / 1.1)
    assert native["loss_max_abs_diff_vs_native"] == 0.0 and native["losses_compared"] == 1
    assert gm["reserved_vs_native"] == pytest.approx(2.5 / 4) and gm["reserved_vs_expandable"] == pytest.approx(2.5 / 3)
    assert gm["utilization"] == pytest.approx(0.8) and gm["peak_reserved_gib"] == pytest.approx(2.5)
    assert gm["step_vs_native"] == pytest.approx(1.1 / 1.1) and gm["step_vs_expandable"] == pytest.approx(1.1 / 1.0)
    assert (gm["step_vs_native_min"], gm["step_vs_native_max"]) == pytest.approx((1.0 / 1.1, 1.2 / 1.1))
    assert gm["loss_max_abs_diff_vs_native"] == pytest.approx(0.25) and gm["losses_compared"] == 2
    assert gm["stitches_after_warmup"] == 5 and gm["driver_calls_after_warmup"] == 12 and gm["driver_calls"] == 30
    assert "stitches_after_warmup" not in expandable and expandable["runs"] == 2
    assert rows[3, "gmlake"] == {"stage": 3, "allocator": "gmlake", "runs": 0, "failed": 1}
    assert (3, "native") not in rows
    table = suite.format_table(list(rows.values()), 10, 40)
    assert "zero2  gmlake" in table and "0.625" in table and "failed 1 time(s)" in table
    assert "zero2 18.2% over 2 runs" in table


def test_a_stage_without_native_has_no_ratios_to_it():
    rows = suite.table_rows([run(0, "gmlake", 1.0, 2.0, gmlake=True)], [2], ["native", "gmlake"])
    assert len(rows) == 1 and "step_vs_native" not in rows[0] and rows[0]["reserved_vs_native"] is None
    assert "loss_max_abs_diff_vs_native" not in rows[0]
    assert "gmlake" in suite.format_table(rows, 10, 40)


def done(code: int, output: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], code, output, "")


def test_preflight_falls_back_to_torch_adamw_only_under_auto(monkeypatch):
    calls = []

    def fake_run(cmd, env, timeout_s):
        optimizer = cmd[cmd.index("--optimizer") + 1]
        calls.append(optimizer)
        if optimizer == "cpu-adam":
            return done(1, "noise\ndeepspeed_train.py: preflight: DeepSpeed's CPU Adam did not build or load (x)\n"), False
        return done(0, json.dumps({"preflight": "ok", "optimizer": optimizer}) + "\n"), False

    monkeypatch.setattr(suite, "run_process", fake_run)
    args = args_for(["--optimizer", "auto"])
    info, why = suite.preflight(args)
    assert calls == ["cpu-adam", "torch-adamw"] and args.optimizer == "torch-adamw" and why == ""
    assert "CPU Adam did not build" in info["fell_back_because"]
    calls.clear()
    args = args_for()
    expected = "deepspeed_train.py: preflight: DeepSpeed's CPU Adam did not build or load (x)"
    assert suite.preflight(args) == (None, expected)
    assert calls == ["cpu-adam"]
    monkeypatch.setattr(suite, "run_process", lambda cmd, env, timeout_s: (done(-9, ""), True))
    assert "timed out" in suite.preflight(args_for(["--optimizer", "torch-adamw"]))[1]


def test_a_failed_preflight_stops_the_suite_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "preflight", lambda args: (None, "deepspeed is not importable"))
    assert suite.main(["--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench deepspeed: preflight failed: deepspeed is not importable"]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"preflight_error": "deepspeed is not importable"}


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds >= 1"), (["--first-round", "-1"], "--first-round >= 0"),
    (["--warmup", "40"], "0 <= --warmup < --steps"),
    (["--timeout", "0"], "--timeout"), (["--deadline", "-1"], "--deadline >= 0"), (["--batch", "0"], "--batch >= 1"),
    (["--min-seq", "900", "--max-seq", "100"], "--min-seq <= --max-seq"), (["--stages", "1"], "invalid choice"),
    (["--allocators", "gmlake-paper"], "invalid choice"), (["--steps", "x"], "invalid int value"),
])
def test_the_suite_refuses_bad_arguments_in_one_line(argv, message):
    assert message in one_line_exit_2(["-m", "bench", "deepspeed", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--stage", "1"], "invalid choice"), (["--steps", "0"], "--steps >= 1"), (["--warmup", "40"], "--warmup"),
    (["--batch", "0"], "--batch >= 1"), (["--min-seq", "64", "--max-seq", "32"], "--min-seq <= --max-seq"),
    (["--hidden", "100", "--heads", "3"], "divisible"), (["--optimizer", "sgd"], "invalid choice"),
    (["--no-such-option"], "unrecognized"),
])
def test_the_workload_refuses_bad_arguments_in_one_line_before_importing_torch(argv, message):
    assert message in one_line_exit_2(["-m", "bench.workloads.deepspeed_train", *argv])
    assert message in one_line_exit_2(["bench/workloads/deepspeed_train.py", *argv])     # as the launcher runs it


def test_the_workload_accepts_the_launchers_local_rank_and_builds_its_config():
    args = workload.parse_args(["--local_rank=0", "--stage", "2", "--optimizer", "torch-adamw"])
    assert args.local_rank == 0 and args.heads == 16
    config = workload.ds_config(args)
    assert config["zero_optimization"]["stage"] == 2 and config["optimizer"]["params"]["torch_adam"] is True
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "torch_adam" not in workload.ds_config(workload.parse_args([]))["optimizer"]["params"]
    assert workload.parse_args(["--local-rank", "0"]).local_rank == 0


def test_the_workloads_lengths_come_from_the_seed_alone():
    args = workload.parse_args(["--steps", "40"])
    lengths = workload.schedule(args)
    assert lengths == workload.schedule(workload.parse_args(["--steps", "40"])) and len(lengths) == 40
    assert all(128 <= n <= 1024 and n % 8 == 0 for n in lengths) and len(set(lengths)) > 10
    assert lengths != workload.schedule(workload.parse_args(["--steps", "40", "--seed", "1"]))
    odd = workload.schedule(workload.parse_args(["--min-seq", "3", "--max-seq", "5"]))
    assert all(3 <= n <= 5 for n in odd)


@pytest.mark.slow
def test_the_suite_runs_on_the_cpu(tmp_path):
    """Both launches of the workload, ZeRO-2 and ZeRO-3 on DeepSpeed's CPU accelerator (tiny model, native only):
    the same losses every run. Needs deepspeed and a C++ toolchain (CPU Adam's first build takes minutes)."""
    if importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs deepspeed and torch")
    assert suite.main(["--device", "cpu", "--steps", "3", "--warmup", "1", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["launch"] for r in summary["runs"]} == {"deepspeed", "direct"} and len(summary["runs"]) == 4
    assert all(row["loss_max_abs_diff_vs_native"] == 0.0 for row in summary["rows"])
