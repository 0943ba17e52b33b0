"""An eviction researcher sees evictions: the stitched blocks evicted and the chunks re-backed are in `--json`
(replay, compare) and in `--wide`'s table, equal to the allocator's own statistics."""
from __future__ import annotations

import json
import subprocess
import sys

from gmlake.sim.replay import replay
from gmlake.sim.trace import load

# A cap that binds on this trace makes the default policy, with re-backing turned on, re-back pages and evict cached
# stitched blocks.
TRACE, CAP, POLICY = "opt350m-full-ckpt-native", "11.55GiB", "gmlake[reback_slot=2MiB]"


def gmlake(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "gmlake", *args], capture_output=True, text=True, check=False,
                          timeout=600)
    assert proc.returncode in (0, 3), proc.stderr
    return proc.stdout


def test_json_carries_the_allocator_counts():
    expected = replay(load(TRACE), POLICY, cap=int(11.55 * (1 << 30))).stats
    (record,) = [json.loads(line) for line in gmlake("replay", TRACE, "--policy", POLICY, "--cap", CAP,
                                                      "--json").splitlines()]
    assert record["sblock_evictions"] == expected["sblock_evictions"]
    assert record["rebacked_chunks"] == expected["rebacked_chunks"]
    assert record["rebacked_chunks"] > 0      # the cap binds: the figure is not a constant zero


def test_wide_table_shows_them():
    out = gmlake("replay", TRACE, "--policy", POLICY, "--cap", CAP, "--wide")
    header = next(line for line in out.splitlines() if "evictions" in line)
    row = next(line for line in out.splitlines() if "reback_slot" in line and "│" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    names = [c.strip() for c in header.split("┃")[1:-1]]
    expected = replay(load(TRACE), POLICY, cap=int(11.55 * (1 << 30))).stats
    assert cells[names.index("evictions")] == str(expected["sblock_evictions"])
    assert cells[names.index("re-backed")] == str(expected["rebacked_chunks"])
