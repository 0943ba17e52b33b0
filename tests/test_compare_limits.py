"""gmlake compare --smallest-cap: the smallest device (no cap) and the smallest memory cap beside each replay, the
very values gmlake.sim.cap gives, in the table (within the terminal), in --json and in compare.jsonl; bad input in one
line and exit 2."""
from __future__ import annotations

import json

import pytest

from gmlake.cli import EXIT_BAD_INPUT, EXIT_OK, main
from gmlake.sim.cap import limits, smallest_cap, smallest_device_memory
from gmlake.sim.compare import LIMIT_COLUMNS, limit_cells, smallest_limits
from gmlake.sim.replay import trace_path
from gmlake.sim.trace import Trace, load, save_compact

TINY = "tests/data/tiny-gpt2-native.pickle.gz"
POLICIES = ["--policy", "gmlake", "--policy", "expandable"]


@pytest.fixture(scope="module")
def tiny():
    return load(trace_path(TINY))


def test_the_json_holds_gmlake_caps_own_values(tmp_path, capsys, tiny):
    assert main(["compare", TINY, *POLICIES, "--smallest-cap", "--json", "--jobs", "2",
                 "--out", str(tmp_path)]) == EXIT_OK
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    written = [json.loads(line) for line in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert printed == written and [r["policy"] for r in printed] == ["gmlake", "expandable"]
    for row in printed:
        cap_fit, cap_fail, _ = smallest_cap(tiny, row["policy"])
        device_fit, device_fail, _ = smallest_device_memory(tiny, row["policy"])
        assert (row["smallest_cap"], row["largest_failing_cap"]) == (cap_fit, cap_fail)
        assert (row["smallest_device_memory"], row["largest_failing_device_memory"]) == (device_fit, device_fail)
        assert row["smallest_cap_x_peak"] == pytest.approx(cap_fit / row["peak_allocated"])
        assert row["smallest_device_memory_x_peak"] == pytest.approx(device_fit / row["peak_allocated"])
        assert row["peak_reserved"] > 0 and row["utilization"] > 0     # the replay's own figures are kept


def test_the_columns_appear_within_120_columns(tmp_path, capsys):
    assert main(["compare", TINY, *POLICIES, "--smallest-cap", "--jobs", "1", "--out", str(tmp_path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "device xP" in out and "cap xP" in out and "smallest device" in out      # the caption says what they are
    assert max(map(len, out.splitlines())) <= 120
    rows = [json.loads(line) for line in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert f"{rows[0]['smallest_cap_x_peak']:.4f}" in out
    assert main(["compare", TINY, *POLICIES, "--smallest-cap", "--wide", "--out", str(tmp_path)]) == EXIT_OK
    wide = capsys.readouterr().out
    assert all(col in wide for col in LIMIT_COLUMNS) and f"{rows[0]['smallest_cap'] / 2**30:.3f}" in wide


def test_long_trace_names_stand_whole_within_120_columns(tmp_path, capsys, tiny, monkeypatch):
    """At 120 columns, each trace's name is a row of its own with its policies indented under it: a name of 38
    characters stands whole on one line, not folded, and no line is wider than 120."""
    monkeypatch.setenv("COLUMNS", "120")        # as a terminal that wide sets it (piped, the width is 80)
    names = ["opt350m-full-ckpt-expandable", "opt1.3b-lora-ckpt-expandable-2026-12-a"]
    paths = [str(save_compact(Trace(tiny.events, {**tiny.meta, "name": name}), tmp_path / f"{i}.gmtrace"))
             for i, name in enumerate(names)]
    assert main(["compare", *paths, *POLICIES, "--smallest-cap", "--jobs", "1", "--out", str(tmp_path / "out")]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 120 and "trace / policy" in "\n".join(lines)
    for name in names:
        assert sum(f"│ {name} " in line for line in lines) == 1, name
    for policy in ("gmlake", "expandable"):
        assert sum(f"│   {policy} " in line for line in lines) == 2, policy


def test_without_the_option_nothing_changes(tmp_path, capsys):
    assert main(["compare", TINY, "--policy", "gmlake", "--out", str(tmp_path)]) == EXIT_OK
    assert "cap xP" not in capsys.readouterr().out
    (row,) = [json.loads(line) for line in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert "smallest_cap" not in row


def test_processes_and_one_process_agree(tiny):
    one = smallest_limits([tiny], ["gmlake", "caching"], jobs=1, progress=False)
    two = smallest_limits([tiny], ["gmlake", "caching"], jobs=2, progress=False)
    assert one == two == [limits(tiny, "gmlake"), limits(tiny, "caching")]


def test_a_policy_out_of_memory_even_uncapped_shows_no_limits(tiny):
    small = Trace(tiny.events, {**tiny.meta, "device_total": 1 << 30})
    (row,) = smallest_limits([small], ["gmlake"], jobs=1, progress=False)
    assert "error" in row and "even uncapped" in row["error"]
    assert set(limit_cells(row).values()) == {"-"}


@pytest.mark.parametrize("args, words", [
    (["--smallest-cap", "--cap", "1GiB"], ["--smallest-cap", "drop --cap"]),
    (["--smallest-cap", "--device-memory", "1GiB"], ["drop --device-memory"]),
    (["--smallest-cap", "--jobs", "0"], ["--jobs", "at least 1"]),
    (["--smallest-cap", "--jobs", "many"], ["--jobs", "whole number"]),
    (["--jobs", "2"], ["--jobs", "give --smallest-cap"]),
    (["--smallest-cap", "--policy", "nosuch"], ["nosuch"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, words):
    assert main(["compare", TINY, *args, "--out", str(tmp_path / "out")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gmlake: error: ") and "Traceback" not in err, err
    assert all(word in err for word in words), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("width", [80, 100])
def test_long_trace_names_break_between_words_never_inside_one(tmp_path, capsys, tiny, monkeypatch, width):
    """Where a trace's name is wider than its column, it breaks after a separator: every word of it stands whole
    on one line of the table (folding used to split 'checkpointing' into 'checkpoi' / 'nting')."""
    monkeypatch.setenv("COLUMNS", str(width))
    names = ["llama-finetune-checkpointing-expandable-segments-run3", "opt1.3b_lora_activation.recompute.2026"]
    paths = [str(save_compact(Trace(tiny.events, {**tiny.meta, "name": name}), tmp_path / f"{i}.gmtrace"))
             for i, name in enumerate(names)]
    assert main(["compare", *paths, *POLICIES, "--out", str(tmp_path / "out")]) == EXIT_OK
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= width
    import re

    for name in names:
        for word in re.split(r"[-_.]", name):
            assert word in out, (word, out)
