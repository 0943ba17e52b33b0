"""The smallest cap a run fits under, found by bisection: the search itself (pure, so tests drive it with a fake
oracle; bench cap search drives it with GPU processes) and replay's answer for a trace (`smallest_cap`), beside
the smallest device it fits on with no cap (`smallest_device_memory`).

Why a cap and not peak reserved: peak reserved is what an allocator keeps when nothing presses it. Under a cap it
can release cached memory and retry, so what a job fits into is the smallest cap it completes under.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import NamedTuple, TypeVar

WIDEN = 1.1             # a bound that turns out wrong moves by this factor per probe
FLOOR = 1e-3            # the smallest fraction ever probed

T = TypeVar("T")


class Bisection(NamedTuple):
    """A search's outcome: the smallest fraction shown to fit (or assumed to, as an upper bound given with hi_fits),
    None when nothing up to the ceiling fit; the largest shown (or assumed) to fail, None when even the floor fit."""
    smallest_fit: float | None
    largest_fail: float | None


Search = Generator[float, bool, T]   # yields the fractions to probe, is sent whether each fit, returns T


def step_until(start: float, factor: float, limit: float, want: bool) -> Search[tuple[float | None, float | None]]:
    """Probe start, start * factor, ... (never past `limit`) until one answers `want`. Returns (the fraction that
    did, or None when `limit` did not either; the last fraction that answered otherwise, or None)."""
    fraction, other = start, None
    while True:
        if (yield fraction) == want:
            return fraction, other
        other = fraction
        if fraction == limit:
            return None, other
        fraction = min(fraction * factor, limit) if factor > 1 else max(fraction * factor, limit)


def bisect_fraction(lo: float, hi: float, resolution: float, *, lo_fails: bool = True, hi_fits: bool = True,
                    ceiling: float = 1.0, floor: float = FLOOR, widen: float = WIDEN) -> Search[Bisection]:
    """The smallest fraction that fits, between `lo` and `hi`, to a relative `resolution`, as a coroutine (pure: no
    processes, so tests drive it with a fake oracle). Bounds not known to hold are probed first and widened by
    `widen` while wrong: an upper bound that fails moves up (to `ceiling` at most), a lower bound that fits moves
    down (to `floor`). Then geometric bisection until hi / lo <= 1 + resolution, since the resolution is relative."""
    if not hi_fits:
        fit, failed = yield from step_until(min(hi, ceiling), widen, ceiling, True)
        if fit is None:
            return Bisection(None, failed)
        hi = fit
        if failed is not None:
            lo, lo_fails = failed, True
    if not lo_fails:
        start = lo if lo < hi else hi / widen
        failed, fit = yield from step_until(max(start, floor), 1 / widen, floor, False)
        if failed is None:
            return Bisection(fit, None)
        lo = failed
        hi = fit if fit is not None else hi
    while hi > lo * (1 + resolution):
        mid = math.sqrt(lo * hi)
        if (yield mid):
            hi = mid
        else:
            lo = mid
    return Bisection(hi, lo)


def drive(search: Search[T], fits: Callable[[float], bool]) -> tuple[T, list[float]]:
    """Run a search against an oracle: its result and the fractions it probed, in order."""
    probed: list[float] = []
    try:
        fraction = next(search)
        while True:
            probed.append(fraction)
            fraction = search.send(fits(fraction))
    except StopIteration as stop:
        return stop.value, probed


def smallest_cap(trace, policy, resolution: float = 0.002, event_lag: int = 0) -> tuple[int, int, list[int]]:
    """The smallest memory cap under which replaying `trace` through `policy` serves every request, to a relative
    `resolution`: (smallest cap that fit, largest that failed, every cap probed), in bytes. The cap is replayed as
    torch.cuda.set_per_process_memory_fraction sets one (the allocator's limit), on the trace's device: what the
    GPU cap search (`python -m bench cap search`) measures. A cap is not a smaller device: PyTorch's expandable
    segments answer the two differently (Note [Releasing before the cap binds]). The bounds need no probe: the
    policy's own uncapped peak reserved fits, and one byte below its peak allocated cannot."""
    return _smallest_limit(trace, policy, "cap", resolution, event_lag)


def smallest_device_memory(trace, policy, resolution: float = 0.002,
                           event_lag: int = 0) -> tuple[int, int, list[int]]:
    """The smallest device, with no cap, on which replaying `trace` through `policy` serves every request, to a
    relative `resolution`: (smallest device memory that fit, largest that failed, every size probed), in bytes.
    Where the device itself is the limit (the usual out-of-memory) the allocator meets it as a driver that has no
    more memory to give, not as a cap it knows of, so a policy may fit the two differently. The upper bound, the
    policy's uncapped peak reserved, is probed (and widened while it fails, up to the trace's own device)."""
    return _smallest_limit(trace, policy, "device_memory", resolution, event_lag)


def limits(trace, policy, resolution: float = 0.002, event_lag: int = 0) -> dict:
    """Both searches for one trace and policy, as `gmlake replay --smallest-cap` and `gmlake compare --smallest-cap`
    report them (one call of `smallest_cap` and one of `smallest_device_memory`): the smallest cap and the smallest
    device that fit and the largest of each that failed, in bytes; the two that fit over the policy's uncapped peak
    allocated (`*_x_peak`; the device's less the most the libraries held beyond their share at the capture's
    start, `libraries_peak`, as a device-limit run on the GPU leaves k x peak + that share); that peak, the uncapped peak reserved, and the replays the two searches took. Raises
    ValueError where the policy runs out of memory on the trace's device even uncapped."""
    # replay needs numpy (the sim extra); the search itself does not, and bench/cap_search.py uses it alone
    from gmlake.sim.replay import replay

    uncapped = replay(trace, policy, samples=0, event_lag=event_lag)
    if uncapped.failed:
        raise ValueError(f"{trace.name}: {uncapped.policy} runs out of memory on the modelled device even "
                         f"uncapped ({uncapped.ooms} requests)")
    fit, fail, probed = smallest_cap(trace, policy, resolution, event_lag)
    device_fit, device_fail, device_probed = smallest_device_memory(trace, policy, resolution, event_lag)
    peak = uncapped.peak_allocated
    libraries = trace.outside_peak
    return {"trace": trace.name, "policy": uncapped.policy,
            "smallest_cap": fit, "largest_failing_cap": fail, "smallest_cap_x_peak": fit / peak,
            "smallest_device_memory": device_fit, "largest_failing_device_memory": device_fail,
            # as a device-limit run counts it: k x peak + the libraries' share (Note [The libraries' memory in
            # replay]); the libraries' share is 0 where the trace records none
            "smallest_device_memory_x_peak": (device_fit - libraries) / peak, "libraries_peak": libraries,
            "peak_allocated": peak, "uncapped_peak_reserved": uncapped.peak_reserved,
            "replays": len(probed) + len(device_probed) + 2}


def _smallest_limit(trace, policy, limit: str, resolution: float, event_lag: int) -> tuple[int, int, list[int]]:
    """smallest_cap (`limit` "cap") or smallest_device_memory (`limit` "device_memory"), written once."""
    # replay needs numpy (the sim extra); the search itself does not, and bench/cap_search.py uses it alone
    from gmlake.sim.replay import modelled_device_memory, replay, run_requests

    uncapped = replay(trace, policy, samples=0, event_lag=event_lag)
    if uncapped.failed:
        raise ValueError(f"{trace.name}: {uncapped.policy} runs out of memory even uncapped "
                         f"({uncapped.ooms} requests), so no cap can fit it")
    reserved = uncapped.peak_reserved
    size = lambda fraction: math.ceil(fraction * reserved)

    def fits(fraction: float) -> bool:             # one pass: out-of-memory and the libraries' failures only
        out = run_requests(trace, policy, samples=1, event_lag=event_lag, **{limit: size(fraction)})[1]
        return out["ooms"] == 0 and out["library_failures"] == 0

    floor = (uncapped.peak_allocated - 1) / reserved
    ceiling = 1.0 if limit == "cap" else max(1.0, modelled_device_memory(trace) / reserved)
    search = bisect_fraction(floor, 1.0, resolution, floor=floor, hi_fits=limit == "cap", ceiling=ceiling)
    result, probed = drive(search, fits)
    return size(result.smallest_fit), size(result.largest_fail), [size(f) for f in probed]
