"""Metrics a paper can use: requested/reserved beside allocated/reserved, internal and external fragmentation at the
peak, checked by hand on small synthetic traces; and explain's moment of peak growth, which is not fooled by a tiny
growth long after the one that mattered."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from gmlake.cli import EXIT_OK, main
from gmlake.policies import CachingPolicy
from gmlake.sim.explain import explain, peak_growth_moment
from gmlake.sim.replay import replay
from gmlake.sim.trace import ALLOC, EVENT_DTYPE, FREE, Trace

MiB = 1 << 20
TINY = "tests/data/tiny-gpt2-native.pickle.gz"


def synthetic(*rows: tuple[int, int, int]) -> Trace:
    """A trace of (action, size, allocation id) on stream 0."""
    return Trace(np.array([(action, 0, size, ident) for action, size, ident in rows], dtype=EVENT_DTYPE),
                 {"name": "synthetic"})


@dataclass(frozen=True)
class NeverSplit(CachingPolicy):
    """PyTorch's rules, except that a free block always serves a request whole: it reserves more yet allocates
    all of it, so allocated/reserved flatters it."""

    def should_split(self, block_size: int, size: int, pool: str, default: bool) -> bool:
        return False


def test_fragmentation_at_the_peak_by_hand():
    """Under PyTorch's rules: 1000 B rounds to 1024 B in a new 2 MiB small segment; 5 MiB + 1 B rounds to
    5 MiB + 512 B in a new 20 MiB large segment (under 10 MiB), split. Reserved peaks at request 1."""
    trace = synthetic((ALLOC, 1000, 0), (ALLOC, 5 * MiB + 1, 1), (FREE, 5 * MiB + 1, 1), (FREE, 1000, 0))
    r = replay(trace, "caching")
    requested, allocated, reserved = 1000 + 5 * MiB + 1, 1024 + 5 * MiB + 512, 2 * MiB + 20 * MiB
    assert (r.peak_event, r.peak_reserved, r.peak_requested) == (1, reserved, requested)
    assert (r.requested_at_peak_reserved, r.allocated_at_peak_reserved) == (requested, allocated)
    assert r.internal_fragmentation == 535                       # (1024 - 1000) + (512 - 1)
    assert r.external_fragmentation == reserved - allocated == 17_824_256
    s = r.summary()
    assert s["requested_utilization"] == round(requested / reserved, 6) == 0.227316
    assert s["utilization"] == round(allocated / reserved, 6) == 0.227339
    assert s["internal_fragmentation_at_peak"] == 535 and s["external_fragmentation_at_peak"] == 17_824_256
    assert s["internal_fragmentation_share"] == round(535 / reserved, 6)
    assert s["external_fragmentation_share"] == round(17_824_256 / reserved, 6)


def test_requested_over_reserved_sees_what_allocated_over_reserved_hides():
    """A 30 MiB block freed, then three 12 MiB requests. PyTorch splits: 12 + 12 from the 30 MiB block, a new
    12 MiB segment for the third: 42 MiB reserved, 36 allocated. Never splitting, the first 12 MiB request takes
    the whole 30 MiB block and the others get new segments: 54 MiB reserved, all of it allocated, so
    allocated/reserved is a perfect 1.0 for the worse policy; requested/reserved is 36/54."""
    trace = synthetic((ALLOC, 30 * MiB, 0), (FREE, 30 * MiB, 0), (ALLOC, 12 * MiB, 1), (ALLOC, 12 * MiB, 2),
                      (ALLOC, 12 * MiB, 3))
    splits, whole = replay(trace, "caching"), replay(trace, NeverSplit())
    assert (splits.peak_reserved, splits.peak_allocated) == (42 * MiB, 36 * MiB)
    assert (whole.peak_reserved, whole.peak_allocated, whole.peak_requested) == (54 * MiB, 54 * MiB, 36 * MiB)
    assert whole.utilization == 1.0 and splits.utilization == pytest.approx(36 / 42)
    assert whole.requested_utilization == pytest.approx(36 / 54)
    assert splits.requested_utilization == pytest.approx(36 / 42)
    assert whole.internal_fragmentation == 18 * MiB and whole.external_fragmentation == 0
    assert splits.internal_fragmentation == 0 and splits.external_fragmentation == 6 * MiB


@pytest.mark.parametrize("policy", ["gmlake", "gmlake-paper", "caching", "expandable"])
def test_reserved_is_requested_plus_both_fragmentations(policy):
    r = replay(tiny(), policy)
    assert r.requested_at_peak_reserved + r.internal_fragmentation + r.external_fragmentation == r.peak_reserved
    assert r.internal_fragmentation >= 0 and r.external_fragmentation >= 0
    assert r.requested_at_peak_reserved <= r.peak_requested


def tiny() -> Trace:
    from gmlake.sim.trace import load

    return load(TINY)


def test_a_failed_replay_has_null_ratios():
    trace = synthetic((ALLOC, 64 * MiB, 0), (ALLOC, 64 * MiB, 1))
    s = replay(trace, "caching", device_memory=100 * MiB).summary()
    assert s["failed"] and s["requested_utilization"] is None and s["external_fragmentation_share"] is None


def test_compare_fits_120_columns_by_default_and_shows_every_column_wide(tmp_path, capsys):
    """Piped, the default table fits a 120-column terminal whatever the names' lengths (they fold); --wide adds
    every column, fragmentation and the stall model included."""
    policy = "gmlake[min_saved_chunks=0,expandable_page_large=8MiB,max_cached_sblocks=7]"
    args = ["compare", TINY, "--policy", policy, "--policy", "caching", "--out", str(tmp_path)]
    assert main(args) == EXIT_OK
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 120 and "alloc/res" in narrow
    assert "ext@growth" not in narrow and "time lost s" not in narrow
    assert main([*args, "--wide"]) == EXIT_OK
    wide = capsys.readouterr().out
    assert "ext@growth" in wide and "time lost s" in wide and max(len(line) for line in wide.splitlines()) > 120


def test_compare_table_and_jsonl_carry_the_metrics(tmp_path, capsys):
    assert main(["compare", TINY, "--policy", "caching", "--out", str(tmp_path), "--wide"]) == EXIT_OK
    out = capsys.readouterr().out
    for column in ("alloc/res", "req/res", "int frag MiB", "ext@peak", "ext@growth"):
        assert column in out, column
    (row,) = [json.loads(line) for line in (tmp_path / "compare.jsonl").read_text().splitlines()]
    direct = replay(tiny(), "caching").summary()
    for key in ("peak_requested", "requested_utilization", "internal_fragmentation_at_peak",
                "external_fragmentation_at_peak", "requested_at_peak", "allocated_at_peak"):
        assert row[key] == direct[key], key
    assert row["requested_at_peak"] + row["internal_fragmentation_at_peak"] + \
        row["external_fragmentation_at_peak"] == row["peak_reserved"]


# ------------------------------------------------------------------------------------ explain's moment


def test_peak_growth_moment_is_the_first_request_within_1_percent():
    assert peak_growth_moment(np.array([10, 50, 99, 99, 100])) == 2
    assert peak_growth_moment(np.array([10, 50, 98, 98, 100])) == 4       # 98 is 2 % short
    assert peak_growth_moment(np.array([0, 100, 20, 100])) == 1           # reserved released and regrown
    assert peak_growth_moment(np.array([10, 50, 98, 98, 100]), within=0.05) == 2
    assert peak_growth_moment(np.array([10, 50, 99, 99, 100]), within=0) == 4


def test_explain_picks_the_big_growth_not_a_tiny_later_one():
    """100 MiB and 200 MiB tensors (reserved 300 MiB), both freed (PyTorch's rules keep the segments), then a
    1000 B tensor: a new 2 MiB small segment makes the exact peak, 302 MiB, with nothing live but 1000 B. The
    moment explained is the 200 MiB request: 300 MiB reserved is within 1 % of 302."""
    trace = synthetic((ALLOC, 100 * MiB, 0), (ALLOC, 200 * MiB, 1), (FREE, 200 * MiB, 1), (FREE, 100 * MiB, 0),
                      (ALLOC, 1000, 2))
    b = explain(trace, "caching")
    assert (b.request_index, b.request_size, b.growth) == (1, 200 * MiB, 200 * MiB)
    assert (b.reserved, b.requested, b.free_whole_chunks + b.free_in_shared_chunks) == (300 * MiB, 300 * MiB, 0)
    assert (b.peak_reserved, b.peak_request_index, b.later_growth) == (302 * MiB, 4, 2 * MiB)
    assert "request #1 (200.00 MiB)" in b.why and "reached at request #4" in b.why
    assert sum(v for _, v in b.rows()) == b.reserved
    # Asked for the exact peak instead, explain shows the misleading moment: 300 MiB of free blocks.
    exact = explain(trace, "caching", within=0)
    assert exact.request_index == 4 and exact.requested == 1000
    assert exact.free_whole_chunks + exact.free_in_shared_chunks == 300 * MiB


def test_explain_cli_says_which_moment_and_why(capsys):
    trace_rows = [(ALLOC, 100 * MiB, 0), (ALLOC, 200 * MiB, 1), (FREE, 200 * MiB, 1), (FREE, 100 * MiB, 0),
                  (ALLOC, 1000, 2)]
    import tempfile
    from pathlib import Path

    from gmlake.sim.trace import save_compact

    with tempfile.TemporaryDirectory() as folder:
        path = save_compact(synthetic(*trace_rows), Path(folder) / "late.gmtrace")
        assert main(["explain", str(path), "--policy", "caching"]) == EXIT_OK
        out = capsys.readouterr().out
        assert "peak growth" in out and "#1, 200.00 MiB" in out and "(#4)" in out
        assert "the first request within 1 % of it" in out
        assert main(["explain", str(path), "--policy", "caching", "--json"]) == EXIT_OK
        row = json.loads(capsys.readouterr().out)
    assert (row["request_index"], row["peak_request_index"], row["later_growth"]) == (1, 4, 2 * MiB)
    assert row["why"].startswith("request #1") and row["knobs"]["segment_rule"] == "pytorch"


def test_fragmentation_at_peak_growth_beside_the_exact_peak():
    """The late-growth trace: at the exact peak (request 4) everything but 1000 B is free, 301 MiB of external
    fragmentation; at the moment of peak growth (request 1) nothing is free."""
    trace = synthetic((ALLOC, 100 * MiB, 0), (ALLOC, 200 * MiB, 1), (FREE, 200 * MiB, 1), (FREE, 100 * MiB, 0),
                      (ALLOC, 1000, 2))
    r = replay(trace, "caching")
    assert (r.peak_event, r.peak_growth_event) == (4, 1)
    assert r.external_fragmentation == 302 * MiB - 1024 and r.internal_fragmentation == 24
    assert (r.reserved_at_peak_growth, r.requested_at_peak_growth) == (300 * MiB, 300 * MiB)
    assert r.external_fragmentation_at_growth == 0 == r.internal_fragmentation_at_growth
    s = r.summary()
    assert (s["peak_growth_event"], s["external_fragmentation_at_peak_growth"]) == (1, 0)


def test_the_timeline_is_sampled_as_the_replay_loop_samples_it():
    """replay() replays with one sample per request (to find the peak growth) and cuts the timeline down itself:
    it must match the loop's own sampling, window maxima included."""
    from gmlake.sim.replay import run_requests

    trace = tiny()
    for samples in (1, 7, 2000, 10 ** 7):
        r = replay(trace, "gmlake", samples=samples)
        _, own = run_requests(trace, "gmlake", samples=samples)
        for key in ("event", "reserved", "allocated"):
            assert np.array_equal(r.timeline[key], own["timeline"][key]), (samples, key)


def test_replay_prices_exportable_chunks_at_the_tables_extra(monkeypatch):
    """Chunks are exportable by default (GMLAKE_IPC=0 turns it off, Note [Exporting a chunk]), and the sim driver
    follows the same setting: replay then prices each handle at per_handle plus per_handle_exportable_extra."""
    from gmlake.drivers._cuda_driver import EXPORTABLE_DEFAULT
    from gmlake.drivers._sim_driver import SimDriver
    from gmlake.sim.replay import driver_costs, driver_seconds

    costs = {**driver_costs(), "per_handle_exportable_extra": {"map": 1.0, "set_access": 2.0, "create_chunk": 0.5}}
    monkeypatch.setattr("gmlake.sim.replay.driver_costs", lambda: costs)
    trace = synthetic((ALLOC, 30 * MiB, 0), (FREE, 30 * MiB, 0), (ALLOC, 50 * MiB, 1), (FREE, 50 * MiB, 1))
    monkeypatch.setenv("GMLAKE_IPC", "0")
    plain = replay(trace, "gmlake")
    monkeypatch.setenv("GMLAKE_IPC", "1")
    exportable = replay(trace, "gmlake")
    monkeypatch.delenv("GMLAKE_IPC")
    assert SimDriver().exportable == EXPORTABLE_DEFAULT and SimDriver(exportable=True).exportable
    assert (plain.exportable, exportable.exportable) == (False, True) and exportable.summary()["exportable"]
    handles = exportable.stats["handles"]
    assert plain.stats["handles"] == handles and handles["map"] > 0 and handles["create_chunk"] > 0
    added = (handles["map"] * 1.0 + handles["set_access"] * 2.0 + handles["create_chunk"] * 0.5) * 1e-6
    assert exportable.driver_seconds - plain.driver_seconds == pytest.approx(added)
    assert driver_seconds(exportable.stats, costs, exportable=True) == pytest.approx(exportable.driver_seconds)
    assert exportable.step_time_lost == pytest.approx(exportable.driver_seconds * costs["stall_factor"])
