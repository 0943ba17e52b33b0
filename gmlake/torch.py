"""gmlake under stock PyTorch: install the allocator, read its statistics under torch's names, take snapshots.

    import gmlake.torch
    gmlake.torch.enable()                 # before CUDA is initialised
    ...train...
    print(gmlake.torch.memory_summary())

Or with no code change: `gmlake run train.py args...` (see README for the GMLAKE_* variables).
"""
from __future__ import annotations

import ctypes
import gzip
import os
import pickle
from pathlib import Path
from typing import Any

from gmlake import _torch_bridge, policies
from gmlake._allocator import Allocator

_enabled: dict[str, Any] = {}

# The C entry points in gmlake/_torch_bridge.pyx, and the CUDAPluggableAllocator hook each one serves.
_HOOKS = {
    "set_init_fn": "gmlake_init",
    "set_reset_fn": "gmlake_reset",
    "set_memory_fraction_fn": "gmlake_memory_fraction",
    "set_base_alloc_fn": "gmlake_base_alloc",
    "set_record_stream_fn": "gmlake_record_stream",
}


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(float(value.replace("_", "")))
    except ValueError:
        raise ValueError(f"gmlake: {name}={value!r} is not a number of bytes") from None


def options_from_env() -> dict:
    """Policy and limit settings from GMLAKE_* environment variables (see README)."""
    opts: dict[str, Any] = {}
    if os.environ.get("GMLAKE_KNOBS"):          # any knobs, "k=v,k=v"; the specific variables below win
        opts.update(policies.parse_knobs(k for k in os.environ["GMLAKE_KNOBS"].split(",") if k.strip()))
    if os.environ.get("GMLAKE_POLICY"):
        opts["policy"] = os.environ["GMLAKE_POLICY"]
    for var, knob in (("GMLAKE_CHUNK_SIZE", "chunk_size"), ("GMLAKE_MAX_CACHED_SBLOCKS", "max_cached_sblocks"),
                      ("GMLAKE_MIN_STITCH_SIZE", "min_stitch_size")):
        value = _env_int(var)
        if value is not None:
            opts[knob] = value
    if os.environ.get("GMLAKE_STITCH"):
        opts["stitch"] = os.environ["GMLAKE_STITCH"].lower() not in ("0", "false", "no", "off")
    limit = _env_int("GMLAKE_LIMIT")
    if limit is not None:
        opts["limit"] = limit
    return opts


def enable(policy: str | policies.Policy = "gmlake", *, limit: int = 0, **knobs) -> None:
    """Install gmlake as PyTorch's CUDA allocator, one Allocator per device. Call before CUDA is initialised.

    policy: a built-in policy name or a Policy object; knobs override its fields (e.g. chunk_size=8 << 20).
    limit: a cap on each device's physical memory, in bytes (0: the device's own size).
    """
    import torch

    if _enabled:
        if _enabled["policy"] == policy and _enabled["knobs"] == knobs and _enabled["limit"] == limit:
            return
        raise RuntimeError("gmlake: already enabled with other settings; the allocator cannot change once installed")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "gmlake: CUDA is already initialised, so PyTorch's allocator can no longer be replaced. Call "
            "gmlake.torch.enable() before any CUDA work, or start the program with `gmlake run`.")
    chosen = policies.get(policy, **knobs) if isinstance(policy, str) else policy
    if not isinstance(chosen, policies.Policy):
        raise TypeError(f"gmlake: policy must be a name or a gmlake.policies.Policy, got {type(policy).__name__}")
    if knobs and not isinstance(policy, str):
        raise TypeError("gmlake: pass knobs with a policy name, or set them on the Policy object")

    def factory(device: int) -> Allocator:
        from gmlake import cuda_driver

        made = Allocator(cuda_driver(device), chosen, limit=limit)
        if _history_settings.get("enabled"):
            made.record_history(True, _history_settings["max_entries"])
        return made

    _torch_bridge.configure(factory)
    path = _torch_bridge.__file__
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(path, "gmlake_alloc", "gmlake_free")
    lib = ctypes.CDLL(path)
    raw = pluggable.allocator()
    for setter, symbol in _HOOKS.items():
        hook = getattr(raw, setter, None)
        if hook is None:
            raise RuntimeError(f"gmlake: this PyTorch ({torch.__version__}) lacks CUDAPluggableAllocator.{setter}")
        hook(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(pluggable)
    _guard_graph_capture(torch)
    _enabled.update(policy=policy, knobs=knobs, limit=limit, pluggable=pluggable, chosen=chosen)


def _guard_graph_capture(torch) -> None:
    """CUDA graph capture would bake gmlake's addresses into a graph while the allocator reuses them: refuse it
    with a clear error instead of corrupting memory silently."""
    original = torch.cuda.CUDAGraph.capture_begin

    def capture_begin(self, *args, **kwargs):
        raise RuntimeError(
            "gmlake: CUDA graph capture is not supported under gmlake's allocator yet (captured graphs need a private "
            "memory pool). Run this program without gmlake, or without CUDA graphs (e.g. torch.compile's default "
            "mode rather than mode='reduce-overhead').")

    capture_begin.__wrapped__ = original
    torch.cuda.CUDAGraph.capture_begin = capture_begin


def is_enabled() -> bool:
    """Whether gmlake is PyTorch's CUDA allocator in this process."""
    return bool(_enabled)


def _device(device) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, torch.device):
        return device.index if device.index is not None else torch.cuda.current_device()
    if isinstance(device, str):
        return _device(torch.device(device))
    return int(device)


def allocator(device=None) -> Allocator:
    """The gmlake Allocator serving `device` (default: the current one)."""
    if not _enabled:
        raise RuntimeError("gmlake: not enabled; call gmlake.torch.enable() first")
    return _torch_bridge.allocator(_device(device))


def memory_stats(device=None) -> dict:
    """The allocator's statistics under torch.cuda.memory_stats()'s key names, plus gmlake's own (gmlake.*)."""
    s = allocator(device).stats()
    out: dict[str, int] = {}
    for name, key in (("allocated_bytes", "allocated_bytes"), ("reserved_bytes", "reserved_bytes"),
                      ("active_bytes", "active_bytes"), ("requested_bytes", "requested_bytes")):
        out[f"{name}.all.current"] = s[key]
        out[f"{name}.all.peak"] = s[f"peak_{key}"]
    out["allocation.all.current"] = s["live_blocks"]
    out["num_alloc_retries"] = 0
    out["num_ooms"] = s["ooms"]
    out["num_device_alloc"] = s["calls"]["create_chunk"]
    out["num_device_free"] = s["calls"]["release_chunk"]
    out["num_sync_all_streams"] = s["calls"]["synchronize"]
    for key in ("stitches", "stitched_handles", "sblock_reuses", "sblock_evictions", "cached_sblocks",
                "sblock_va_bytes", "segments_created", "chunks_released", "pending_frees", "stream_migrations"):
        out[f"gmlake.{key}"] = s[key]
    return dict(sorted(out.items()))


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
    """Same as torch.cuda.empty_cache() under gmlake: cached sBlocks and fully free chunks go back to the driver."""
    for a in _torch_bridge.allocators().values():
        a.empty_cache()


def memory_summary(device=None) -> str:
    """A short text report of the allocator's state."""
    d = _device(device)
    s = allocator(d).stats()
    mib = 1 << 20
    util = s["peak_allocated_bytes"] / s["peak_reserved_bytes"] if s["peak_reserved_bytes"] else 1.0
    lines = [
        f"gmlake memory summary, device {d}, policy {_enabled['chosen'].name}",
        f"  allocated  {s['allocated_bytes'] / mib:12.1f} MiB   peak {s['peak_allocated_bytes'] / mib:12.1f} MiB",
        f"  reserved   {s['reserved_bytes'] / mib:12.1f} MiB   peak {s['peak_reserved_bytes'] / mib:12.1f} MiB",
        f"  active     {s['active_bytes'] / mib:12.1f} MiB   peak {s['peak_active_bytes'] / mib:12.1f} MiB",
        f"  utilization (peak allocated / peak reserved) {util:.4f}",
        f"  stitches {s['stitches']}, sBlock reuses {s['sblock_reuses']}, evictions {s['sblock_evictions']}, "
        f"cached sBlocks {s['cached_sblocks']}",
        f"  driver calls: " + ", ".join(f"{k} {v}" for k, v in s["calls"].items() if v),
        f"  out-of-memory errors {s['ooms']}",
    ]
    return "\n".join(lines)


def record_memory_history(enabled: bool = True, max_entries: int = 10_000_000) -> None:
    """Record allocator events on every device (now and later), as torch.cuda.memory._record_memory_history."""
    _history_settings.update(enabled=enabled, max_entries=max_entries)
    for a in _torch_bridge.allocators().values():
        a.record_history(enabled, max_entries)


_history_settings: dict[str, Any] = {}


def snapshot() -> dict:
    """The allocator's state and history in torch's snapshot format (segments, device_traces), readable by
    `gmlake replay` and torch's memory_viz."""
    allocs = _torch_bridge.allocators()
    n = max(allocs, default=-1) + 1
    traces: list[list] = [[] for _ in range(n)]
    segments = []
    for device, a in allocs.items():
        traces[device] = a.history()
        segments.extend(_segments(device, a))
    peak = {d: a.stats() for d, a in allocs.items()}
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"gmlake_policy": _enabled.get("chosen").name if _enabled else None},
        "gmlake": {
            "allocator": "gmlake",
            "max_memory_reserved": max((s["peak_reserved_bytes"] for s in peak.values()), default=0),
            "max_memory_allocated": max((s["peak_allocated_bytes"] for s in peak.values()), default=0),
        },
    }


def _segments(device: int, a: Allocator) -> list[dict]:
    """Segments in torch's format: one per mapped run of a gmlake segment."""
    states = {"free": "inactive", "allocated": "active_allocated", "claimed": "active_allocated"}
    out = []
    for seg in a.segments_info():
        current = None
        for offset, size, state, stream, requested in seg["blocks"]:
            if state == "unmapped":
                current = None
                continue
            if current is None:
                current = {"device": device, "address": seg["va"] + offset, "total_size": 0, "allocated_size": 0,
                           "active_size": 0, "requested_size": 0, "stream": stream,
                           "segment_type": seg["pool"], "segment_pool_id": (0, 0), "is_expandable": False,
                           "frames": [], "blocks": []}
                out.append(current)
            current["total_size"] += size
            if state != "free":
                current["allocated_size"] += size
                current["active_size"] += size
                current["requested_size"] += requested
            current["blocks"].append({"address": seg["va"] + offset, "size": size, "requested_size": requested,
                                      "state": states[state], "frames": []})
    return out


def dump_snapshot(path: str | os.PathLike) -> Path:
    """Write snapshot() as a pickle (gzipped if the name ends in .gz), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    data = pickle.dumps(snapshot(), protocol=pickle.HIGHEST_PROTOCOL)
    tmp.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    tmp.replace(path)
    return path
