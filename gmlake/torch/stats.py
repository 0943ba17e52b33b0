"""gmlake's statistics under torch's names: memory_stats() and the memory_* functions, with gmlake's own counters
(gmlake.*), and the nested form torch.cuda.memory_stats() is built from."""
from __future__ import annotations

from typing import Any

from gmlake.core._allocator import Allocator
from gmlake.torch import _torch_bridge, sharing
from gmlake.torch.state import _device, _enabled, allocator

# gmlake's own counters in memory_stats(), as gmlake.<name>
GMLAKE_STAT_KEYS = ("stitches", "stitched_handles", "sblock_reuses", "sblock_evictions", "cached_sblocks",
                    "sblock_va_bytes", "segments_created", "chunks_released", "pending_frees", "stream_migrations",
                    "stream_waits", "capture_queries", "libraries_reserve_bytes", "libraries_largest_rise_bytes")


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats()'s keys, answered from gmlake, plus gmlake's own counters (gmlake.*)."""
    d = _device(device)
    out = dict(_flatten(nested_memory_stats(d)))
    out.update(gmlake_stats_of(allocator(d)))
    return dict(sorted(out.items()))


def gmlake_stats_of(alloc: Allocator) -> dict:
    """An allocator's own counters as memory_stats() names them (gmlake.stitches, ...), and gmlake.driver_seconds:
    the time measured inside its driver's calls (0 on the model drivers), what the allocator has cost the CPU
    thread that called it."""
    s = alloc.stats()
    return {**{f"gmlake.{key}": s[key] for key in GMLAKE_STAT_KEYS},
            "gmlake.driver_seconds": alloc.driver.busy_seconds}


def _flatten(nested: dict, prefix: str = ""):
    """("a.b.c", value) pairs of a nested dict, as torch.cuda.memory_stats() flattens its C++ answer."""
    for key, value in nested.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def memory_allocated(device=None) -> int:
    """Bytes held by live tensors (rounded block sizes), like torch.cuda.memory_allocated()."""
    return allocator(device).stats()["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated() since the start or the last reset_peak_memory_stats()."""
    return allocator(device).stats()["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    """Physical memory the allocator holds, like torch.cuda.memory_reserved()."""
    return allocator(device).stats()["reserved_bytes"]


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved() since the start or the last reset_peak_memory_stats()."""
    return allocator(device).stats()["peak_reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    """Reset every peak to the current value, like torch.cuda.reset_peak_memory_stats()."""
    allocator(device).reset_peak_stats()


def empty_cache() -> None:
    """Same as torch.cuda.empty_cache() under gmlake: cached sBlocks and fully free chunks go back to the driver,
    with the blocks of receivers that died holding them (Note [A receiver's hold the kernel drops])."""
    sharing.collect()
    for a in _torch_bridge.allocators().values():
        a.empty_cache()


def memory_summary(device=None) -> str:
    """A short text report of the allocator's state."""
    d = _device(device)
    return summary_of(allocator(d), f"device {d}, policy {_enabled['choice'].label} ({_enabled['choice'].spec})")


def summary_of(alloc: Allocator, title: str) -> str:
    """memory_summary()'s report of any allocator (on any driver), under `title`."""
    s = alloc.stats()
    mib = 1 << 20
    util = s["peak_allocated_bytes"] / s["peak_reserved_bytes"] if s["peak_reserved_bytes"] else 1.0
    lines = [
        f"gmlake memory summary, {title}",
        f"  allocated  {s['allocated_bytes'] / mib:12.1f} MiB   peak {s['peak_allocated_bytes'] / mib:12.1f} MiB",
        f"  reserved   {s['reserved_bytes'] / mib:12.1f} MiB   peak {s['peak_reserved_bytes'] / mib:12.1f} MiB",
        f"  active     {s['active_bytes'] / mib:12.1f} MiB   peak {s['peak_active_bytes'] / mib:12.1f} MiB",
        f"  utilization (peak allocated / peak reserved) {util:.4f}",
        (f"  stitches {s['stitches']}, sBlock reuses {s['sblock_reuses']}, evictions {s['sblock_evictions']}, "
         f"cached sBlocks {s['cached_sblocks']}"),
        (f"  blocks another stream freed: taken after its work {s['stream_migrations']}, "
         f"after a wait on the GPU {s['stream_waits']}"),
        "  driver calls: " + ", ".join(f"{k} {v}" for k, v in s["calls"].items() if v),
        f"  time inside driver calls {alloc.driver.busy_seconds:.3f} s (measured; 0 on a model driver)",
        f"  out-of-memory errors {s['ooms']}",
        (f"  kept free for the CUDA libraries {s['libraries_reserve_bytes'] / mib:.0f} MiB "
         f"(largest rise measured {s['libraries_largest_rise_bytes'] / mib:.0f} MiB)"),
    ]
    return "\n".join(lines)


_STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
               "inactive_split_bytes", "requested_bytes")


_accumulated_base: dict[int, dict[str, int]] = {}   # counters at the last reset_accumulated_memory_stats, by device


def _stat(current: int = 0, peak: int = 0, allocated: int = 0, freed: int = 0) -> dict[str, int]:
    return {"current": current, "peak": peak, "allocated": allocated, "freed": freed}


def nested_memory_stats(device: int | None = None) -> dict[str, Any]:
    """What torch._C._cuda_memoryStats(device) returns for the native allocator, from gmlake's counters.

    gmlake counts bytes and allocations for the whole device, not per pool, so `all` carries them and `small_pool` /
    `large_pool` are 0; it does not count segments or inactive splits (0), nor bytes allocated or freed over time
    (0). Peaks of counts are not tracked either: allocation and active report their current count as the peak.
    """
    device = _device(device)
    a = _torch_bridge.allocators().get(device)
    stats: dict[str, Any] = {name: {"all": _stat(), "small_pool": _stat(), "large_pool": _stat()}
                             for name in _STAT_NAMES}
    stats.update(num_alloc_retries=0, num_ooms=0, max_split_size=-1, num_sync_all_streams=0, num_device_alloc=0,
                 num_device_free=0, oversize_allocations=_stat(), oversize_segments=_stat())
    if a is None:       # nothing allocated on this device yet
        return stats
    s = a.stats()
    base = _accumulated_base.get(device, {})

    def counted(key: str, value: int) -> int:
        return value - base.get(key, 0)

    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        stats[name]["all"] = _stat(s[name], s[f"peak_{name}"])
    live = s["live_blocks"]
    stats["allocation"]["all"] = _stat(live, live, counted("allocs", s["allocs"]), counted("frees", s["frees"]))
    active = live + s["pending_frees"]
    stats["active"]["all"] = _stat(active, active)
    calls = s["calls"]
    stats.update(num_ooms=counted("ooms", s["ooms"]),
                 num_sync_all_streams=counted("synchronize", calls["synchronize"]),
                 num_device_alloc=counted("create_chunk", calls["create_chunk"]),
                 num_device_free=counted("release_chunk", calls["release_chunk"]))
    return stats


def _reset_accumulated(device: int | None = None) -> None:
    device = _device(device)
    a = _torch_bridge.allocators().get(device)
    if a is not None:
        s = a.stats()
        _accumulated_base[device] = {"allocs": s["allocs"], "frees": s["frees"], "ooms": s["ooms"],
                                     **{k: s["calls"][k] for k in ("synchronize", "create_chunk", "release_chunk")}}


def _reset_peak(device: int | None = None) -> None:
    a = _torch_bridge.allocators().get(_device(device))
    if a is not None:
        a.reset_peak_stats()
