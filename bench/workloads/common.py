"""Helpers shared by the training workloads: the allocator in use, its peaks and gmlake's counters (read through
gmlake.torch under gmlake, whose stats torch cannot read), GPU time, and runs under a cap or a device limit.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import torch
from torch import nn

# gmlake's event counters that say how hard it worked (kept in every summary)
GMLAKE_COUNTERS = ("stitches", "stitched_handles", "sblock_reuses", "sblock_evictions", "cached_sblocks",
                   "segments_created", "chunks_released", "stream_migrations", "stream_waits", "ooms")


@dataclass
class Workload:
    """A model and how one step's inputs are drawn, made and turned into a loss."""
    model: nn.Module
    draw_shape: Callable[[random.Random], dict]              # one step's shape, from the schedule's generator
    make_inputs: Callable[[dict, torch.device], dict]        # the tensors for that shape, on the device
    loss: Callable[[nn.Module, dict], torch.Tensor]
    tokens: Callable[[dict], int]                            # tokens (or patches) a step of that shape carries


def draw_range(rng: random.Random, bounds: tuple[int, int], step: int) -> int:
    """A value in [lo, hi] in steps of `step` from lo, uniformly."""
    lo, hi = bounds
    return rng.randrange(lo, hi + 1, step)


def allocator_name() -> str:
    """"gmlake", or "expandable" or "native" from PYTORCH_CUDA_ALLOC_CONF."""
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

        stats = gt.allocator().stats()
        # Note [Leaving the libraries room]: the reserve kept for the libraries at the end, and what it measured
        libraries = {k: stats[k] for k in ("libraries_reserve_bytes", "libraries_largest_rise_bytes",
                                           "libraries_rises", "device_asks") if k in stats}
        return {"max_memory_reserved": gt.max_memory_reserved(), "max_memory_allocated": gt.max_memory_allocated(),
                **({"libraries": libraries} if libraries else {})}
    return {"max_memory_reserved": torch.cuda.max_memory_reserved(),
            "max_memory_allocated": torch.cuda.max_memory_allocated()}


def allocator_ooms() -> int:
    """Requests the allocator answered with out-of-memory, those a library caught too (cuDNN or cuBLAS then pick
    another kernel)."""
    if allocator_name() == "gmlake":
        import gmlake.torch as gt

        return gt.allocator().stats()["ooms"]
    return torch.cuda.memory_stats().get("num_ooms", 0)


def gmlake_stats() -> dict | None:
    """gmlake's counters, calls and handles by kind and seconds inside the driver's calls; None under torch's."""
    if allocator_name() != "gmlake":
        return None
    import gmlake.torch as gt

    alloc = gt.allocator()
    s = alloc.stats()
    return {k: s[k] for k in (*GMLAKE_COUNTERS, "calls", "handles")} | {
        "chunk_size": alloc.policy.chunk_size, "driver_busy_s": alloc.driver.busy_seconds}


def start_snapshot() -> None:
    """Record every allocator event from here on: gmlake's own history under gmlake, torch's otherwise."""
    if allocator_name() == "gmlake":
        import gmlake.torch as gt

        gt.record_memory_history()
    else:
        from gmlake.torch import capture

        capture.start()


def dump_snapshot(path: str) -> None:
    """Write the recorded events as a snapshot that `gmlake replay` reads."""
    if allocator_name() == "gmlake":
        import gmlake.torch as gt

        gt.dump_snapshot(path)
    else:
        from gmlake.torch import capture

        capture.dump(path)


def gmlake_policy_name() -> str | None:
    """The name of the gmlake policy in use ("gmlake", "gmlake-paper", ...), or None under torch's allocator."""
    if allocator_name() != "gmlake":
        return None
    import gmlake.torch as gt

    return getattr(gt.allocator().policy, "name", None)


def counters_since(before: dict, after: dict) -> dict:
    """What gmlake did between two gmlake_stats() readings (cached_sblocks, a level, as is from `after`)."""
    out = {k: after[k] - before[k] for k in GMLAKE_COUNTERS if k != "cached_sblocks"}
    out["cached_sblocks"] = after["cached_sblocks"]
    for group in ("calls", "handles"):
        out[group] = {kind: after[group][kind] - before[group].get(kind, 0) for kind in after[group]}
    out["driver_calls"] = sum(out["calls"].values())
    if "driver_busy_s" in after and "driver_busy_s" in before:     # measured, beside replay's priced time
        out["driver_busy_s"] = after["driver_busy_s"] - before["driver_busy_s"]
    return out


# Kernel classes by name for gpu_time(), first match wins: copies feel memory bandwidth most, GEMMs are compute-bound.
KERNEL_CLASSES = (
    ("copy", ("memcpy", "memset", "copy_kernel", "catarraybatched", "fill")),
    ("gemm", ("gemm", "cutlass", "nvjet", "cublas", "sm90_xmma", "matmul")),
)


def gpu_time(step: Callable[[], None], cuda: bool = True) -> dict:
    """The device time in ms of the kernels one call of `step` launches, in all and by KERNEL_CLASSES, with their
    count. `cuda=False` times CPU operators instead (a smoke test).

    Note [GPU time]: on shared machines step times move with the host (Note [Machine regimes]) while the GPU clock
    stays put, so wall time cannot resolve a few percent between allocators. The kernels' own durations leave out
    the idle gaps and with them the host's noise: what is left is what memory placement can change (docs/benchmarks.md,
    "Speed, and what the runs can resolve"). Callers profile extra steps after the timed ones, shapes already seen,
    so the profiler never enters the timed figures or the peaks."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activity, device_type = (ProfilerActivity.CUDA, DeviceType.CUDA) if cuda else (ProfilerActivity.CPU, DeviceType.CPU)
    try:
        with profile(activities=[activity]) as prof:
            step()
            if cuda:
                torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type == device_type]
    except (RuntimeError, AssertionError) as exc:      # no CUPTI, or a profiler already running
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out = {"total_ms": 0.0, "kernels": 0, **{name: 0.0 for name, _ in KERNEL_CLASSES}, "other": 0.0}
    for event in events:
        if not cuda and event.cpu_parent is not None:   # CPU operators nest; count the outermost only
            continue
        ms = (event.time_range.end - event.time_range.start) / 1e3
        name = event.name.lower()
        kind = next((k for k, keys in KERNEL_CLASSES if any(key in name for key in keys)), "other")
        out[kind] += ms
        out["total_ms"] += ms
        out["kernels"] += 1
    return out


class MachineProbe:
    """How fast the machine is right now, measured between steps (outside the timed region).

    Note [Machine regimes]: on shared machines a run's steps switch between speed regimes with the same shapes, under
    every allocator (docs/benchmarks.md, "Speed, and what the runs can resolve"). Three fixed probes after each step
    say which part changed: `gpu_spin_ms` (a kernel spinning fixed GPU cycles: the GPU's clock), `launch_ms` (100
    tiny launches and a synchronize: the host and driver path), `cpu_ms` (a pure-Python loop: the host CPU). Each
    takes about a millisecond and allocates one 512-byte tensor, once, so peaks stay as they were."""

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


# ---- under a memory cap (--memory-fraction; bench cap search bisects on the answer) -------------------------

OOM_EXIT = 3        # the exit status of a run that ran out of memory under --memory-fraction


def parse_fraction(text: str | None) -> float | None:
    """--memory-fraction's value: None when absent, else a number in (0, 1]; ValueError saying why."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--memory-fraction needs a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:                    # also refuses nan
        raise ValueError(f"--memory-fraction needs a number in (0, 1], got {text}")
    return value


def refuse(script: str, why: str) -> NoReturn:
    """A bad command line: one line on stderr, naming the script, and exit status 2 (no traceback)."""
    print(f"{script}: {why}", file=sys.stderr)
    sys.exit(2)


def memory_fraction(script: str, text: str | None, device: str) -> float | None:
    """--memory-fraction checked (it needs a CUDA device), or refused in one line before the model is built."""
    try:
        fraction = parse_fraction(text)
    except ValueError as exc:
        refuse(script, str(exc))
    if fraction is not None and device != "cuda":
        refuse(script, "--memory-fraction needs --device cuda (it caps a CUDA device's memory)")
    return fraction


LEAVE_FREE_ENV = "GMLAKE_BENCH_LEAVE_FREE"   # bytes: the device is the limit (bench edge-fit)

# Where limit_memory placed a filler (or, with nothing to take, would have): what it took, the device's free bytes
# right after, and what the allocator held then. Empty: no device limit.
_device_limit: dict = {}


def filler_bytes(free: int, leave: int) -> int:
    """The bytes the filler takes so that `leave` of `free` stay free: none where `leave` is all there is."""
    return max(0, free - leave)


def outside_allocator_bytes(free_after_filler: int, free_now: int, reserved_now: int,
                            reserved_at_filler: int = 0) -> int:
    """The device memory taken outside the allocator since the filler: the free memory lost, less the allocator's
    growth. Note [Memory outside the allocator]: CUDA's libraries take memory on first use (handles, kernels,
    workspaces, spilled locals), after the filler; a device limit must leave room for it, or the allocator gets less
    than the bytes the probe means to give it."""
    return free_after_filler - free_now - (reserved_now - reserved_at_filler)


def _reserved_now() -> int:
    """The allocator's reserved bytes: gmlake's own under gmlake, torch's otherwise."""
    if allocator_name() == "gmlake":
        import gmlake.torch as gt

        return gt.memory_reserved()
    return torch.cuda.memory_reserved()


def device_limit_fields() -> dict:
    """Under a device limit: the filler's figures and the bytes outside the allocator now ({} without one). Never
    raises: at an out-of-memory it says why it could not measure instead."""
    if not _device_limit:
        return {}
    out = dict(_device_limit)
    try:
        free_now, _ = torch.cuda.mem_get_info()
        out["outside_allocator_bytes"] = outside_allocator_bytes(
            _device_limit["free_after_filler"], free_now, _reserved_now(), _device_limit["reserved_at_filler"])
    except Exception as exc:  # noqa: BLE001 - a measurement must not hide the run's own outcome
        out["outside_allocator_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def outside_now() -> dict:
    """A step's record of the bytes held outside the allocator so far ({} without a device limit)."""
    fields = device_limit_fields()
    return {"outside_allocator_bytes": fields["outside_allocator_bytes"]} if "outside_allocator_bytes" in fields \
        else {}


def limit_memory(fraction: float) -> int:
    """Cap this process at `fraction` of the device (this initialises CUDA) and, where $GMLAKE_BENCH_LEAVE_FREE names
    bytes, make the device the limit: a cuMemAlloc filler takes all its free memory but those bytes, once the
    context exists (what the libraries take later counts: Note [Memory outside the allocator]). Returns the filler's
    bytes."""
    import ctypes

    torch.cuda.set_per_process_memory_fraction(fraction)
    leave = os.environ.get(LEAVE_FREE_ENV)
    if not leave:
        return 0
    free, _ = torch.cuda.mem_get_info()           # also makes the primary context current on this thread
    take = filler_bytes(free, int(leave))
    if take > 0:
        libcuda = ctypes.CDLL("libcuda.so.1")
        pointer = ctypes.c_uint64()
        rc = libcuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(take))
        if rc != 0:
            raise RuntimeError(f"cuMemAlloc of {take} bytes to leave {leave} free failed: CUresult {rc}")
        limit_memory.filler = pointer             # kept for the process's life
    free_after, _ = torch.cuda.mem_get_info()
    _device_limit.update(leave_free=int(leave), filler_bytes=take, free_after_filler=free_after,
                         reserved_at_filler=_reserved_now())
    return take


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation failure (a RuntimeError saying so where gmlake has no shim for torch's type)."""
    return isinstance(exc, torch.OutOfMemoryError) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc))


def oom_summary(head: dict, step: int | None, fraction: float, exc: BaseException) -> dict:
    """The summary of a run that ran out of memory under its cap: `head`, the step, the error's first line, peaks."""
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    return {**head, "memory_fraction": fraction, "oom": True, "oom_step": step, "error": first_line, **memory_peaks(),
            **device_limit_fields()}


LIBRARY_FAILURE_EXIT = 4     # under a device limit, a step failed with an error other than out-of-memory


def cap_fields(fraction: float | None, filler: int) -> dict:
    """The summary's fields of a run that fit under its cap (none without one)."""
    return {} if fraction is None else {"memory_fraction": fraction, "oom": False, "filler_bytes": filler,
                                        **device_limit_fields()}


def exit_failed(script: str, head: dict, records: list[dict], fraction: float | None, exc: Exception,
                json_path: str | None) -> NoReturn:
    """End a run whose model building or step raised: re-raised unless capped. An out-of-memory under the cap exits
    OOM_EXIT; under a device limit another error (a CUDA library that found no memory, whose failure is not the
    allocator's: Note [The libraries' memory in replay]) exits LIBRARY_FAILURE_EXIT. Either way the summary (the
    step is the number of records, 0 also covering the model's building) goes to `json_path`, one line to stderr."""
    oom = out_of_memory(exc)
    if fraction is None or not (oom or device_limit_fields()):
        raise exc
    step = len(records)
    summary = {**oom_summary(head, step, fraction, exc), "per_step": records}
    if not oom:
        summary.update(oom=False, library_failure=True)
    write_summary(summary, json_path)
    if oom:
        print(f"{script}: out of memory at step {step} under memory fraction {fraction}", file=sys.stderr)
        sys.exit(OOM_EXIT)
    print(f"{script}: step {step} failed outside the allocator: {summary['error']}", file=sys.stderr)
    sys.exit(LIBRARY_FAILURE_EXIT)


def write_summary(summary: dict, json_path: str | None, shown: tuple[str, ...] | None = None) -> None:
    """The summary to `json_path`; with `shown` (keys left out) printed too, as one line of JSON."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(summary, f, indent=1)
    if shown is not None:
        print(json.dumps({k: v for k, v in summary.items() if k not in shown}))


def add_run_arguments(parser, steps: int) -> None:
    """The options every single-process workload takes alike."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, help="steps not timed (default: the first quarter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument("--snapshot", metavar="PATH", help="record every allocator event into this snapshot "
                        "(.pickle.gz; slows the run): a trace for replay")
    parser.add_argument("--memory-fraction", metavar="F",
                        help="cap this process at F (0 < F <= 1) of the device's memory; out of memory: exit 3")
