"""`python -m bench plan-goals`: the replay goals' arithmetic, the tuning and validation sets kept apart, the
references reused from a file, and bad input refused in one line. Small synthetic traces stand in for the sets."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

plan_goals = pytest.importorskip("bench.plan_goals")

from bench import RESULTS, ROOT, edge
from gmlake.sim.trace import ALLOC, EVENT_DTYPE, FREE, Trace, load, save_compact

MiB = 1 << 20


def figures(reserved: int, seconds: float, ooms: int = 0) -> dict:
    return {"peak_reserved": reserved, "driver_seconds": seconds, "ooms": ooms}


def test_a_candidate_within_both_goals_meets_them():
    got = plan_goals.judge(figures(1005, 0.19), figures(1100, 0.1), figures(1000, 1.0))
    assert got["best_reference_reserved"] == 1000
    assert got["excess_pct"] == pytest.approx(0.5) and got["memory_met"]      # 0.5 % is within the goal
    assert got["time_budget"] == pytest.approx(0.19) and got["time_met"]     # 0.1 + (1.0 - 0.1) / 10


def test_more_memory_than_the_better_reference_plus_half_a_percent_misses_the_memory_goal():
    got = plan_goals.judge(figures(1006, 0.1), figures(1000, 0.1), figures(1100, 1.0))
    assert got["excess_pct"] == pytest.approx(0.6)
    assert not got["memory_met"] and got["time_met"]


def test_driver_time_past_a_tenth_of_the_papers_extra_misses_the_time_goal():
    got = plan_goals.judge(figures(900, 0.2), figures(1000, 0.1), figures(1000, 1.0))
    assert got["excess_pct"] == pytest.approx(-10.0) and got["memory_met"]
    assert not got["time_met"]
    # the paper design cheaper than expandable segments: the budget falls below expandable's time
    assert plan_goals.judge(figures(900, 0.1), figures(1000, 0.1), figures(1000, 0.0))["time_budget"] < 0.1


def test_a_candidate_that_runs_out_of_memory_meets_neither_goal():
    got = plan_goals.judge(figures(0, 0.0, ooms=1), figures(1000, 0.1), figures(1000, 1.0))
    assert not got["memory_met"] and not got["time_met"]


def test_no_validation_trace_is_in_the_tuning_set_nor_in_the_edge_table():
    sets = plan_goals.trace_sets()
    digests = {name: {hashlib.sha256(p.read_bytes()).hexdigest() for p in paths} for name, paths in sets.items()}
    names = {name: {load(p).name for p in paths} for name, paths in sets.items()}
    assert len(sets["validation"]) >= 3 and len(sets["tuning"]) >= 10
    assert not digests["tuning"] & digests["validation"]
    assert not names["tuning"] & names["validation"]
    # bench edge's traces are the ones the default's settings were chosen on
    assert not {load(p).name for p in edge.default_traces()} & names["validation"]
    # the programs the validation set must hold: multi-GiB blocks changing size, generation alternating with training
    assert {"sage-edge", "rl-edge"} <= names["validation"]


def tiny_trace(path, name: str, scale: int):
    """Three steps whose large blocks change size each step, beside small ones that live across steps."""
    rows, next_id = [], 0
    for step in range(3):
        ids = []
        for size in (scale * (24 + 6 * step) * MiB, scale * 7 * MiB, 300_000, scale * (40 - 8 * step) * MiB):
            rows.append((ALLOC, 0, size, next_id))
            ids.append((next_id, size))
            next_id += 1
        for i, size in ids[::2] + ids[1::2]:
            rows.append((FREE, 0, size, i))
    return save_compact(Trace(np.array(rows, dtype=EVENT_DTYPE), {"name": name}), path)


@pytest.fixture
def tiny_sets(tmp_path, monkeypatch):
    sets = {"tuning": [tiny_trace(tmp_path / "a.gmtrace", "a", 1), tiny_trace(tmp_path / "b.gmtrace", "b", 2)],
            "validation": [tiny_trace(tmp_path / "c.gmtrace", "c", 3)]}
    monkeypatch.setattr(plan_goals, "trace_sets", lambda: sets)
    return sets


def counted_replays(monkeypatch) -> list:
    calls, real = [], plan_goals.replay_one

    def replay_one(path, policy):
        calls.append((path, policy))
        return real(path, policy)

    monkeypatch.setattr(plan_goals, "replay_one", replay_one)
    return calls


def test_each_set_gets_its_table_and_summary_line(tiny_sets, tmp_path, capsys):
    assert plan_goals.main(["--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "tuning: memory goal " in out and "/2, time goal " in out
    assert "validation: memory goal " in out and "/1, both " in out
    record = json.loads((tmp_path / "out.json").read_text())
    assert [r["trace"] for r in record["sets"]["tuning"]["traces"]] == ["a", "b"]
    assert [r["trace"] for r in record["sets"]["validation"]["traces"]] == ["c"]
    row = record["sets"]["tuning"]["traces"][0]
    assert row == {**row, **plan_goals.judge(row["candidate"], row["expandable"], row["paper"])}
    assert record["environment"]["gmlake_source_sha256"] and record["policy"] == "gmlake"
    assert plan_goals.main(["--sets", "validation", "--json", str(tmp_path / "v.json")]) == 0
    assert list(json.loads((tmp_path / "v.json").read_text())["sets"]) == ["validation"]


def test_references_from_a_file_are_reused_and_a_changed_trace_is_replayed(tiny_sets, tmp_path, monkeypatch):
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    refs = tmp_path / "refs.json"
    assert plan_goals.main(["--json", str(first), "--save-references", str(refs)]) == 0
    calls = counted_replays(monkeypatch)
    assert plan_goals.main(["--references", str(refs), "--json", str(again)]) == 0
    assert sorted(policy for _, policy in calls) == ["gmlake"] * 3      # the candidate only
    assert json.loads(again.read_text())["sets"] == json.loads(first.read_text())["sets"]
    tiny_trace(tiny_sets["tuning"][0], "a", 4)                           # new bytes under the same path
    calls.clear()
    assert plan_goals.main(["--references", str(first), "--sets", "tuning"]) == 0
    assert sorted(calls) == sorted([(str(tiny_sets["tuning"][0]), p) for p in ("expandable", "gmlake-paper")]
                                   + [(str(p), "gmlake") for p in tiny_sets["tuning"]])


def test_replays_in_processes_give_the_same_figures(tiny_sets, tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert plan_goals.main(["--json", str(one), "--policy", "gmlake-paper"]) == 0
    assert plan_goals.main(["--json", str(two), "--policy", "gmlake-paper", "--jobs", "2"]) == 0
    assert json.loads(one.read_text())["sets"] == json.loads(two.read_text())["sets"]


def test_the_edge_fit_is_summarised_from_a_bench_edge_record_by_set(tiny_sets, tmp_path, capsys):
    rows = []
    for path in [*tiny_sets["tuning"], tiny_sets["validation"][0]]:
        trace = load(path)
        peak = edge.run(trace, "expandable")["peak_allocated"]
        rows += [edge.measure(trace, policy, 1e-2, peak) for policy in edge.POLICIES]
    (tmp_path / "edge.json").write_text(json.dumps({"resolution": 1e-2, "rows": rows}))
    assert plan_goals.main(["--edge-json", str(tmp_path / "edge.json"), "--json", str(tmp_path / "o.json")]) == 0
    judged = edge.goals(rows)
    met = [g["smallest_device"]["met"] and g["smallest_cap"]["met"] for g in judged]
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("edge fit") and line.endswith(f"all {sum(met)}/3")
    assert f"tuning {sum(met[:2])}/2, validation {sum(met[2:])}/1" in line
    summary = json.loads((tmp_path / "o.json").read_text())["edge"]
    assert [t["set"] for t in summary["traces"]] == ["tuning", "tuning", "validation"]
    # a record without rows of the candidate is refused
    with pytest.raises(SystemExit) as exit_:
        plan_goals.main(["--edge-json", str(tmp_path / "edge.json"), "--policy", "gmlake[restitch_limit=0]"])
    assert exit_.value.code == 2
    # and so is one that holds the candidate's rows alone
    (tmp_path / "alone.json").write_text(json.dumps({"rows": [r for r in rows if r["policy"] == "gmlake"]}))
    with pytest.raises(SystemExit) as exit_:
        plan_goals.main(["--edge-json", str(tmp_path / "alone.json")])
    assert exit_.value.code == 2


@pytest.mark.parametrize("argv", [["--policy", "no-such-policy"], ["--policy", "gmlake[bogus=1]"],
                                  ["--references", "/no/such/file.json"], ["--edge-json", "/no/such/edge.json"],
                                  ["--jobs", "0"], ["--jobs", "two"], ["--sets", "both"],
                                  ["--json", "/no/such/folder/out.json"]])
def test_bad_input_is_refused_in_one_line_with_status_2(tiny_sets, argv, capsys, monkeypatch):
    calls = counted_replays(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        plan_goals.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("bench plan-goals: ") and err.count("\n") == 1
    assert not calls                                                      # refused before any replay


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"references": [1]}', '{"references": {"a": 1}}'])
def test_a_references_file_that_is_not_a_json_object_is_refused(tiny_sets, tmp_path, capsys, text):
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(SystemExit) as exit_:
        plan_goals.main(["--references", str(tmp_path / "bad.json")])
    assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_the_recorded_figures_are_what_replay_gives_today():
    """bench/results/replay-goals-default.json (docs/benchmarks.md's table) on two cheap traces, one of each set: a
    change that moves the default's or a reference's figures reruns `python -m bench plan-goals` (seconds)."""
    record = json.loads((RESULTS / "replay-goals-default.json").read_text())
    rows = {r["path"]: r for chosen in record["sets"].values() for r in chosen["traces"]}
    for key in ("tests/data/edge/sage-edge.gmtrace", "tests/data/results/traces/cnn-20steps-native.gmtrace"):
        for policy, column in (("gmlake", "candidate"), ("expandable", "expandable"), ("gmlake-paper", "paper")):
            assert plan_goals.replay_one(str(ROOT / key), policy) == rows[key][column], (key, policy)
    saved = json.loads((RESULTS / "replay-goals-references.json").read_text())["references"]
    assert saved == record["references"]
