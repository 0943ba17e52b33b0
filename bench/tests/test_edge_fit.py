"""bench edge-fit: the device as the limit with lazy loading. Replay, with the libraries' memory its traces carry
(Note [The libraries' memory in replay]), says what every H200 run in the committed results did: trained every step,
ran out of memory in the allocator, or failed inside a CUDA library."""
from __future__ import annotations

import json

import pytest

from bench import RESULTS, edge_fit
from bench.__main__ import main as bench_main
from bench.report_docs import benchmarks


def test_replay_says_what_every_gpu_run_did():
    rows = benchmarks.edge_fit_rows()
    assert len(rows) >= 30
    assert {r["gpu"] for r in rows} == {"fit", "oom", "library"}       # every outcome is there to be predicted
    wrong = [r for r in rows if r["replay"] != r["gpu"]]
    assert not wrong, wrong


def test_replay_says_what_the_tail_pages_did_on_the_h100_and_they_train_wherever_expandable_does():
    rows = benchmarks.edge_fit_rows(benchmarks.TAIL_EDGE_FIT)
    assert len(rows) == 8 and {r["gpu"] for r in rows} == {"fit", "oom", "library"}
    assert [r for r in rows if r["replay"] != r["gpu"]] == []
    expandable = {r["workload"]: r["gpu"] for r in rows if r["policy"] == "expandable"}
    assert all(r["gpu"] == "fit" for r in rows if r["policy"] == "gmlake-tail2m" and expandable[r["workload"]] == "fit")


def test_the_default_trains_wherever_expandable_segments_does_in_the_results():
    rows = benchmarks.edge_fit_rows()
    expandable = {(r["workload"], r["k"], r["round"]): r["gpu"] for r in rows if r["policy"] == "expandable"}
    for r in rows:
        if r["policy"] == "gmlake" and expandable.get((r["workload"], r["k"], r["round"])) == "fit":
            assert r["gpu"] == "fit", r


def test_the_goal_record_replays_each_run_to_its_outcome_and_each_fit_to_its_peak_within_a_percent():
    """The newest goal record (docs/benchmarks.md, "The default against both references on the GPU"): replay of each
    program's calibration trace on a device of the bytes the run had says what it did, and where it trained, its
    peak reserved within 1 %; the default trains wherever expandable segments train."""
    path = benchmarks._newest(benchmarks.GPU_GOALS_EDGE)[0]
    rows = benchmarks.edge_fit_rows(str(path.relative_to(RESULTS)))
    assert len(rows) >= 15 and "moe" in {r["workload"] for r in rows}
    for row in rows:
        assert row["replay"] == row["gpu"], row
        if row["gpu"] == "fit":
            assert abs(row["replay_reserved"] / row["gpu_reserved"] - 1) <= 0.01, row
    outcome = {(r["workload"], r["policy"]): r["gpu"] for r in rows}
    assert all(outcome[(w, "gmlake")] == "fit" for (w, a), o in outcome.items() if a == "expandable" and o == "fit")


def test_runs_interleave_and_outcomes_are_read_from_exit_and_summary():
    assert edge_fit.order(["a"], [1.02], ["x", "y"], range(2)) == [(0, 1.02, "a", "x"), (0, 1.02, "a", "y"),
                                                                   (1, 1.02, "a", "y"), (1, 1.02, "a", "x")]
    assert edge_fit.outcome(0, {"steps": 1}) == "fit"
    assert edge_fit.outcome(3, {"oom": True}) == "oom"
    assert edge_fit.outcome(4, {"library_failure": True}) == "library"
    assert edge_fit.outcome(1, {}) == "error"


@pytest.mark.parametrize("argv", [["--workloads", "nosuch", "--out", "x"], ["--k", "9", "--out", "x"],
                                  ["--calibration", "/no/such.json", "--out", "x"], ["--out"],
                                  ["--fresh", "--out", "x"]])
def test_bad_input_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        bench_main(["edge-fit", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench edge-fit")


@pytest.mark.parametrize("record, complaint", [
    ("not json", "not an edge-fit.json"),
    ('{"runs": []}', "no calibrations"),
    ('{"steps": 12, "seed": 0, "calibrations": {}}', "calibrated with --steps 12, not 40"),
    ('{"steps": 40, "seed": 3, "calibrations": {}}', "calibrated with --seed 3, not 0"),
])
def test_a_calibration_from_another_schedule_is_refused(record, complaint, tmp_path, capsys):
    """A calibration's P is the peak over its own steps: reused for runs of more steps, every allocator runs out of
    memory where the job outgrows P (seen: 12-step calibrations, 40-step runs, all out of memory at step 16)."""
    path = tmp_path / "edge-fit.json"
    path.write_text(record)
    with pytest.raises(SystemExit) as stop:
        bench_main(["edge-fit", "--steps", "40", "--calibration", str(path), "--out", str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and complaint in err[0], err


def test_a_calibration_keeps_its_runs_unless_fresh():
    """--calibration continues the record (its runs are not made again); --fresh keeps only its calibrations."""
    path = RESULTS / "h200-2026-12-04" / "edge-fit.json"
    held = len(json.loads(path.read_text())["runs"])
    for extra, kept in (([], held), (["--fresh"], 0)):
        args = edge_fit.parse_args(["--steps", "12", "--calibration", str(path), "--out", "x", *extra], "bench edge-fit")
        assert args.earlier["calibrations"] and len(edge_fit.kept_runs(args)) == kept


def test_the_committed_record_is_a_calibration_its_own_runs_accept():
    """The committed record says its schedule, and passes the check for that schedule."""
    path = RESULTS / "h200-2026-12-04" / "edge-fit.json"
    record = json.loads(path.read_text())
    args = edge_fit.parse_args(["--steps", str(record["steps"]), "--seed", str(record["seed"]), "--calibration",
                                str(path), "--out", "x"], "bench edge-fit")
    assert args.earlier["calibrations"]


def test_the_gpu_edge_is_within_half_a_percent_of_p_of_replays():
    """Per workload and allocator, the H200 run just under replay's smallest device failed and the one just over it
    trained, each no more than 0.5 % of P away from it: the GPU's smallest device is within 0.5 % of P of replay's.
    Replay also says what each of those runs did."""
    pairs = benchmarks.edge_bracket_rows()
    assert {p["workload"] for p in pairs} == {"rl", "sage", "t5", "bert"}
    assert {p["allocator"] for p in pairs} == {"gmlake", "expandable"}
    for pair in pairs:
        under, over = sorted(pair["probes"], key=lambda p: p["k"])
        assert under["gpu"] in ("oom", "library") and over["gpu"] == "fit", pair
        assert pair["replay_k"] - 0.005 - 1e-4 <= under["k"] < over["k"] <= pair["replay_k"] + 0.005 + 1e-4, pair
        assert [under["replay"], over["replay"]] == [under["gpu"], over["gpu"]], pair


def test_replay_measures_the_libraries_as_the_gpu_did_and_the_default_half_life_costs_no_fit():
    """Note [Leaving the libraries room]: on each edge-fit workload replay of the calibration trace measures the
    libraries' largest rise within 2 MiB of what the default measured on the H200. Replay's smallest device under
    the default half-life is the least of every half-life judged (the fixed floor among them), and keeping the
    largest rise for good (no decay) costs the RL program more than 1 % of P."""
    from gmlake.policies import GMLakePolicy

    default = GMLakePolicy().libraries_half_life
    rows = benchmarks.edge_libraries_rows()
    assert {r["workload"] for r in rows} == {"rl", "sage", "t5", "bert"}
    for row in rows:
        gpu, replayed = row["gpu"], row["replay"]
        assert abs(gpu["libraries_largest_rise_bytes"] - replayed["libraries_largest_rise_bytes"]) <= 2 << 20, row
        smallest = row["smallest_k"]
        assert smallest[default] <= min(smallest.values()) + 1e-4, row
    rl = next(r for r in rows if r["workload"] == "rl")["smallest_k"]
    assert rl[benchmarks.LIBRARIES_HALF_LIVES[-1]] > rl[default] + 0.01, rl
