"""gmlake under stock PyTorch: install the allocator, read its statistics under torch's names, take snapshots.

    import gmlake.torch
    gmlake.torch.enable()                 # before CUDA is initialised
    ...train...
    print(gmlake.torch.memory_summary())

Or with no code change: `gmlake run train.py args...` (see README for the GMLAKE_* variables).
"""
from __future__ import annotations

import bisect
import ctypes
import gzip
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from gmlake import policies
from gmlake.core._allocator import Allocator
from gmlake.policies.knobs import coerce_knobs, parse_bool, parse_size, split_settings
from gmlake.torch import _torch_bridge

_enabled: dict[str, Any] = {}

# The C entry points in gmlake/torch/_torch_bridge.pyx, and the CUDAPluggableAllocator hook each one serves.
_HOOKS = {
    "set_init_fn": "gmlake_init",
    "set_reset_fn": "gmlake_reset",
    "set_memory_fraction_fn": "gmlake_memory_fraction",
    "set_base_alloc_fn": "gmlake_base_alloc",
    "set_record_stream_fn": "gmlake_record_stream",
    # CUDA graphs' private pools (PyTorch 2.3+): Note [Graph pools through the bridge] in _torch_bridge.pyx.
    "set_begin_allocate_to_pool": "gmlake_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "gmlake_end_allocate_to_pool",
    "set_release_pool": "gmlake_release_pool",
}


def _env_size(name: str) -> int | None:
    """A GMLAKE_* variable holding bytes (units allowed: 8MiB), or None where unset."""
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    return parse_size(value.strip(), what=name)


def options_from_env(load_policy_code: bool = True) -> dict:
    """Policy and limit settings from GMLAKE_* environment variables (see README), typed by the policy's knobs with
    the same strict parsing as `gmlake run --set` (GMLAKE_STITCH=maybe is an error, not True). GMLAKE_POLICY is any
    policy spec (see gmlake.policies.resolve): a built-in or installed name, module:Class or file.py:Class (whose
    file runs), optionally with inline knobs `NAME[knob=value]`. A ValueError names the variable it is about.
    `load_policy_code=False` (the start-up check of GMLAKE=1): a module:Class or file.py:Class policy is not imported,
    so its knobs are parsed but not typed by it."""
    def named(var: str, parse, *args):
        try:
            return parse(*args)
        except ValueError as exc:
            text = str(exc).removeprefix("gmlake: ")
            raise ValueError(text if text.startswith(var) else f"{var}={os.environ.get(var, '')}: {text}") from exc

    opts: dict[str, Any] = {}
    name = os.environ.get("GMLAKE_POLICY", "").strip() or "gmlake"
    if os.environ.get("GMLAKE_POLICY", "").strip():
        opts["policy"] = name
    given: list[tuple[str, dict[str, object]]] = []    # (variable, its knobs); later ones win
    if os.environ.get("GMLAKE_KNOBS"):          # any knobs, "k=v,k=v"; the specific variables below win
        given.append(("GMLAKE_KNOBS", named("GMLAKE_KNOBS", split_settings,
                                            (k for k in os.environ["GMLAKE_KNOBS"].split(",") if k.strip()))))
    for var, knob in (("GMLAKE_CHUNK_SIZE", "chunk_size"), ("GMLAKE_MAX_CACHED_SBLOCKS", "max_cached_sblocks"),
                      ("GMLAKE_MIN_STITCH_SIZE", "min_stitch_size")):
        value = named(var, _env_size, var)
        if value is not None:
            given.append((var, {knob: value}))
    if os.environ.get("GMLAKE_STITCH"):
        given.append(("GMLAKE_STITCH", {"stitch": named("GMLAKE_STITCH", lambda: parse_bool(
            os.environ["GMLAKE_STITCH"], what="GMLAKE_STITCH"))}))
    base = named("GMLAKE_POLICY", lambda: policies.split_spec(name)[0])
    if load_policy_code or ":" not in base:
        cls = named("GMLAKE_POLICY", policies.policy_class, base)
        for var, settings in given:
            opts.update(named(var, coerce_knobs, cls, settings, name))
    limit = named("GMLAKE_LIMIT", _env_size, "GMLAKE_LIMIT")
    if limit is not None:
        opts["limit"] = limit
    return opts


def policy_from_env(granularity: int | None = 1) -> tuple[policies.PolicyChoice, int]:
    """The policy (with its knobs, validated for `granularity`) and the per-device limit the GMLAKE_* variables
    choose: what `GMLAKE=1` and enable_from_env() install."""
    opts = options_from_env()
    spec = opts.pop("policy", "gmlake")
    limit = opts.pop("limit", 0)
    return policies.resolve(spec, opts, granularity), limit


def enable_from_env() -> None:
    """enable() with the GMLAKE_* settings (GMLAKE_POLICY, GMLAKE_LIMIT, knobs), checked before anything runs."""
    choice, limit = policy_from_env()    # an unknown or ill-typed knob fails here, not at the first allocation
    enable(choice, limit=limit)


def enable(policy: str | policies.Policy | policies.PolicyChoice = "gmlake", *, limit: int = 0, **knobs) -> None:
    """Install gmlake as PyTorch's CUDA allocator, one Allocator per device. Call before CUDA is initialised.

    policy: a policy spec (a built-in or installed name, module:Class, file.py:Class, with optional inline
      `[knob=value]`), a Policy object or a PolicyChoice; knobs override its fields (e.g. chunk_size=8 << 20).
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
    if knobs and not isinstance(policy, str):
        raise TypeError("gmlake: pass knobs with a policy name, or set them on the Policy object")
    if isinstance(policy, str):
        choice = policies.resolve(policy, knobs, granularity=None)
    elif isinstance(policy, (policies.Policy, policies.PolicyChoice)):
        choice = policies.choice_of(policy)
    else:
        raise TypeError(f"gmlake: policy must be a name or a gmlake.policies.Policy, got {type(policy).__name__}")
    chosen = choice.policy
    chosen.check_knobs()        # a knob its growth does not read fails here, not at the first allocation
    from gmlake.torch.capture import torch_cuda_problem

    problem = torch_cuda_problem()      # a CPU-only build has no CUDA allocator to replace: say so, not its internals
    if problem:
        raise RuntimeError(f"gmlake: cannot install gmlake as PyTorch's CUDA allocator: {problem}")

    def factory(device: int) -> Allocator:
        from gmlake.drivers import cuda_driver

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
    install_oom_error(torch)
    torch.cuda.memory.change_current_allocator(pluggable)
    install_memory_api(torch)
    _enabled.update(policy=policy, knobs=knobs, limit=limit, pluggable=pluggable, chosen=chosen, choice=choice)


def install_oom_error(torch) -> bool:
    """Make the bridge raise torch.OutOfMemoryError for an out-of-memory (Note [Torch's out-of-memory type] in
    gmlake/torch/_torch_oom.py): build or load the shim for the running torch and hand it to the bridge. Where it cannot
    be had, warn once, saying why: the error is then a RuntimeError whose text begins as PyTorch's. Whether the shim
    is in place."""
    from gmlake.torch import _torch_oom

    address, why = _torch_oom.thrower(torch)
    _torch_bridge.set_oom_thrower(address)
    if not address:
        import warnings

        warnings.warn(
            f"gmlake: an out-of-memory will be a RuntimeError whose text begins \"CUDA out of memory.\", not "
            f"torch.OutOfMemoryError: the shim that raises torch's type could not be built against torch "
            f"{torch.__version__} ({why})", RuntimeWarning, stacklevel=3)
    return bool(address)


def attach_out_of_memory_observer(observer) -> None:
    """Call observer(device, requested bytes, the cap or else the device's capacity, the device's free bytes) at
    each out-of-memory, before the error is raised: what torch._C._cuda_attach_out_of_memory_observer does, and what
    it does under gmlake (install_memory_api routes it here), e.g. to dump a snapshot at the failure."""
    _torch_bridge.attach_out_of_memory_observer(observer)


def policy_info() -> dict[str, object] | None:
    """The installed policy as results record it (label, spec, class, every knob), or None when not enabled."""
    return _enabled["choice"].record() if _enabled else None


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


# gmlake's own counters in memory_stats(), as gmlake.<name>
GMLAKE_STAT_KEYS = ("stitches", "stitched_handles", "sblock_reuses", "sblock_evictions", "cached_sblocks",
                    "sblock_va_bytes", "segments_created", "chunks_released", "pending_frees", "stream_migrations",
                    "stream_waits", "capture_queries")


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
    """Same as torch.cuda.empty_cache() under gmlake: cached sBlocks and fully free chunks go back to the driver."""
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
    `gmlake replay` and torch's memory_viz; what torch.cuda.memory._snapshot() returns under gmlake."""
    allocators = _torch_bridge.allocators()
    out = snapshot_of(allocators, _enabled["choice"].label if _enabled else None, policy_info())
    import torch

    if allocators and torch.cuda.is_available():    # the device, as gmlake.torch.capture records it: replay models its size
        props = torch.cuda.get_device_properties(min(allocators))
        out["gmlake"].update(device_total=props.total_memory, device_name=props.name, torch=str(torch.__version__))
    return out


def snapshot_of(allocators: dict[int, Allocator], policy_name: str | None = None,
                policy_record: dict | None = None) -> dict:
    """snapshot() for any {device: Allocator}, on any driver (a sim allocator's snapshot renders the same way).
    `policy_record` (PolicyChoice.record()) is kept under allocator_settings as gmlake_policy_spec, _class and
    gmlake_knobs."""
    n = max(allocators, default=-1) + 1
    traces: list[list] = [[] for _ in range(n)]
    segments = []
    for device, a in allocators.items():
        traces[device] = a.history()
        segments.extend(_segments(device, a))
        segments.extend(_stitched_segments(device, traces[device], a.segments_info()))
    peak = {d: a.stats() for d, a in allocators.items()}
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"gmlake_policy": policy_name, **{
            f"gmlake_{key}": value for key, value in (policy_record or {}).items() if key != "policy"}},
        "gmlake": {
            "allocator": "gmlake",
            "max_memory_reserved": max((s["peak_reserved_bytes"] for s in peak.values()), default=0),
            "max_memory_allocated": max((s["peak_allocated_bytes"] for s in peak.values()), default=0),
        },
    }


def _segments(device: int, a: Allocator) -> list[dict]:
    """Physical memory in torch's format: one segment per mapped run of a gmlake segment.

    A piece claimed by a live stitched allocation is `active_allocated` with requested_size 0: its bytes are in use,
    but the request belongs to the stitched allocation, reported at its own address (see _stitched_segments), so
    memory_viz counts every requested byte once.
    """
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
                           "segment_type": seg["pool"], "segment_pool_id": (seg["private_pool"] >> 32, seg["private_pool"] & 0xFFFFFFFF),
                           "is_expandable": False,
                           "frames": [], "blocks": []}
                out.append(current)
            if state == "claimed":
                requested = 0
            current["total_size"] += size
            if state != "free":
                current["allocated_size"] += size
                current["active_size"] += size
                current["requested_size"] += requested
            block = {"address": seg["va"] + offset, "size": size, "requested_size": requested,
                     "state": states[state], "frames": []}
            if state == "claimed":
                block["gmlake_stitched_piece"] = True
            current["blocks"].append(block)
    return out


def _stitched_segments(device: int, trace: list[dict], segments_info: list[dict]) -> list[dict]:
    """The virtual ranges that stitched allocations live at, as segments flagged `gmlake_stitched: True`.

    A stitched allocation's address lies in an sBlock's own virtual range, outside every physical segment, and
    torch's memory_viz places each block inside a segment. Every recorded allocation outside the physical ranges (the
    segments now mapped, and every range the trace maps) is stitched; each such address gets a range as long as the
    largest allocation made there, overlapping ranges merged. Their bytes are the pieces' physical bytes seen a second
    time: sum only the unflagged segments for reserved memory.
    """
    physical: list[list[int]] = []   # disjoint [start, end) ranges, sorted
    for lo, hi in sorted([(seg["va"], seg["va"] + seg["size"]) for seg in segments_info]
                         + [(e["addr"], e["addr"] + e["size"]) for e in trace
                            if e["action"] in ("segment_alloc", "segment_map")]):
        if physical and lo <= physical[-1][1]:
            physical[-1][1] = max(physical[-1][1], hi)
        else:
            physical.append([lo, hi])
    starts = [lo for lo, _ in physical]

    def is_physical(addr: int) -> bool:
        i = bisect.bisect_right(starts, addr) - 1
        return i >= 0 and addr < physical[i][1]

    extent: dict[int, int] = {}       # stitched address -> largest allocation there
    live: dict[int, dict] = {}        # stitched address -> its alloc event, while not freed
    for e in trace:
        if e["action"] == "alloc" and not is_physical(e["addr"]):
            extent[e["addr"]] = max(extent.get(e["addr"], 0), e["size"])
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    ranges: list[list[int]] = []
    for addr in sorted(extent):
        if ranges and addr < ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], addr + extent[addr])
        else:
            ranges.append([addr, addr + extent[addr]])
    out = []
    for lo, hi in ranges:
        blocks, cursor = [], lo
        for addr in sorted(a for a in live if lo <= a < hi):
            if addr > cursor:
                blocks.append({"address": cursor, "size": addr - cursor, "requested_size": 0, "state": "inactive",
                               "frames": []})
            size = live[addr]["size"]
            blocks.append({"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                           "frames": []})
            cursor = addr + size
        if cursor < hi:
            blocks.append({"address": cursor, "size": hi - cursor, "requested_size": 0, "state": "inactive",
                           "frames": []})
        used = sum(b["size"] for b in blocks if b["state"] != "inactive")
        out.append({"device": device, "address": lo, "total_size": hi - lo, "allocated_size": used,
                    "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
                    "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
                    "gmlake_stitched": True})
    return out


def dump_snapshot(path: str | os.PathLike) -> Path:
    """Write snapshot() as a pickle (gzipped if the name ends in .gz), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    data = pickle.dumps(snapshot(), protocol=pickle.HIGHEST_PROTOCOL)
    tmp.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    tmp.replace(path)
    return path


# ---------------------------------------------------------------- torch.cuda's memory API, answered by gmlake
#
# A CUDAPluggableAllocator makes torch's C++ raise on getDeviceStats / resetPeakStats / snapshot / recordHistory /
# attachOutOfMemoryObserver. torch.cuda.memory's Python functions reach those through a few torch._C entry points,
# looked up at call time, so replacing the entry points makes every function built on them (memory_stats,
# memory_allocated, max_memory_*, memory_summary, memory_snapshot, _snapshot, _dump_snapshot, _record_memory_history,
# reset_*) and the out-of-memory observers answer from gmlake, in torch's formats, including in modules that imported
# those functions before gmlake was enabled.

_STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
               "inactive_split_bytes", "requested_bytes")
_accumulated_base: dict[int, dict[str, int]] = {}   # counters at the last reset_accumulated_memory_stats, by device
_replaced_entry_points: dict[str, Any] = {}         # torch._C name -> the original (None where it did not exist)


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


def _torch_snapshot(options=None) -> dict:
    """torch._C._cuda_memorySnapshot(options): options is None or (pool id, pool id, include_traces)."""
    taken = snapshot()
    if isinstance(options, tuple) and len(options) >= 3 and not options[2]:
        taken["device_traces"] = [[] for _ in taken["device_traces"]]
    return taken


def _torch_record_history(enabled, context=None, stacks=None, max_entries=sys.maxsize, *rest) -> None:
    """torch._C._cuda_record_memory_history: enabled is None (off), "state" or "all"; gmlake records every event
    (without stack frames) either way."""
    record_memory_history(enabled is not None, max(1, int(max_entries)))


def _torch_record_history_legacy(enabled: bool, record_context=True, trace_alloc_max_entries=1, *rest) -> None:
    """torch._C._cuda_record_memory_history_legacy, behind _record_memory_history(True/False, ...)."""
    record_memory_history(bool(enabled), max(1, int(trace_alloc_max_entries)))


class CheckpointState:
    """What torch._C._cuda_getCheckpointState answers under gmlake: the private pool and the blocks it had allocated
    when cudagraph trees recorded a graph (torch's own AllocatorState is opaque to Python too)."""

    def __init__(self, device: int, pool: tuple[int, int]):
        self.device = device
        self.pool = tuple(pool)
        key = (self.pool[0] << 32) | self.pool[1]
        a = _torch_bridge.allocators().get(device)
        info = [p for p in a.pools_info() if p["id"] == key] if a is not None else []
        self.allocated_bytes = info[0]["allocated_bytes"] if info else 0

    def __repr__(self) -> str:
        return f"gmlake CheckpointState(device={self.device}, pool={self.pool}, allocated={self.allocated_bytes})"


def _get_checkpoint_state(device: int, pool) -> CheckpointState:
    """torch._C._cuda_getCheckpointState: cudagraph trees take one after recording each graph."""
    return CheckpointState(device, pool)


def _set_checkpoint_pool_state(device, state, stale_storages=(), live_storages=()) -> None:
    """torch._C._cuda_setCheckpointPoolState: cudagraph trees call it to record a new graph while outputs of graphs
    already replayed are alive (a new input shape, or a new path, after replays began). Restoring the pool to a
    checkpoint makes those outputs own their memory again through torch's C++ storage internals, which a pluggable
    allocator cannot reach from Python: refuse with the way out rather than corrupt the pool."""
    raise RuntimeError(
        "gmlake: torch.compile(mode='reduce-overhead') needed to record a new CUDA graph while outputs of replayed "
        "graphs were still alive (cudagraph trees' checkpoint of the allocator, which PyTorch keeps only for its "
        "own allocator). Keep input shapes static under reduce-overhead, call "
        "torch.compiler.cudagraph_mark_step_begin() each step and let last step's outputs die before the next, or "
        "compile with mode='max-autotune-no-cudagraphs'.")


def _check_pool_live_allocations(device: int, pool, expected_live) -> bool:
    """torch._C._cuda_checkPoolLiveAllocations: are the blocks allocated in the private pool exactly the data
    pointers cudagraph trees expect to be alive? (A block freed but still waiting on other streams is not live, as
    in PyTorch's allocator.)"""
    a = _torch_bridge.allocators().get(_device(device))
    key = (int(pool[0]) << 32) | int(pool[1])
    live = set()
    if a is not None:
        for seg in a.segments_info():
            if seg["private_pool"] == key:
                live.update(seg["va"] + offset for offset, _size, state, *_ in seg["blocks"] if state == "allocated")
    return live == set(expected_live)


def _entry_points() -> dict[str, Any]:
    """torch._C name -> gmlake's replacement. The _accelerator_* ones serve torch.accelerator.memory_*."""
    return {
        "_cuda_memoryStats": nested_memory_stats,
        "_cuda_resetPeakMemoryStats": _reset_peak,
        "_cuda_resetAccumulatedMemoryStats": _reset_accumulated,
        "_cuda_memorySnapshot": _torch_snapshot,
        "_cuda_record_memory_history": _torch_record_history,
        "_cuda_record_memory_history_legacy": _torch_record_history_legacy,
        "_accelerator_getDeviceStats": nested_memory_stats,
        "_accelerator_resetPeakStats": _reset_peak,
        "_accelerator_resetAccumulatedStats": _reset_accumulated,
        # torch.accelerator.memory_stats() answers {} unless the allocator reports itself initialised.
        "_accelerator_isAllocatorInitialized": _allocator_initialized,
        # cudagraph trees (torch.compile(mode="reduce-overhead")) checkpoint the allocator after each recording.
        "_cuda_getCheckpointState": _get_checkpoint_state,
        "_cuda_setCheckpointPoolState": _set_checkpoint_pool_state,
        "_cuda_checkPoolLiveAllocations": _check_pool_live_allocations,
        # The observers PyTorch documents for dumping a snapshot at an out-of-memory; the pluggable allocator refuses
        # them, gmlake's bridge calls them.
        "_cuda_attach_out_of_memory_observer": attach_out_of_memory_observer,
    }


def _allocator_initialized(*_args) -> bool:
    """torch._C._accelerator_isAllocatorInitialized: gmlake serves the device once it is enabled."""
    return True


class MemPool:
    """torch.cuda.MemPool under gmlake: a private pool of gmlake's allocator that `torch.cuda.use_mem_pool` routes the
    calling thread's allocations to (through the pool hooks, Note [Graph pools through the bridge]).

    PyTorch's own MemPool asks the allocator for createOrIncrefPool, which it gives only its caching allocator, so
    under any pluggable allocator it fails on construction. This one takes a pool id from torch's own counter
    (graph_pool_handle, so ids never collide with graphs' pools) and holds one use of the pool, as PyTorch's holds its
    reference, until it is deleted. `allocator=` (another allocator for the pool) and `use_on_oom` / `no_split` are
    PyTorch caching-allocator features gmlake does not have: asking for them raises ValueError."""

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        import torch

        unsupported = [name for name, given in (("allocator", allocator is not None), ("use_on_oom", use_on_oom),
                                                ("no_split", no_split)) if given]
        if unsupported:
            raise ValueError(f"gmlake: torch.cuda.MemPool({', '.join(unsupported)}=...) is a feature of PyTorch's "
                             f"caching allocator, which gmlake replaces; create the pool without it")
        self._device = torch.cuda.current_device()
        first, second = torch.cuda.graph_pool_handle()
        self._id = (int(first), int(second))
        self._key = (self._id[0] << 32) | self._id[1]
        self._allocator = _torch_bridge.allocator(self._device)
        self._allocator.begin_allocate_to_pool(self._key, [])     # the pool exists, with this object's use
        self._allocator.end_allocate_to_pool(self._key)

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, as PyTorch's pair."""
        return self._id

    def use_count(self) -> int:
        """The pool's uses: this object's, plus one per use_mem_pool context (or graph) using it now."""
        return next((p["use_count"] for p in self._allocator.pools_info() if p["id"] == self._key), 0)

    def snapshot(self, include_traces: bool = True) -> dict:
        """The snapshot (torch's format) cut to this pool's segments."""
        taken = snapshot()
        taken["segments"] = [seg for seg in taken["segments"] if tuple(seg["segment_pool_id"]) == self._id]
        if not include_traces:
            taken["device_traces"] = [[] for _ in taken["device_traces"]]
        return taken

    def __del__(self) -> None:
        allocator, self._allocator = getattr(self, "_allocator", None), None
        if allocator is not None:
            try:
                allocator.release_pool(self._key)    # its blocks still allocated stay valid, as in PyTorch
            except Exception:  # noqa: BLE001, S110 - a finalizer must not raise
                pass


_replaced_module_attrs: dict[tuple[str, str], Any] = {}     # (module, name) -> the original


def install_memory_api(torch) -> None:
    """Make torch.cuda's memory statistics, snapshot and history functions answer from gmlake (see above), and
    torch.cuda.MemPool make gmlake pools."""
    for name, replacement in _entry_points().items():
        if name not in _replaced_entry_points:
            _replaced_entry_points[name] = getattr(torch._C, name, None)
        setattr(torch._C, name, replacement)
    for module in (torch.cuda, torch.cuda.memory):
        if hasattr(module, "MemPool"):
            _replaced_module_attrs.setdefault((module.__name__, "MemPool"), module.MemPool)
            module.MemPool = MemPool


def restore_memory_api(torch) -> None:
    """Undo install_memory_api: torch._C's own entry points come back."""
    for name, original in _replaced_entry_points.items():
        if original is None:
            delattr(torch._C, name)
        else:
            setattr(torch._C, name, original)
    _replaced_entry_points.clear()
    for (module_name, name), original in _replaced_module_attrs.items():
        setattr(sys.modules[module_name], name, original)
    _replaced_module_attrs.clear()
