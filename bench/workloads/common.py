"""Helpers shared by the training workloads: which allocator this process runs under, its memory peaks, and
gmlake's own counters.

Under gmlake (a pluggable allocator) torch.cuda.memory_stats() and its peaks raise; these helpers read gmlake's
figures through gmlake.torch instead, under torch's names.
"""
from __future__ import annotations

import os
import time

import torch

# gmlake's event counters that say how hard it worked (kept in every summary)
GMLAKE_COUNTERS = ("stitches", "stitched_handles", "sblock_reuses", "sblock_evictions", "cached_sblocks",
                   "segments_created", "chunks_released", "ooms")


def allocator_name() -> str:
    """"gmlake" when gmlake is torch's CUDA allocator in this process, else "expandable" or "native" from
    PYTORCH_CUDA_ALLOC_CONF."""
    try:
        import gmlake.torch as gt

        if gt.is_enabled():
            return "gmlake"
    except ImportError:
        pass
    return "expandable" if "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower() \
        else "native"


def memory_peaks() -> dict:
    """Peak allocated and reserved bytes, from torch or, under gmlake (whose stats torch cannot read), from gmlake."""
    if allocator_name() == "gmlake":
        import gmlake.torch as gt

        return {"max_memory_reserved": gt.max_memory_reserved(), "max_memory_allocated": gt.max_memory_allocated()}
    return {"max_memory_reserved": torch.cuda.max_memory_reserved(),
            "max_memory_allocated": torch.cuda.max_memory_allocated()}


def gmlake_stats() -> dict | None:
    """gmlake's own counters for the run (stitches, sBlock reuses, driver calls and handles by kind), or None
    under torch's allocator."""
    if allocator_name() != "gmlake":
        return None
    import gmlake.torch as gt

    s = gt.allocator().stats()
    return {k: s[k] for k in (*GMLAKE_COUNTERS, "calls", "handles")} | {"chunk_size": gt.allocator().policy.chunk_size}


def gmlake_policy_name() -> str | None:
    """The name of the gmlake policy in use ("gmlake", "gmlake-paper", ...), or None under torch's allocator."""
    if allocator_name() != "gmlake":
        return None
    import gmlake.torch as gt

    return getattr(gt.allocator().policy, "name", None)


def counters_since(before: dict, after: dict) -> dict:
    """What gmlake did between two gmlake_stats() readings: counter and per-kind call differences (cached_sblocks,
    a level rather than a count, is taken as is from `after`)."""
    out = {k: after[k] - before[k] for k in GMLAKE_COUNTERS if k != "cached_sblocks"}
    out["cached_sblocks"] = after["cached_sblocks"]
    for group in ("calls", "handles"):
        out[group] = {kind: after[group][kind] - before[group].get(kind, 0) for kind in after[group]}
    out["driver_calls"] = sum(out["calls"].values())
    return out


class MachineProbe:
    """How fast the machine is right now, measured between steps (outside the timed region).

    Note [Machine regimes]: on the shared H200s a run's steps switch between speed regimes with the same shapes
    (0.24 s and 0.40 s per step on opt1.3b-ckpt, 2026-11-30, under every allocator), so runs of one allocator can
    differ by 46 % and no allocator's ratio near 1 can be read. Three fixed probes after each step say which part
    of the machine changed: `gpu_spin_ms`, a kernel spinning a fixed number of GPU clock cycles (the GPU's clock);
    `launch_ms`, 100 tiny kernel launches and a synchronize (the host and driver path a training step's launches
    take); `cpu_ms`, a fixed pure-Python loop (the host CPU). Each takes about a millisecond and allocates one
    512-byte tensor, once, so peaks stay as they were."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.scratch = torch.zeros(128, device="cuda") if cuda else None

    def __call__(self) -> dict:
        if not self.cuda:
            return {}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.cuda._sleep(1_000_000)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for _ in range(100):
            self.scratch.add_(1.0)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        total = 0
        for i in range(100_000):
            total += i & 7
        t3 = time.perf_counter()
        return {"gpu_spin_ms": (t1 - t0) * 1e3, "launch_ms": (t2 - t1) * 1e3, "cpu_ms": (t3 - t2) * 1e3}
