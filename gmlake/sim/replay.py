"""Replay a memory trace through a policy on the sim driver: what would this allocator have done on that run?"""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from gmlake.core._allocator import Allocator
from gmlake.drivers._sim_driver import SimDriver
from gmlake.policies import Policy, PolicyChoice, choice_of
from gmlake.sim._replay import replay_events
from gmlake.sim.trace import MAX_DEVICE_MEMORY, Trace, bundled_traces, load, trace_path  # noqa: F401 - re-exported

GRANULARITY = 2 << 20


def driver_costs() -> dict:
    """The per-call cost table measured on an H200 by bench micro (µs)."""
    return json.loads(resources.files("gmlake.sim").joinpath("data/driver_costs_h200.json").read_text())


def driver_seconds(stats: dict, costs: dict | None = None, exportable: bool = False) -> float:
    """Driver time the calls in `stats` would cost on the GPU the table was measured on; each synchronize (a cut at
    reuse, a stage of pressure relief, empty_cache) at the table's price of one in a training step. `exportable`:
    the chunks were exportable (SimDriver.exportable), each handle priced at per_handle plus the table's
    per_handle_exportable_extra (its note says where that came from)."""
    costs = costs or driver_costs()
    us = sum(stats["calls"].get(k, 0) * v for k, v in costs["per_call"].items())
    extra = costs.get("per_handle_exportable_extra", {}) if exportable else {}
    us += sum(stats["handles"].get(k, 0) * (v + extra.get(k, 0.0)) for k, v in costs["per_handle"].items())
    us += sum(stats.get(k, 0) / (1 << 20) * v for k, v in costs.get("per_mib", {}).items())
    return us * 1e-6


def step_time_lost(stats: dict, costs: dict | None = None, exportable: bool = False) -> float:
    """Training time the calls in `stats` would cost on that GPU: their priced driver time times the table's
    stall factor. Note [the stall]: a driver call blocks the CPU thread that feeds the GPU, whose queue drains
    meanwhile, so a run can lose more than the calls' own time. Measured after warm-up on an H200, the loss per
    priced second ranged 0.85-2.5x over six runs of the paper policy (by workload and run); the factor is their
    geometric mean, and predicts 4 of the 6 within +-30 % (docs/benchmarks.md, "Speed")."""
    costs = costs or driver_costs()
    return driver_seconds(stats, costs, exportable) * costs["stall_factor"]


@dataclass
class ReplayResult:
    """What one policy did with one trace. Sizes in bytes.

    At the moment reserved memory first reached its peak, reserved = requested + internal fragmentation (what
    rounding and unsplit remainders add inside live blocks) + external fragmentation (reserved bytes in no live
    block): `requested_at_peak_reserved + internal_fragmentation + external_fragmentation == peak_reserved`.
    The same split is kept at the moment of peak growth (`peak_growth_event`, see `peak_growth_moment`): the exact
    peak can come long after the growth that made it (a small-pool segment once the activations are freed), when
    most reserved memory is free for reasons that have nothing to do with why it was reserved.
    """

    trace: str
    policy: str                # the policy's label: its name and non-default knobs
    events: int
    requests: int
    ooms: int
    seconds: float
    peak_allocated: int
    peak_reserved: int
    allocated_at_peak_reserved: int
    peak_event: int            # index, among the trace's requests, of the one that first took reserved to its peak
    driver_seconds: float
    step_time_lost: float      # predicted training time lost to driver calls (see `step_time_lost()`)
    stats: dict
    timeline: dict = field(repr=False, default_factory=dict)
    peak_requested: int = 0    # the most bytes live allocations asked for at once (before rounding)
    event_lag: int = 0         # requests between an event's recording and its completion (Note [Event lag in replay])
    cap: int = 0               # the memory cap replayed (set_per_process_memory_fraction's, in bytes; 0: none)
    requested_at_peak_reserved: int = 0
    peak_growth_event: int = 0     # the moment of peak growth: the first request within PEAK_GROWTH_WITHIN of the peak
    reserved_at_peak_growth: int = 0
    allocated_at_peak_growth: int = 0
    requested_at_peak_growth: int = 0
    policy_spec: str = ""      # the policy as the user named it (built-in name, module:Class, file.py:Class[...])
    policy_class: str = ""     # module.Class
    knobs: dict = field(default_factory=dict)   # every knob of the policy, with its value
    # Note [The libraries' memory in replay]: times the libraries' memory (as the trace records it) grew where the
    # device had no room left, and the most it held beyond what it held when the capture began.
    library_failures: int = 0
    peak_outside: int = 0
    # the request at which the replay first failed, and how: "oom" (the allocator) or "library" (None: it did not)
    first_failure: int | None = None
    failure_kind: str | None = None
    exportable: bool = False   # the sim driver's chunks were exportable, and priced so (SimDriver.exportable)

    @property
    def failed(self) -> bool:
        """Whether some requests could not be served (out of memory), or the libraries could not take memory they
        took in the captured run: the peaks then cover only what was served."""
        return self.ooms > 0 or self.library_failures > 0

    @property
    def utilization(self) -> float:
        """Peak allocated over peak reserved; NaN for a failed replay, whose peaks are not the run's."""
        if self.failed:
            return math.nan
        return self.peak_allocated / self.peak_reserved if self.peak_reserved else 1.0

    @property
    def fragmentation(self) -> float:
        """The share of reserved memory not allocated at the moment reserved memory peaked; NaN for a failed
        replay."""
        if self.failed:
            return math.nan
        if not self.peak_reserved:
            return 0.0
        return 1.0 - self.allocated_at_peak_reserved / self.peak_reserved

    @property
    def requested_utilization(self) -> float:
        """Peak requested over peak reserved: how much of the memory the policy reserved the program asked for.
        Unlike `utilization` it charges the policy for rounding and unsplit blocks; NaN for a failed replay."""
        if self.failed:
            return math.nan
        return self.peak_requested / self.peak_reserved if self.peak_reserved else 1.0

    @property
    def internal_fragmentation(self) -> int:
        """Bytes inside live blocks that no allocation asked for (allocated - requested), when reserved peaked."""
        return self.allocated_at_peak_reserved - self.requested_at_peak_reserved

    @property
    def external_fragmentation(self) -> int:
        """Reserved bytes in no live block (reserved - allocated), when reserved peaked."""
        return self.peak_reserved - self.allocated_at_peak_reserved

    @property
    def internal_fragmentation_at_growth(self) -> int:
        """allocated - requested at the moment of peak growth."""
        return self.allocated_at_peak_growth - self.requested_at_peak_growth

    @property
    def external_fragmentation_at_growth(self) -> int:
        """reserved - allocated at the moment of peak growth: free memory the policy held yet grew past."""
        return self.reserved_at_peak_growth - self.allocated_at_peak_growth

    def summary(self) -> dict:
        """One flat, JSON-ready record. A failed replay has `failed` true and null ratios. The policy is recorded
        by label (`policy`), spec as given, class and every knob; the fragmentation bytes are at the moment reserved
        memory first peaked (`peak_event`), the `_share` ratios are of peak reserved."""
        ok = not self.failed

        def ratio(value: float) -> float | None:
            return round(value, 6) if ok else None

        reserved = self.peak_reserved or 1
        return {
            "trace": self.trace,
            "policy": self.policy,
            "policy_spec": self.policy_spec,
            "policy_class": self.policy_class,
            "knobs": self.knobs,
            "failed": self.failed,
            "peak_allocated": self.peak_allocated,
            "peak_requested": self.peak_requested,
            "peak_reserved": self.peak_reserved,
            "utilization": ratio(self.utilization),
            "requested_utilization": ratio(self.requested_utilization),
            "fragmentation_at_peak": ratio(self.fragmentation),
            "peak_event": self.peak_event,
            "requested_at_peak": self.requested_at_peak_reserved,
            "allocated_at_peak": self.allocated_at_peak_reserved,
            "internal_fragmentation_at_peak": self.internal_fragmentation,
            "external_fragmentation_at_peak": self.external_fragmentation,
            "internal_fragmentation_share": ratio(self.internal_fragmentation / reserved),
            "external_fragmentation_share": ratio(self.external_fragmentation / reserved),
            "peak_growth_event": self.peak_growth_event,
            "reserved_at_peak_growth": self.reserved_at_peak_growth,
            "requested_at_peak_growth": self.requested_at_peak_growth,
            "allocated_at_peak_growth": self.allocated_at_peak_growth,
            "internal_fragmentation_at_peak_growth": self.internal_fragmentation_at_growth,
            "external_fragmentation_at_peak_growth": self.external_fragmentation_at_growth,
            "events": self.events,
            "requests": self.requests,
            "ooms": self.ooms,
            "library_failures": self.library_failures,
            "peak_outside": self.peak_outside,
            "event_lag": self.event_lag,
            "cap": self.cap,
            "seconds": round(self.seconds, 6),
            "events_per_second": round(self.events / self.seconds) if self.seconds else None,
            "stitches": self.stats["stitches"],
            "sblock_reuses": self.stats["sblock_reuses"],
            "sblock_evictions": self.stats["sblock_evictions"],
            "rebacked_chunks": self.stats["rebacked_chunks"],
            "tails_cut_at_reuse": self.stats["tails_cut_at_reuse"],
            # the plan's hits, misses, re-plans, driver calls after it settled (Note [A plan learned from the run]; None: none)
            "plan": self.stats.get("plan"),
            # priced in driver_seconds at the table's per_call.synchronize (its synchronize_note says how measured)
            "synchronizes": self.stats["calls"]["synchronize"],
            "driver_calls": sum(self.stats["calls"].values()),
            "driver_seconds": round(self.driver_seconds, 6),
            "step_time_lost_seconds": round(self.step_time_lost, 6),
            "exportable": self.exportable,      # the handles priced as exportable ones
        }


def replay(trace: Trace, policy: Policy | str | PolicyChoice = "gmlake", device_memory: int | None = None,
           samples: int = 2000, event_lag: int = 0, cap: int = 0, progress: bool = False) -> ReplayResult:
    """Run `trace`'s requests through `policy` (a spec such as "gmlake" or "my.py:Mine[knob=1]", a Policy, or a
    PolicyChoice) on a simulated device of `device_memory` bytes (default: the captured device's size where the
    trace records it, else MAX_DEVICE_MEMORY). A request the device cannot serve counts as an out-of-memory
    (`ReplayResult.ooms`, `failed`). One pass: the bytes reserved, allocated and requested after every request
    give the state at the peak and at the moment of peak growth. `progress`: show a progress bar on stderr once the
    replay has run PROGRESS_AFTER seconds (a Python hook can make a long trace take that long); Ctrl-C stops it.

    Note [Event lag in replay]: a trace records when each free completed, not when the GPU finished the work queued
    before it, so by default every event the allocator records (the fences of `cross_stream`) is complete when
    first asked about: the GPU as far ahead as it can be, and sharing across streams as eager as it can be.
    `event_lag` = N completes each such event N requests after it was recorded instead, as if the GPU trailed the
    CPU by N requests; a very large N never completes one before a synchronize, which is what keeping blocks per
    stream gives. Single-stream traces replay the same at any lag.

    `cap` (bytes, 0: none) replays a memory cap as torch.cuda.set_per_process_memory_fraction sets one, on the
    modelled device: an allocator may answer a cap differently from a device that size (PyTorch's expandable
    segments do, Note [Releasing before the cap binds])."""
    if event_lag < 0:
        raise ValueError(f"event_lag must be >= 0, got {event_lag}")
    choice = choice_of(policy)
    policy = choice.policy
    n = len(trace.requests())
    # One sample per request (the reserved and allocated bytes right after it), to find the moment of peak growth;
    # the timeline kept is then cut to `samples` windows exactly as the replay loop would have sampled it.
    alloc, out = run_requests(trace, choice, device_memory, samples=max(1, n), event_lag=event_lag, cap=cap,
                              progress=progress)
    stats = alloc.stats()
    per_request = out["timeline"]
    out["timeline"] = _windows(per_request, n, samples)
    growth_event = peak_growth_moment(per_request["reserved"][:n]) if out["peak_reserved"] else 0

    def state_after(request: int) -> dict:
        """The bytes right after `request` (one sample per request: sample i is request i's)."""
        if not out["peak_reserved"]:
            return {"reserved_bytes": 0, "allocated_bytes": 0, "requested_bytes": 0}
        assert per_request["event"][request] == request
        return {f"{key}_bytes": int(per_request[key][request]) for key in ("reserved", "allocated", "requested")}

    peak_state, growth_state = state_after(out["peak_event"]), state_after(growth_event)
    record = choice.record()
    return ReplayResult(
        trace=trace.name,
        policy=choice.label,
        policy_spec=choice.spec,
        policy_class=record["policy_class"],
        knobs=record["knobs"],
        peak_requested=stats["peak_requested_bytes"],
        requested_at_peak_reserved=peak_state["requested_bytes"],
        peak_growth_event=growth_event,
        reserved_at_peak_growth=growth_state["reserved_bytes"],
        allocated_at_peak_growth=growth_state["allocated_bytes"],
        requested_at_peak_growth=growth_state["requested_bytes"],
        events=len(trace),
        requests=out["requests"],
        ooms=out["ooms"],
        library_failures=out["library_failures"],
        peak_outside=out["peak_outside"],
        **_first_failure(out),
        seconds=out["seconds"],
        peak_allocated=out["peak_allocated"],
        peak_reserved=out["peak_reserved"],
        allocated_at_peak_reserved=out["allocated_at_peak_reserved"],
        peak_event=out["peak_event"],
        driver_seconds=driver_seconds(stats, exportable=alloc.driver.exportable),
        step_time_lost=step_time_lost(stats, exportable=alloc.driver.exportable),
        exportable=alloc.driver.exportable,
        stats=stats,
        timeline=out["timeline"],
        event_lag=event_lag,
        cap=cap,
    )


def _first_failure(out: dict) -> dict:
    """Where a replay first failed and how, as a run that stops at its first failure would have."""
    failures = [(at, kind) for at, kind in ((out["first_oom"], "oom"), (out["first_library_failure"], "library"))
                if at is not None]
    if not failures:
        return {}
    at, kind = min(failures)
    return {"first_failure": at, "failure_kind": kind}


PEAK_GROWTH_WITHIN = 0.01


def peak_growth_moment(reserved_after: np.ndarray, within: float = PEAK_GROWTH_WITHIN) -> int:
    """The moment of peak growth: the index of the first request after which reserved memory
    (`reserved_after[i]`, bytes right after request i) is at least (1 - within) * its peak. That request made the
    growth that took reserved memory to (nearly) its peak; growth after it adds less than `within` of the peak."""
    peak = int(reserved_after.max())
    return int(np.argmax(reserved_after >= peak - int(within * peak)))


def _windows(per_request: dict, n: int, samples: int) -> dict:
    """A timeline of one sample per request cut to about `samples` samples as replay_events samples it: at every
    `n // samples`-th request, the largest values since the previous sample, then the final state."""
    every = max(1, n // max(1, samples))
    at = np.arange(0, n, every)
    if not len(at):
        return per_request
    starts = np.concatenate(([0], at[1:] - every + 1))
    out = {"event": np.append(at, n)}
    for key in ("reserved", "allocated"):
        values = per_request[key]
        out[key] = np.append(np.maximum.reduceat(values[:at[-1] + 1], starts), values[n])
    return out


def run_requests(trace: Trace, policy: Policy | str | PolicyChoice = "gmlake", device_memory: int | None = None,
                 upto: int | None = None, samples: int = 2000, event_lag: int = 0,
                 cap: int = 0, progress: bool = False) -> tuple[Allocator, dict]:
    """Serve the trace's first `upto` requests (default: all) with a fresh allocator on the sim driver; return the
    allocator, in the state they left it, and replay_events' result. `event_lag`, `cap` and `progress`: see
    `replay`."""
    choice = choice_of(policy)
    policy = choice.policy
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        raise ValueError(f"cap must be a whole number of bytes >= 0, got {cap!r}")
    alloc = Allocator(SimDriver(capacity=modelled_device_memory(trace, device_memory), granularity=GRANULARITY),
                      policy, limit=cap if cap else None)     # the replay's cap 0: none
    req = trace.requests()[:upto]
    # Dense allocation ids (0..k-1), so the replay's id table is as long as the trace, whatever ids it carries.
    _, dense_ids = np.unique(req["id"], return_inverse=True)
    pools = trace.pool_of_requests()
    if pools is not None:
        pools = np.ascontiguousarray(pools[:upto])
        # Note [Pools in traces]: each graph pool routes only the requests that name it, for the whole replay.
        for key in np.unique(pools[pools != 0]).tolist():
            alloc.begin_allocate_to_pool(key, [])
    outside = trace.outside_of_requests()
    outside_at, outside_bytes = (None, None) if outside is None else outside
    args = (alloc, np.ascontiguousarray(req["action"]), np.ascontiguousarray(req["stream"]),
            np.ascontiguousarray(req["size"]), np.ascontiguousarray(dense_ids.reshape(-1), dtype=np.uint32), samples,
            pools, event_lag)
    held = {"outside_at": outside_at, "outside_bytes": outside_bytes}
    if not progress:
        return alloc, replay_events(*args, **held)
    return alloc, _with_progress(lambda watch: replay_events(*args, watch, **held), len(req),
                                 f"{trace.name}: {choice.label}")


PROGRESS_AFTER = 3.0    # seconds a replay runs before it shows a progress bar


def _progress_console():
    # rich loads only when output is drawn, so importing this module stays light
    from rich.console import Console

    return Console(stderr=True)


def _with_progress(run, events: int, label: str) -> dict:
    """run(watch) (replay_events with its `progress` array) in a worker thread, this thread showing a rich progress
    bar on stderr once it has run PROGRESS_AFTER seconds, where stderr is a terminal. Ctrl-C here stops the worker's
    loop, then interrupts."""
    watch = np.zeros(2, dtype=np.int64)
    done: dict = {}

    def work() -> None:
        try:
            done["out"] = run(watch)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            done["error"] = exc

    worker = threading.Thread(target=work, name="gmlake-replay", daemon=True)
    worker.start()
    try:
        worker.join(PROGRESS_AFTER)
        console = _progress_console() if worker.is_alive() else None
        if console is not None and console.is_terminal:
            # rich loads only when output is drawn, so importing this module stays light
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            with Progress(TextColumn("replaying {task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("events"), TimeRemainingColumn(), console=console, transient=True) as bar:
                task = bar.add_task(label, total=events)
                while worker.is_alive():
                    worker.join(0.2)
                    bar.update(task, completed=int(watch[0]))
        while worker.is_alive():                # no terminal to draw on: wait, still interruptible
            worker.join(0.2)
    except KeyboardInterrupt:
        watch[1] = 1
        worker.join()
        raise
    if "error" in done:
        raise done["error"]
    if done["out"]["stopped"]:
        raise KeyboardInterrupt
    return done["out"]


def modelled_device_memory(trace: Trace, device_memory: int | None = None) -> int:
    """The size of the device a replay models: `device_memory`, else the captured device's where the trace records
    it, else MAX_DEVICE_MEMORY. Always bounded, so no request can make the replay map more than MAX_DEVICE_MEMORY."""
    if device_memory is None:
        device_memory = int(trace.meta.get("device_total", 0) or 0) or MAX_DEVICE_MEMORY
    if not isinstance(device_memory, int) or isinstance(device_memory, bool) or not \
            0 < device_memory <= MAX_DEVICE_MEMORY:
        raise ValueError(f"device memory must be a whole number of bytes from 1 to {MAX_DEVICE_MEMORY}, "
                         f"got {device_memory!r}")
    return device_memory


# Which policy models which captured allocator, and how close its replay must land to the real peak.
FIDELITY = {"native": ("caching", 0.01), "expandable": ("expandable", 0.02)}


def fidelity(paths: list[Path] | None = None) -> list[dict]:
    """Replay each trace through the policy that models the allocator it was captured under, against the
    max_memory_reserved the captured run really reached. One row per trace."""

    rows = []
    for path in paths if paths is not None else bundled_traces():
        trace = load(path)
        allocator = trace.meta.get("allocator")
        real = trace.meta.get("max_memory_reserved")
        if allocator not in FIDELITY or not real:
            continue
        policy, tolerance = FIDELITY[allocator]
        got = replay(trace, policy).peak_reserved
        rows.append({"trace": trace.name, "captured under": allocator, "policy": policy, "real": real,
                     "replayed": got, "error": got / real - 1.0, "tolerance": tolerance})
    return rows
