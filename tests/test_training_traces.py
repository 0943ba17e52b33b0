"""The traces captured during the training benchmark (bench/results/traces) replay to the GPU runs' own peaks.

Each trace was captured under gmlake on an H200 with the same seed, and so the same requests, as the benchmark's
runs. Replaying it through gmlake, its 8 MiB variant and the expandable-segments model must give the peak reserved
bytes those allocators reached on the GPU (bench/results/train), to the byte: the check that today's allocator code
still behaves as the code that was measured.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmlake.policies import get
from gmlake.replay import replay
from gmlake.trace import load

RESULTS = Path(__file__).parent.parent / "bench" / "results"
POLICIES = {"gmlake": get("gmlake-paper"), "gmlake-8m": get("gmlake-paper", chunk_size=8 << 20), "expandable": get("expandable")}


def measured() -> dict[tuple[str, str], int]:
    """(workload, allocator) -> the peak reserved bytes the GPU run reached."""
    out = {}
    for path in sorted((RESULTS / "train").glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            if run.get("returncode") == 0:
                out[(run["workload"], run["allocator"])] = run["max_memory_reserved"]
    return out


CASES = [(trace.name.removesuffix("-gmlake.gmtrace"), allocator)
         for trace in sorted((RESULTS / "traces").glob("*-gmlake.gmtrace")) for allocator in POLICIES]


def test_the_captured_traces_are_there():
    assert len(CASES) == 9


@pytest.mark.parametrize("workload, allocator", CASES)
def test_replay_gives_the_gpu_runs_peak_to_the_byte(workload, allocator):
    trace = load(str(RESULTS / "traces" / f"{workload}-gmlake.gmtrace"))
    assert replay(trace, POLICIES[allocator]).peak_reserved == measured()[(workload, allocator)]
