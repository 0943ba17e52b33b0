"""Memory history and snapshots in torch's format (segments, device_traces), readable by torch.cuda._memory_viz and
by `gmlake replay`."""
from __future__ import annotations

import bisect
import gzip
import os
import pickle
import sys
from pathlib import Path

from gmlake.core._allocator import Allocator
from gmlake.torch import _torch_bridge, outside
from gmlake.torch.state import _enabled, _history_settings, policy_info
from gmlake.torch.stats import memory_reserved


def record_memory_history(enabled: bool = True, max_entries: int = 10_000_000) -> None:
    """Record allocator events on every device (now and later), as torch.cuda.memory._record_memory_history."""
    _history_settings.update(enabled=enabled, max_entries=max_entries)
    for a in _torch_bridge.allocators().values():
        a.record_history(enabled, max_entries)
    if enabled:             # what the libraries hold beside it, for replay (Note [Sampling the libraries' memory])
        outside.start(memory_reserved)
    else:
        outside.stop()


def snapshot() -> dict:
    """The allocator's state and history in torch's snapshot format (segments, device_traces), readable by
    `gmlake replay` and torch's memory_viz; what torch.cuda.memory._snapshot() returns under gmlake."""
    allocators = _torch_bridge.allocators()
    out = snapshot_of(allocators, _enabled["choice"].label if _enabled else None, policy_info())
    # torch is optional: loaded on first use, so import gmlake stays light without it
    import torch

    if allocators and torch.cuda.is_available():    # the device, as gmlake.torch.capture records it: replay models its size
        props = torch.cuda.get_device_properties(min(allocators))
        out["gmlake"].update(device_total=props.total_memory, device_name=props.name, torch=str(torch.__version__))
    held = outside.samples()
    if held:
        out["gmlake"]["outside_allocator"] = held
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
