"""bench report variation: the runs' own variation, and how many runs resolving a gap would take."""
from __future__ import annotations

import json

import pytest

run_variation = pytest.importorskip("bench.run_variation")


def test_runs_needed_is_two_standard_errors_of_a_difference_of_means():
    # cv * sqrt(2 / n) = gap / 2  =>  n = 8 cv^2 / gap^2
    assert run_variation.runs_needed(0.05, 0.01) == 200
    assert run_variation.runs_needed(0.10, 0.02) == 200
    assert run_variation.runs_needed(0.01, 0.02) == 2


def test_groups_are_repeats_of_one_workload_and_allocator_in_one_file(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"runs": [
        {"workload": "w", "allocator": "x", "tokens_per_s": 90.0}, {"workload": "w", "allocator": "x",
                                                                     "tokens_per_s": 110.0},
        {"workload": "w", "allocator": "y", "timed_s": 2.0},                    # one run: no group
        {"workload": "w", "allocator": "z", "error": "killed", "tokens_per_s": 1.0}]}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text(json.dumps({"runs": [{"workload": "w", "allocator": "x",
                                                                    "timed_s": 2.0},
                                                                   {"workload": "w", "allocator": "x",
                                                                    "timed_s": 2.0}]}))
    (tmp_path / "not-json.json").write_text("{")
    cvs = run_variation.variations(tmp_path)
    assert cvs == [0.0, pytest.approx(14.142135 / 100)]


def test_the_bundled_results_give_the_figures_the_docs_quote(capsys):
    assert run_variation.main([]) == 0
    out = capsys.readouterr().out
    assert "groups of repeated runs" in out and "to resolve a 1% gap" in out
