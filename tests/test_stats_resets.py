"""Every statistic after each reset: Allocator.reset_peak_stats() sets every peak to its current value and changes
nothing else; through torch (torch.cuda.reset_peak_memory_stats / reset_accumulated_memory_stats / memory_stats())
the same, and the accumulated counters restart from zero. A peak that a reset forgets would pass `peak >= current`.

The torch side runs tests/cpu_scripts/stats_resets.py: on the CPU over a sim-driver allocator with the stand-in
entry points; on a GPU (marked gpu) under `gmlake run`, with tensors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fragment

from gmlake import Allocator, SimDriver
from gmlake.policies import PaperPolicy

MiB = 1 << 20
SCRIPT = Path(__file__).parent / "cpu_scripts" / "stats_resets.py"

# Every key of Allocator.stats(): a new statistic must be added here, with what a reset does to it.
PEAKS = {"peak_allocated_bytes": "allocated_bytes", "peak_requested_bytes": "requested_bytes",
         "peak_reserved_bytes": "reserved_bytes", "peak_active_bytes": "active_bytes",
         "peak_sblock_va_bytes": "sblock_va_bytes"}
COUNTERS = {"allocated_bytes", "requested_bytes", "reserved_bytes", "active_bytes", "sblock_va_bytes", "live_blocks",
            "pending_frees", "orphans", "orphan_chunk_bytes", "cached_sblocks", "allocs", "frees", "stitches",
            "stitched_handles", "sblock_reuses", "sblock_evictions", "segments_created", "chunks_released", "ooms",
            "stream_migrations", "stream_waits", "capture_queries", "rebacked_chunks", "copied_bytes",
            "tails_cut_at_reuse", "calls", "handles", "plan",
            "libraries_reserve_bytes", "libraries_largest_rise_bytes", "libraries_rises", "device_asks"}


def every_peak_above_its_current(alloc: Allocator) -> list[int]:
    """A live stitched block, a stitched one freed and evicted, a large block freed, the cache emptied: every peak
    above its current value, every current value above zero. Returns what stays live."""
    live = fragment(alloc, [4, 4, 4])
    live.append(alloc.malloc(12 * MiB))                  # stitched, kept
    live += fragment(alloc, [4, 4, 4])
    alloc.free(alloc.malloc(12 * MiB))                   # stitched, freed: cached, then evicted
    alloc.free(alloc.malloc(64 * MiB))
    live.append(alloc.malloc(1000))                      # the small pool too
    alloc.empty_cache()
    return live


def test_reset_peak_stats_sets_every_peak_to_its_current_value_and_nothing_else():
    alloc = Allocator(SimDriver(capacity=8 << 30), PaperPolicy())
    live = every_peak_above_its_current(alloc)
    before = alloc.stats()
    assert set(before) == set(PEAKS) | COUNTERS
    for peak, current in PEAKS.items():
        assert before[peak] > before[current] > 0, peak
    assert all(before[k] for k in ("allocs", "frees", "stitches", "sblock_evictions", "chunks_released"))
    alloc.reset_peak_stats()
    after = alloc.stats()
    for peak, current in PEAKS.items():
        assert after[peak] == after[current] == before[current], peak
    assert {k: after[k] for k in COUNTERS} == {k: before[k] for k in COUNTERS}
    # From the reset on, each peak is the largest value since: up with a request, not down with its free.
    p = alloc.malloc(8 * MiB)
    up = alloc.stats()
    alloc.free(p)
    down = alloc.stats()
    for peak, current in PEAKS.items():
        assert up[peak] == max(up[current], before[current]) and down[peak] == up[peak], peak
    assert up["peak_allocated_bytes"] == before["allocated_bytes"] + 8 * MiB
    assert down["allocs"] == before["allocs"] + 1 and down["frees"] == before["frees"] + 1
    for q in live:
        alloc.free(q)
    alloc.check()


ACCUMULATED = {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"}


def check_torch_resets(out: dict) -> None:
    before, after_peak = out["before"], out["after_peak_reset"]
    after_acc, more = out["after_accumulated_reset"], out["after_more"]
    peaks = {k for k in before if k.endswith(".peak")}
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        assert before[f"{name}.all.peak"] > before[f"{name}.all.current"] > 0, name
    # reset_peak_memory_stats: every peak is its current value; nothing else moved
    for key in peaks:
        assert after_peak[key] == after_peak[key.removesuffix(".peak") + ".current"], key
    assert {k: v for k, v in after_peak.items() if k not in peaks} == {k: v for k, v in before.items() if k not in peaks}
    assert out["max_allocated_after_peak_reset"] == before["allocated_bytes.all.current"]
    assert out["max_reserved_after_peak_reset"] == before["reserved_bytes.all.current"]
    # reset_accumulated_memory_stats: every count over time restarts from zero; current values and peaks stay
    accumulated = {k for k in before if k.endswith((".allocated", ".freed"))} | ACCUMULATED
    assert before["allocation.all.allocated"] > 0 and before["num_device_alloc"] > 0
    assert {k: after_acc[k] for k in accumulated} == dict.fromkeys(accumulated, 0)
    assert {k: v for k, v in after_acc.items() if k not in accumulated} == \
        {k: v for k, v in after_peak.items() if k not in accumulated}
    # ...and count again from there: one 8 MiB tensor made and freed
    assert more["allocation.all.allocated"] == more["allocation.all.freed"] == 1
    assert more["allocated_bytes.all.peak"] >= before["allocated_bytes.all.current"] + 8 * MiB


def run_script(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, check=False, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_torch_resets_every_peak_and_every_accumulated_count_on_the_cpu():
    pytest.importorskip("torch")
    out = run_script([sys.executable, str(SCRIPT), "sim"])
    check_torch_resets(out)
    gm_before, gm_after = out["gmlake_before"], out["gmlake_after_peak_reset"]
    for peak, current in PEAKS.items():
        assert gm_before[peak] > gm_before[current] and gm_after[peak] == gm_after[current], peak


@pytest.mark.gpu
def test_torch_resets_every_peak_and_every_accumulated_count_on_the_gpu():
    pytest.importorskip("torch")
    check_torch_resets(run_script([sys.executable, "-m", "gmlake", "run", str(SCRIPT), "cuda"]))
