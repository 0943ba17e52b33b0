"""torch.cuda's memory API, called the way training scripts call it; run natively and under gmlake.

    python tests/gpu_scripts/memory_api.py OUT_DIR            # PyTorch's allocator
    GMLAKE=1 python tests/gpu_scripts/memory_api.py OUT_DIR   # gmlake (or: gmlake run tests/gpu_scripts/...)

Prints a PASS or FAIL line per check, then one JSON line: the memory_stats() keys and what each call returned.
Exits 1 if any check failed.
"""
import json
import sys
from pathlib import Path

import torch
from torch.cuda import max_memory_allocated  # bound at import, as many scripts do

out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gmlake-memory-api")
out_dir.mkdir(parents=True, exist_ok=True)
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


try:
    import gmlake.torch as gt
    under_gmlake = gt.is_enabled()
except ImportError:
    gt, under_gmlake = None, False
print(f"allocator: {'gmlake' if under_gmlake else 'native'}")

torch.cuda.memory._record_memory_history(max_entries=100_000)
MiB = 1 << 20
held = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (64, 64, 64, 64, 8, 3)]
del held[0], held[1]                    # two free 64 MiB blocks, not adjacent
big = torch.ones(100 * MiB, dtype=torch.uint8, device="cuda")   # under gmlake: stitched from them
torch.cuda.synchronize()
check("a 100 MiB tensor holds its bytes", int(big.sum().item()) == 100 * MiB)

results = {
    "memory_allocated": torch.cuda.memory_allocated(),
    "max_memory_allocated": max_memory_allocated(),
    "memory_reserved": torch.cuda.memory_reserved(),
    "max_memory_reserved": torch.cuda.max_memory_reserved(),
}
stats = torch.cuda.memory_stats()
nested = torch.cuda.memory_stats_as_nested_dict()
summary = torch.cuda.memory_summary()
segments = torch.cuda.memory_snapshot()
snapshot = torch.cuda.memory._snapshot()
torch.cuda.memory._dump_snapshot(str(out_dir / "snapshot.pickle"))
from torch.cuda import _memory_viz

(out_dir / "trace.html").write_text(_memory_viz.trace_plot(snapshot))
(out_dir / "segments.html").write_text(_memory_viz.segment_plot(snapshot))

check("memory_allocated counts the live tensors", results["memory_allocated"] >= (2 * 64 + 8 + 3 + 100) * MiB,
      str(results["memory_allocated"]))
check("memory_stats agrees with memory_allocated", stats["allocated_bytes.all.current"] == results["memory_allocated"])
check("max >= current", results["max_memory_allocated"] >= results["memory_allocated"]
      and results["max_memory_reserved"] >= results["memory_reserved"] > 0)
check("memory_stats_as_nested_dict", nested["allocated_bytes"]["all"]["current"] == results["memory_allocated"])
check("memory_summary", "PyTorch CUDA memory summary" in summary)
check("memory_snapshot lists segments", len(segments) > 0 and all("blocks" in s for s in segments))
allocs = [e for e in snapshot["device_traces"][torch.cuda.current_device()] if e["action"] == "alloc"]
check("_snapshot records every allocation", sum(e["size"] == 100 * MiB for e in allocs) == 1, f"{len(allocs)} allocs")
check("_dump_snapshot wrote a pickle", (out_dir / "snapshot.pickle").stat().st_size > 0)
if under_gmlake:
    check("the numbers are gmlake's", results["memory_allocated"] == gt.memory_allocated()
          and results["max_memory_reserved"] == gt.max_memory_reserved())
    check("the 100 MiB tensor was stitched", stats and gt.memory_stats()["gmlake.stitches"] >= 1,
          f"{gt.memory_stats()['gmlake.stitches']} stitches")
    check("gmlake.driver_seconds measures the time inside the CUDA driver's calls",
          0 < gt.memory_stats()["gmlake.driver_seconds"] < 60 and "time inside driver calls" in gt.memory_summary(),
          str(gt.memory_stats()["gmlake.driver_seconds"]))
    check("the stitched tensor sits in a stitched segment of the snapshot at its true size",
          any(b["requested_size"] == 100 * MiB for s in snapshot["segments"] if s.get("gmlake_stitched")
              for b in s["blocks"]))

del big, held
torch.cuda.reset_peak_memory_stats()
after_reset = torch.cuda.max_memory_allocated()
check("reset_peak_memory_stats", after_reset == torch.cuda.memory_allocated(), str(after_reset))
torch.cuda.reset_accumulated_memory_stats()
check("reset_accumulated_memory_stats", torch.cuda.memory_stats()["allocation.all.allocated"] == 0)
torch.cuda.reset_max_memory_allocated()
torch.cuda.memory._record_memory_history(enabled=None)
accelerator_stats = getattr(getattr(torch, "accelerator", None), "memory_stats", None)
accelerator_answer = accelerator_stats() if accelerator_stats else {"allocated_bytes.all.current": "not in this torch"}
check("torch.accelerator.memory_stats", "allocated_bytes.all.current" in accelerator_answer,
      str(accelerator_answer)[:200])
print(json.dumps({"allocator": "gmlake" if under_gmlake else "native", "keys": sorted(stats), **results}))
print("ALL PASS" if not failures else f"{failures} FAILED")
sys.exit(1 if failures else 0)
