"""Memory traces: PyTorch snapshots in, a compact format of our own for bundling, one request stream out.

A PyTorch snapshot (torch.cuda.memory._snapshot() / _dump_snapshot()) is a pickle, gzipped or not, whose
`device_traces[device]` lists events with `action` (alloc, free_requested, free_completed, segment_alloc,
segment_free, segment_map, segment_unmap, ...), `addr`, `size` and `stream`. Snapshots are untrusted input: they are
read with an unpickler that refuses every global, so a hostile pickle cannot run code.

The compact format (`.gmtrace`) is lzma-compressed: a magic line, a JSON header (metadata, such as the peaks the run
really reached) and one packed record per event.
"""
from __future__ import annotations

import bisect
import gzip
import io
import json
import lzma
import pickle
import struct
import zlib
from dataclasses import dataclass, field
from importlib import resources
from itertools import pairwise
from pathlib import Path

import numpy as np

from gmlake.policies.settings import format_size
from gmlake.sim import MAX_DEVICE_MEMORY

MAGIC = b"GMLTRACE"
VERSION = 1

# Event actions in the compact format. The replay serves ALLOC and FREE; the segment events give the memory the
# captured run really reserved, for comparison.
ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = range(6)
ACTION_NAMES = ("alloc", "free", "segment_alloc", "segment_free", "segment_map", "segment_unmap")
_SNAPSHOT_ACTIONS = {
    "alloc": ALLOC,
    "free_completed": FREE,
    "segment_alloc": SEGMENT_ALLOC,
    "segment_free": SEGMENT_FREE,
    "segment_map": SEGMENT_MAP,
    "segment_unmap": SEGMENT_UNMAP,
}
EVENT_DTYPE = np.dtype([("action", "u1"), ("stream", "<i8"), ("size", "<u8"), ("id", "<u4")])
# What a compressed trace (a gzipped pickle, a .gmtrace) may unpack to: far more than any captured run's snapshot,
# far less than a crafted file could claim.
MAX_TRACE_BYTES = 4 << 30
MAX_HEADER = 1 << 20
# No GPU holds more (the largest hold 288 GB): a trace event or a device size beyond this is corrupt or hostile, and
# a replay never models a larger device, so a crafted request cannot make it map billions of chunks.


class TraceError(ValueError):
    """A trace file that cannot be read: truncated, corrupted, not a snapshot, or without device traces."""


@dataclass
class Trace:
    """One device's request stream: per event an action, a stream, a size and an allocation id (an alloc and the
    free of the same allocation share an id), plus metadata such as the peaks the captured run reached."""

    events: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.meta.get("name", "trace"))

    def __len__(self) -> int:
        return len(self.events)

    def requests(self) -> np.ndarray:
        """Only the alloc and free events, which the replay serves."""
        return self.events[self.events["action"] <= FREE]

    def pool_of_requests(self) -> np.ndarray | None:
        """Per request (as requests() orders them), the private pool (a CUDA graph's) an alloc was served from, 0 for
        the default pool and for every free; None where the trace records no pool (Note [Pools in traces])."""
        pools = self.meta.get("pools")
        if not pools:
            return None
        req = self.requests()
        out = np.zeros(len(req), dtype=np.uint64)
        for key, ids in pools.items():
            out[(req["action"] == ALLOC) & np.isin(req["id"], np.asarray(ids, dtype=np.uint32))] = int(key)
        return out

    def outside_of_requests(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Where the run held memory outside its allocator, as the replay serves it: (request index from which it
        holds, bytes held), both uint64 and in request order; None where the trace records none (Note [The
        libraries' memory in replay])."""
        series = self.meta.get("outside")
        if not series:
            return None
        at = np.asarray([event for event, _ in series], dtype=np.int64)
        held = np.asarray([size for _, size in series], dtype=np.uint64)
        requests_before = np.concatenate(([0], np.cumsum(self.events["action"] <= FREE)))
        return requests_before[np.minimum(at, len(self.events))].astype(np.uint64), held

    @property
    def outside_peak(self) -> int:
        """The most bytes the run held outside its allocator beyond what it held when recording began (0: none
        recorded): the libraries' share a device limit must leave them."""
        return max((size for _, size in self.meta.get("outside") or ()), default=0)

    def real_reserved_curve(self) -> np.ndarray | None:
        """Bytes the captured run held after each event, from its segment events (None without any)."""
        a = self.events["action"]
        delta = np.zeros(len(a), dtype=np.int64)
        size = self.events["size"].astype(np.int64)
        grow = (a == SEGMENT_ALLOC) | (a == SEGMENT_MAP)
        shrink = (a == SEGMENT_FREE) | (a == SEGMENT_UNMAP)
        if not grow.any():
            return None
        delta[grow] = size[grow]
        delta[shrink] = -size[shrink]
        return np.cumsum(delta)


# The only global a snapshot may name: torch's version string, a str subclass, read as a plain str.
_ALLOWED_GLOBALS = {("torch.torch_version", "TorchVersion"): str}


class _NoGlobals(pickle.Unpickler):
    """Snapshots hold only dicts, lists, strings and numbers: any global beyond a version string is refused."""

    def find_class(self, module: str, name: str):
        allowed = _ALLOWED_GLOBALS.get((module, name))
        if allowed is None:
            raise TraceError(f"snapshot refers to {module}.{name}; refusing to load code from an untrusted pickle")
        return allowed


def _open_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not data:
        raise TraceError(f"{path}: empty file, neither a snapshot pickle nor a .gmtrace")
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = f.read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: corrupted gzip data ({exc})") from None
        _check_unpacked(data, path)
    return data


def _check_unpacked(data: bytes, path: Path) -> None:
    """Refuse a compressed trace that unpacks to more than MAX_TRACE_BYTES: read that far and no further, so a small
    crafted file costs one line, never an allocation of what it claims to hold."""
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{path}: unpacks to more than {format_size(MAX_TRACE_BYTES)}, more than any trace gmlake "
                         f"reads; refusing it")


def bundled_traces() -> list[Path]:
    """The real training traces shipped with gmlake (`gmlake traces` lists them)."""
    folder = resources.files("gmlake.sim").joinpath("data/traces")
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".gmtrace"))


def trace_path(name_or_path: str | Path) -> Path:
    """A trace file: `name_or_path` itself where such a file exists, else the bundled trace of that name
    (`gpt2l-lora-ckpt-native`, with or without `.gmtrace`). Unknown names are returned unchanged, for the reader to
    report as missing."""
    path = Path(name_or_path)
    if path.exists():
        return path
    bundled = {p.name.removesuffix(".gmtrace"): p for p in bundled_traces()}
    return bundled.get(str(name_or_path).removesuffix(".gmtrace"), path)


def load(path: str | Path, device: int | None = None) -> Trace:
    """Read a PyTorch snapshot (pickle, gzipped or not) or a `.gmtrace` file, by path or by the name of a bundled
    trace (`load("opt350m-full-ckpt-native")`; see `bundled_traces`). `device` chooses among a snapshot's devices.
    Raises TraceError for bad input."""
    given, path = path, trace_path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except FileNotFoundError:
        if len(Path(given).parts) == 1:     # a bare name: meant as a file here or as a bundled trace
            raise TraceError(f"no trace file or bundled trace named {str(given)!r}; `gmlake traces` lists the "
                             f"bundled traces") from None
        raise TraceError(f"cannot read {path}: no such file") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not head:
        raise TraceError(f"{path}: empty file, neither a snapshot pickle nor a .gmtrace")
    if head == b"\xfd7zXZ\x00":   # xz: our compact format
        trace = load_compact(path)
        recorded = trace.meta.get("device")
        if device is not None and device != recorded:
            held = f"device {recorded}'s" if recorded is not None else "one device's"
            raise TraceError(f"{path}: a .gmtrace holds {held} trace only, so --device {device} does not apply "
                             f"(it chooses among a snapshot's devices)")
        return trace
    if path.suffix == ".gmtrace":
        raise TraceError(f"{path}: not a .gmtrace file (a .gmtrace is xz-compressed; this is not)")
    return load_snapshot(path, device)


def snapshot_stem(path: Path) -> str:
    """A trace file's name without its suffixes (.pickle.gz, .pickle, .pkl, .gmtrace), other dots kept:
    fsdp.rank1.pickle.gz is fsdp.rank1, so each rank's snapshot keeps its own name in tables and file names."""
    name = path.name
    for suffix in (".gmtrace", ".gz", ".pickle", ".pkl"):
        name = name.removesuffix(suffix)
    return name or path.name


def load_snapshot(path: str | Path, device: int | None = None) -> Trace:
    """Read a PyTorch memory snapshot pickle. `device`: which device's trace (default: the only one with events)."""
    path = Path(path)
    data = _open_bytes(path)
    try:
        snapshot = _NoGlobals(io.BytesIO(data)).load()
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - truncated or corrupted pickles raise many kinds of error
        raise TraceError(f"{path}: not a readable snapshot pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        raise TraceError(f"{path}: not a PyTorch memory snapshot (no device_traces)")
    traces = snapshot["device_traces"]
    nonempty = [i for i, t in enumerate(traces) if isinstance(t, list) and t]
    if device is None:
        if not nonempty:
            raise TraceError(f"{path}: the snapshot has no device trace events (was _record_memory_history on?)")
        if len(nonempty) > 1:
            raise TraceError(f"{path}: events on devices {nonempty}; choose one with --device")
        device = nonempty[0]
    if not (0 <= device < len(traces)) or not traces[device]:
        raise TraceError(f"{path}: no trace events for device {device}")
    meta = _clean_meta(snapshot.get("gmlake"), path)
    meta = {**meta, "name": meta.get("name", snapshot_stem(path)), "device": device, "source": "snapshot"}
    events, pools, times = _convert(traces[device], path, _pool_segments(snapshot.get("segments"), device))
    if pools:
        meta["pools"] = pools
    outside = _outside_series(snapshot.get("gmlake"), times)
    if outside:
        meta["outside"] = outside
    seconds = _span_seconds(traces[device])
    if seconds and "seconds" not in meta:
        meta["seconds"] = seconds
    return Trace(events, meta)


def _span_seconds(entries: list) -> float | None:
    """The seconds from the first to the last trace entry that records its time (time_us), or None."""
    times = [e["time_us"] for e in entries if isinstance(e, dict) and type(e.get("time_us")) is int]
    return (max(times) - min(times)) / 1e6 if len(times) > 1 and max(times) > min(times) else None


# Note [Pools in traces]: PyTorch's trace records no pool begin or end, and its events carry no pool; only the
# snapshot's segment list does (`segment_pool_id`, a pair, (0, 0) for the default pool). An allocation made inside
# a private pool segment that the snapshot still lists, after the segment_alloc event that made that segment, was
# served from that pool: the trace keeps {pool: [allocation ids]} in its metadata, and the replay serves those
# requests from the same pool (Allocator.malloc(..., pool=)), never from or into the default pool's memory. A pool
# whose segments were freed before the snapshot is not seen (its requests replay in the default pool), and a pool
# is never released during the replay: graphs usually live to the end of the run.

def _pool_segments(segments, device: int) -> list[tuple[int, int, int]]:
    """(address, size, pool key) of the snapshot's private-pool segments on `device`; the key packs PyTorch's pair
    as gmlake's bridge does (first << 32 | second)."""
    out = []
    for seg in segments if isinstance(segments, list) else []:
        if not isinstance(seg, dict) or seg.get("device", device) != device:
            continue
        pool = seg.get("segment_pool_id")
        try:
            first, second = (int(pool[0]), int(pool[1])) if pool is not None else (0, 0)
            addr, size = _as_int(seg["address"]), _as_int(seg["total_size"])
        except (KeyError, TypeError, ValueError, IndexError, OverflowError):
            continue
        if (first or second) and 0 <= first < 1 << 32 and 0 <= second < 1 << 32 and size > 0:
            out.append((addr, size, first << 32 | second))
    return out



_META_INTS = ("max_memory_reserved", "max_memory_allocated", "device_total", "device", "events")
_META_STRS = ("name", "allocator", "alloc_conf", "device_name", "torch", "source")
# seconds: the time the trace spans, its first event to its last (from the snapshot's time_us): the steps it
# covers, against which `gmlake tune` weighs driver time (Note [What tune may trade for memory], gmlake/sim/tune.py).
_META_FLOATS = ("seconds",)


def _clean_meta(raw, path: Path) -> dict:
    """The metadata gmlake capture adds, keeping only known keys of the right types (traces are untrusted). A device
    size beyond any device's is refused: the replay models the recorded device."""
    if not isinstance(raw, dict):
        return {}
    meta = {k: raw[k] for k in _META_INTS if isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool)
            and raw[k] >= 0}
    meta.update({k: raw[k][:200] for k in _META_STRS if isinstance(raw.get(k), str)})
    meta.update({k: float(raw[k]) for k in _META_FLOATS if isinstance(raw.get(k), (int, float))
                 and not isinstance(raw.get(k), bool) and 0 < raw[k] < 1e9})
    pools = raw.get("pools")
    if isinstance(pools, dict) and all(isinstance(k, str) and k.isdigit() and 0 < int(k) < 1 << 64
                                       and isinstance(v, list) and all(type(i) is int and 0 <= i < 1 << 32 for i in v)
                                       for k, v in pools.items()):
        meta["pools"] = pools
    elif pools is not None:
        raise TraceError(f"{path}: malformed pool metadata (want {{pool id: [allocation ids]}})")
    outside = raw.get("outside")
    if isinstance(outside, list) and all(isinstance(p, list) and len(p) == 2 and all(type(v) is int for v in p)
                                         and p[0] >= 0 and 0 <= p[1] <= MAX_DEVICE_MEMORY for p in outside) \
            and all(a[0] < b[0] for a, b in pairwise(outside)):
        meta["outside"] = outside
    elif outside is not None:
        raise TraceError(f"{path}: malformed outside-memory metadata (want [[event index, bytes], ...], ascending)")
    if meta.get("device_total", 0) > MAX_DEVICE_MEMORY:
        raise TraceError(f"{path}: records a device of {meta['device_total']} bytes, more than any device holds "
                         f"(at most {format_size(MAX_DEVICE_MEMORY)})")
    return meta


def _check_sizes(sizes: np.ndarray, path: Path) -> None:
    """Refuse a trace with an event larger than any device: it is corrupt or crafted, and no run could make it."""
    if len(sizes) and int(sizes.max()) > MAX_DEVICE_MEMORY:
        i = int(np.argmax(sizes > MAX_DEVICE_MEMORY))
        raise TraceError(f"{path}: event {i} is of {int(sizes[i])} bytes, more than any device holds "
                         f"(at most {format_size(MAX_DEVICE_MEMORY)}); refusing the trace")


def _convert(entries: list, path: Path, pool_segments: list | None = None) -> tuple[np.ndarray, dict, np.ndarray]:
    """The compact events of a snapshot's trace, {pool key (str): [allocation ids]} of the allocations served
    from the private-pool segments in `pool_segments` (Note [Pools in traces]), and each event's time_us (-1 where
    the entry records none)."""
    events = np.empty(len(entries), dtype=EVENT_DTYPE)
    live: dict[int, int] = {}       # address -> allocation id
    next_id = 0
    n = 0
    # A pool segment counts from the last segment_alloc at its address (before it, that memory was something else).
    segs = sorted(pool_segments or [])
    starts = [addr for addr, _, _ in segs]
    born = [0] * len(segs)
    parsed = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise TraceError(f"{path}: malformed trace entry {_short(entry)}")
        name = entry.get("action")
        action = _SNAPSHOT_ACTIONS.get(name) if isinstance(name, str) else None
        if action is None:
            continue
        try:
            addr = _as_int(entry["addr"])
            size = _as_int(entry["size"])
            stream = _as_int(entry.get("stream", 0) or 0)
            when = entry.get("time_us")
            when = when if type(when) is int else -1
        except (KeyError, TypeError, ValueError, OverflowError):
            raise TraceError(f"{path}: malformed trace entry {_short(entry)}") from None
        if not (0 <= size < 1 << 63 and 0 <= stream < 1 << 63 and 0 <= addr < 1 << 64):
            raise TraceError(f"{path}: out-of-range address, size or stream in {_short(entry)}")
        if action == SEGMENT_ALLOC and segs:
            k = bisect.bisect_right(starts, addr) - 1
            if k >= 0 and segs[k][0] == addr:
                born[k] = len(parsed)
        parsed.append((action, addr, size, stream, when))
    pools: dict[str, list[int]] = {}
    times = np.empty(len(parsed), dtype=np.int64)
    for position, (action, addr, size, stream, when) in enumerate(parsed):
        ident = 0
        if action == ALLOC:
            if size == 0:
                continue
            ident = live[addr] = next_id
            next_id += 1
            k = bisect.bisect_right(starts, addr) - 1 if segs else -1
            if k >= 0 and addr < segs[k][0] + segs[k][1] and position >= born[k]:
                pools.setdefault(str(segs[k][2]), []).append(ident)
        elif action == FREE:
            if addr not in live:
                continue   # allocated before recording began: the replay never saw it
            ident = live.pop(addr)
        events[n] = (action, stream, size, ident)
        times[n] = when
        n += 1
    _check_sizes(events["size"][:n], path)
    return events[:n], pools, times[:n]


def _outside_series(raw, times: np.ndarray) -> list[list[int]]:
    """The memory the captured run held outside its allocator (gmlake capture's `outside_allocator` samples,
    [time_us, bytes]), as [event index, bytes beyond the first sample] from the first event at or after each
    sample, keeping only changes; [] where the trace records none or its events carry no time. Malformed samples
    are ignored (a trace is untrusted; the requests are what a replay needs)."""
    samples = raw.get("outside_allocator") if isinstance(raw, dict) else None
    if not isinstance(samples, list) or not samples or not len(times) or int(times.max()) < 0:
        return []
    pairs = [(t, b) for t, b in (s for s in samples if isinstance(s, (list, tuple)) and len(s) == 2)
             if type(t) is int and type(b) is int and 0 <= b <= MAX_DEVICE_MEMORY]
    if not pairs:
        return []
    base = pairs[0][1]
    # Events without a time take the last time before them, so the times searched are ascending.
    known = np.maximum.accumulate(np.where(times >= 0, times, np.iinfo(np.int64).min))
    series: list[list[int]] = []
    for when, held in pairs:
        event = int(np.searchsorted(known, when, side="left"))
        grown = max(0, held - base)
        if series and series[-1][0] == event:
            series[-1][1] = grown
        elif not series or series[-1][1] != grown:
            series.append([event, grown])
    return [pair for pair in series if pair[0] < len(times)] if series else []


def _as_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("not a number")
    return int(value)


def _short(value) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any object's repr may raise
        text = f"<{type(value).__name__}>"
    return text[:80]


def load_compact(path: str | Path) -> Trace:
    """Read a `.gmtrace` file."""
    path = Path(path)
    try:
        with lzma.open(path) as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except (lzma.LZMAError, OSError, EOFError) as exc:
        raise TraceError(f"{path}: corrupted or truncated .gmtrace ({exc})") from None
    _check_unpacked(data, path)
    if data[: len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + 8:
        raise TraceError(f"{path}: not a .gmtrace file")
    version, header_len = struct.unpack_from("<II", data, len(MAGIC))
    if version != VERSION:
        raise TraceError(f"{path}: .gmtrace version {version}, this gmlake reads version {VERSION}")
    start = len(MAGIC) + 8
    if header_len > MAX_HEADER or start + header_len > len(data):
        raise TraceError(f"{path}: truncated .gmtrace header")
    try:
        meta = json.loads(data[start : start + header_len])
    except ValueError as exc:
        raise TraceError(f"{path}: corrupted .gmtrace header ({exc})") from None
    body = data[start + header_len :]
    if len(body) % EVENT_DTYPE.itemsize or not isinstance(meta, dict):
        raise TraceError(f"{path}: truncated .gmtrace events")
    events = np.frombuffer(body, dtype=EVENT_DTYPE).copy()
    if len(events) != meta.get("events", len(events)):
        raise TraceError(f"{path}: .gmtrace holds {len(events)} events, its header says {meta.get('events')}")
    if len(events) and (int(events["action"].max()) >= len(ACTION_NAMES) or int(events["stream"].min()) < 0):
        raise TraceError(f"{path}: corrupted .gmtrace events (unknown action or negative stream)")
    _check_sizes(events["size"], path)
    return Trace(events, _clean_meta(meta, path))


def save_compact(trace: Trace, path: str | Path) -> Path:
    """Write `trace` as a `.gmtrace` file (written to a temporary name, then renamed: never half-written; the
    temporary file is removed if writing fails)."""
    path = Path(path)
    meta = {**trace.meta, "events": len(trace.events)}
    header = json.dumps(meta, sort_keys=True).encode()
    tmp = path.with_name(path.name + ".tmp")
    try:
        with lzma.open(tmp, "wb", preset=9) as f:
            f.write(MAGIC + struct.pack("<II", VERSION, len(header)) + header)
            f.write(np.ascontiguousarray(trace.events, dtype=EVENT_DTYPE).tobytes())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
