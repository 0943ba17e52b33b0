"""torch.cuda's memory API under gmlake, on the CPU: torch's own Python functions over gmlake's entry points, with a
sim-driver allocator behind the torch bridge (tests/cpu_scripts/, in its own process: the bridge is process-wide).

The GPU side (native against gmlake on the same program, HF Trainer's memory metrics) is tests/test_torch_gpu.py.
"""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).parent / "cpu_scripts" / "torch_memory_api_on_sim.py"
MiB = 1 << 20

# The keys of torch.cuda.memory_stats() for the native allocator (torch/csrc/cuda/Module.cpp, memoryStats).
STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
               "inactive_split_bytes", "requested_bytes")
TORCH_KEYS = {f"{name}.{pool}.{metric}" for name in STAT_ARRAYS for pool in ("all", "small_pool", "large_pool")
              for metric in ("current", "peak", "allocated", "freed")} | \
    {f"{name}.{metric}" for name in ("oversize_allocations", "oversize_segments")
     for metric in ("current", "peak", "allocated", "freed")} | \
    {"num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc", "num_device_free"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    snap = tmp_path_factory.mktemp("api") / "snap.pickle"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(snap)], capture_output=True, check=False, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), pickle.loads(snap.read_bytes())


def test_memory_stats_has_exactly_torchs_keys(run):
    out, _ = run
    assert set(out["stats"]) == TORCH_KEYS


def test_the_byte_counts_are_gmlakes(run):
    out, _ = run
    live = 2 * 64 * MiB + 100 * MiB        # two 64 MiB blocks and one stitched 100 MiB block
    assert out["stitches"] == 1
    assert out["memory_allocated"] == out["stats"]["allocated_bytes.all.current"] == out["accelerator_allocated"] == live
    assert out["max_memory_allocated"] == 4 * 64 * MiB     # through a name imported before the patch
    assert out["memory_reserved"] == out["max_memory_reserved"] == 4 * 64 * MiB   # the stitch took no new memory
    assert out["max_memory_allocated_after_reset"] == live
    assert out["stats"]["allocation.all.allocated"] == 5 and out["allocations_after_reset_accumulated"] == 0


def test_memory_summary_is_torchs_table_with_gmlakes_numbers(run):
    out, _ = run
    assert "PyTorch CUDA memory summary, device ID 0" in out["summary"]
    assert "| Allocated memory      | 233472 KiB | 262144 KiB |" in out["summary"]


def test_snapshot_and_dump_snapshot_in_torchs_format(run):
    out, dumped = run
    assert out["restored"]
    physical = [s for s in dumped["segments"] if not s.get("gmlake_stitched")]
    assert sum(s["total_size"] for s in physical) == 4 * 64 * MiB
    assert {b["state"] for s in dumped["segments"] for b in s["blocks"]} <= {"active_allocated", "inactive"}
    (stitched,) = [s for s in dumped["segments"] if s.get("gmlake_stitched")]
    assert stitched["address"] == out["stitched_addr"] and stitched["blocks"][0]["requested_size"] == 100 * MiB
    actions = [e["action"] for e in dumped["device_traces"][0]]
    assert actions.count("alloc") == 5 and actions.count("free_completed") == 2
    # every requested byte is counted once: the stitched pieces carry no request of their own
    assert sum(b["requested_size"] for s in dumped["segments"] for b in s["blocks"]) == 2 * 64 * MiB + 100 * MiB
    assert out["snapshot_segments"] == json.loads(json.dumps(dumped["segments"]))


def test_gmlakes_own_counters_and_summary_on_any_driver():
    """gmlake.torch.memory_stats()'s gmlake.* keys and memory_summary()'s report come from the allocator alone, so
    a sim allocator answers them too: its stitch counted, and the driver's measured time, 0 on a model driver (the
    GPU test checks it is measured on the CUDA driver)."""
    import gmlake
    from gmlake.torch import GMLAKE_STAT_KEYS, gmlake_stats_of, summary_of

    alloc = gmlake.Allocator(gmlake.SimDriver(capacity=1 << 30), gmlake.policies.get("gmlake-paper"))
    ptrs = [alloc.malloc(64 * MiB) for _ in range(4)]
    for p in ptrs[::2]:
        alloc.free(p)
    alloc.malloc(100 * MiB)
    stats = gmlake_stats_of(alloc)
    assert set(stats) == {f"gmlake.{k}" for k in GMLAKE_STAT_KEYS} | {"gmlake.driver_seconds"}
    assert stats["gmlake.stitches"] == 1 and stats["gmlake.driver_seconds"] == 0.0
    text = summary_of(alloc, "sim")
    assert text.startswith("gmlake memory summary, sim\n") and "stitches 1," in text
    assert "time inside driver calls 0.000 s" in text and "utilization (peak allocated / peak reserved) " in text
