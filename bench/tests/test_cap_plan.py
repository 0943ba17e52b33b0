"""bench cap plan: probes just above and below replay's smallest device and cap, from gmlake.sim.cap's own searches;
the committed plan (bench/plans/edge-probes.json, which the GPU commands read) agrees with its thresholds and with
replay as it is now."""
from __future__ import annotations

import json

import pytest

from bench import ROOT
from gmlake.sim.cap import limits
from gmlake.sim.trace import load
from tests.conftest import one_line_exit_2

cap_plan = pytest.importorskip("bench.cap_plan")
PLAN = json.loads((ROOT / "bench" / "plans" / "edge-probes.json").read_text())


def test_each_pair_gets_a_probe_above_and_below_its_threshold():
    rows = [{"workload": "cnn", "allocator": "gmlake", "smallest_device_memory": 1_000_000, "smallest_cap": 900_000}]
    assert cap_plan.probes(rows, 0.003, "device") == [
        {"probe": "cnn:gmlake@1003000", "expect": "fit", "threshold": 1_000_000},
        {"probe": "cnn:gmlake@997000", "expect": "oom", "threshold": 1_000_000}]
    assert [p["probe"] for p in cap_plan.probes(rows, 0.003, "cap")] == ["cnn:gmlake@902700", "cnn:gmlake@897300"]


def test_gmlake_and_the_next_allocator_come_first_workload_by_workload():
    rows = [{"workload": w, "allocator": a} for w in ("opt1.3b-ckpt", "opt1.3b-lora-ckpt")
            for a in ("expandable", "gmlake-paper", "gmlake")]
    order = [(r["workload"], r["allocator"]) for r in cap_plan.ordered(rows, ["gmlake", "gmlake-paper", "expandable"])]
    assert order == [("opt1.3b-lora-ckpt", "gmlake"), ("opt1.3b-lora-ckpt", "gmlake-paper"),
                     ("opt1.3b-ckpt", "gmlake"), ("opt1.3b-ckpt", "gmlake-paper"),
                     ("opt1.3b-lora-ckpt", "expandable"), ("opt1.3b-ckpt", "expandable")]


def test_the_committed_plan_brackets_its_thresholds():
    by_pair = {(r["workload"], r["allocator"]): r for r in PLAN["thresholds"]}
    for limit, key in (("device", "smallest_device_memory"), ("cap", "smallest_cap")):
        assert len(PLAN[limit]) == 2 * len(by_pair)
        for item in PLAN[limit]:
            workload, allocator, size = cap_cmd_parts(item["probe"])
            row = by_pair[workload, allocator]
            assert item["threshold"] == row[key]
            if item["expect"] == "fit":
                assert row[key] < size <= row[key] * (1 + PLAN["margin"]) + 1
            else:
                assert row["largest_failing_" + ("device_memory" if limit == "device" else "cap")] > size
        # the GPU engineer's commands take the first twelve: gmlake's and gmlake-paper's pairs
        assert {cap_cmd_parts(i["probe"])[1] for i in PLAN[limit][:12]} == {"gmlake", "gmlake-paper"}


def cap_cmd_parts(item: str) -> tuple[str, str, int]:
    pair, _, size = item.rpartition("@")
    workload, _, allocator = pair.partition(":")
    return workload, allocator, int(size)


# The committed plan's probes ran on the GPU under the default of that time: re-backing on and at most 8 cached
# sBlocks searched per request (both changed since: Note [Taking slots back at the edge], Note [Searching the
# sBlock cache]). Replayed with those two knobs as they were, its thresholds are replays now.
AS_PROBED = {"gmlake": "gmlake[reback_slot=2MiB,sblock_search_depth=8]"}


def test_the_committed_thresholds_are_replays_now():
    """One pair, recomputed: a change to replay or a policy that moves a threshold makes the plan stale."""
    row = next(r for r in PLAN["thresholds"] if (r["workload"], r["allocator"]) == ("opt1.3b-lora-ckpt", "gmlake"))
    now = limits(load(ROOT / row["trace"]), AS_PROBED.get(row["policy"], row["policy"]), resolution=PLAN["resolution"])
    assert (now["smallest_device_memory"], now["smallest_cap"]) == (row["smallest_device_memory"], row["smallest_cap"])


@pytest.mark.parametrize("args, says", [
    (["--margin", "0"], "--margin"),
    (["--resolution", "0.01"], "--margin"),
    (["--pairs", "nosuch=x"], "--pairs takes WORKLOAD=TRACE"),
    (["--pairs", "cnn=/no/such.gmtrace"], "no such file"),
    (["--allocators", "nosuch"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    assert says in one_line_exit_2(["-m", "bench", "cap", "plan", *args])
