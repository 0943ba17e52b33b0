"""`gmlake tune`: which policy and knobs suit one job, found by replaying the job's own trace.

Every setting of a small search (`search_space`) is replayed on the sim driver, in parallel over the machine's
cores, and measured three ways: peak reserved memory with nothing pressing it, the smallest memory the job
completes in (under a memory cap on the trace's device, as GMLAKE_LIMIT or set_per_process_memory_fraction set one,
and as the size of a device with no cap), and the driver time its calls would cost, priced by the H200 table
(gmlake.sim.replay.driver_seconds). The settings no other beats on all three form the front; one is recommended
(`recommend`) with the exact lines that install it.

    gmlake tune TRACE [--fit SIZE] [--json] [--plot FILE] [--jobs N]

Note [The tune search]: the knobs searched are the ones that move memory or driver time on the bundled traces
(`gmlake tune opt350m-full-ckpt-native --all` shows every setting); those that moved neither were left out, so that
a search stays under a minute on two cores.
- The built-in policies at their defaults: the reference points (caching and expandable model PyTorch's allocators).
- gmlake's page size (`expandable_page_large`, 4 MiB to 128 MiB; default 20 MiB): finer pages leave less free
  memory in mapped pages, coarser ones make fewer driver calls. On opt350m-full-ckpt-native 4 MiB pages reserve
  0.10 GiB less than 20 MiB at 6x the priced driver time, 64 MiB pages 0.13 GiB more at a third of it.
- gmlake's stitch threshold (`min_saved_chunks` 1, default 3) at each page size, and 0: stitching more often saves
  memory at the price of driver calls; and never stitching (`stitch=false`).
- gmlake's page under a cap (`capped_page_large` 4 MiB, finer than the default's 20 MiB from the moment a cap is
  set; the default keeps its pages and, at the limit, stitches in 2 MiB pages: `edge_page`; it re-backs nothing).
- The paper's chunk size (`chunk_size` 8 and 20 MiB, default 2 MiB): coarser chunks cut its driver time 4-10x.
- Where the trace has several streams: gmlake without the cross-stream wait, and without cross-stream reuse.
Left out: the cached-sBlock bound (`max_cached_sblocks` 0 or 64 changed no bundled trace's memory under either
stitching policy: the default's sBlocks serve only requests no free block fits), `sblock_first` (more stitches, no
less memory) and caching's `max_split_size` (more memory on every bundled trace).

Note [What tune may trade for memory]: a recommendation must be one a user would take, so the default policy is the
reference, and a setting that reserves more memory than the default is recommended only where the driver time it
saves is visible in the job's steps: at least VISIBLE (1 %) of the step time. A trace covers whole steps, so that is
driver time saved over the trace of at least 1 % of the time the trace spans (`seconds` in its metadata: its first
event to its last, recorded from the snapshot's times). A trace that records no time (the bundled ones, captured
before traces kept it) gives no such margin, so nothing that reserves more than the default is recommended for it.
With --fit the same holds of the memory reserved and the driver time under that fit, where the default fits.
"""
from __future__ import annotations

import math
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gmlake import policies
from gmlake.policies.settings import format_size
from gmlake.sim.cap import bisect_fraction, drive
from gmlake.sim.compare import Name
from gmlake.sim.plots import BUILTIN_COLORS, pyplot
from gmlake.sim.replay import driver_seconds, modelled_device_memory, run_requests, step_time_lost
from gmlake.sim.trace import Trace
from gmlake.sim.workers import default_jobs, map_in_processes

MiB = 1 << 20
GiB = 1 << 30
WITHIN = 1.05           # without --fit: the least memory among settings this close to the fastest driver time
# ... or this close in seconds: a captured trace is tens of steps, so 50 ms of priced driver time over all of it is
# about a millisecond a step, well inside a step's own run-to-run variation. Without it the ratio alone compares
# milliseconds: a rule that keeps only PyTorch's own 3 ms would give up gigabytes to save 25 ms over a whole run.
TIE_SECONDS = 0.05
VISIBLE = 0.01          # Note [What tune may trade for memory]: driver time saved per step, as a share of a step
DEFAULT_POLICY = "gmlake"
RESOLUTION = 0.002      # the bisections' relative resolution, as `gmlake replay --smallest-cap`'s
PAGES = (4 * MiB, 8 * MiB, 20 * MiB, 64 * MiB, 128 * MiB)


@dataclass(frozen=True)
class Setting:
    """One point of the search: a policy name and the knobs it changes from that policy's defaults (typed)."""

    policy: str
    knobs: tuple[tuple[str, object], ...] = ()

    @property
    def spec(self) -> str:
        """The setting as a policy spec, `gmlake[expandable_page_large=8MiB]`, which every command takes."""
        if not self.knobs:
            return self.policy
        return f"{self.policy}[{','.join(f'{k}={knob_text(v)}' for k, v in self.knobs)}]"


def knob_text(value: object) -> str:
    """A knob's value as GMLAKE_KNOBS and a spec's brackets write it: sizes in the largest whole binary unit."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= 1024:
        for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
            if value % scale == 0:
                return f"{value // scale}{unit}"
    return str(value)


def search_space(trace: Trace) -> list[Setting]:
    """The settings `tune` replays for `trace` (Note [The tune search])."""
    out = [Setting(name) for name in policies.names()]
    for page in PAGES:
        page_knob = () if page == 20 * MiB else (("expandable_page_large", page),)
        for saved in (1, 3):
            knobs = page_knob + ((("min_saved_chunks", saved),) if saved != 3 else ())
            if knobs:
                out.append(Setting("gmlake", knobs))
    out += [Setting("gmlake", (("min_saved_chunks", 0),)),
            Setting("gmlake", (("stitch", False),)),
            Setting("gmlake", (("capped_page_large", 4 * MiB),)),
            Setting("gmlake-paper", (("chunk_size", 8 * MiB),)),
            Setting("gmlake-paper", (("chunk_size", 20 * MiB),))]
    if len(np.unique(trace.requests()["stream"])) > 1:
        out += [Setting("gmlake", (("cross_stream_wait", False),)), Setting("gmlake", (("cross_stream", False),))]
    return out


@dataclass
class Outcome:
    """What one setting did with the trace. Sizes in bytes, times in seconds (priced on the H200 table)."""

    policy: str                   # the label: name and non-default knobs
    spec: str
    base: str                     # the policy's name
    knobs: dict                   # the knobs changed from the policy's defaults, typed
    failed: bool                  # requests ran out of memory uncapped on the modelled device
    peak_reserved: int
    peak_allocated: int
    driver_seconds: float
    step_time_lost: float
    stitches: int
    driver_calls: int
    smallest_cap: int | None = None           # the smallest cap it completes under, on the modelled device
    largest_failing_cap: int | None = None
    smallest_device: int | None = None        # the smallest device (no cap) it completes on
    largest_failing_device: int | None = None
    fits: bool | None = None                  # with --fit: whether it completes within that much memory
    fit_peak_reserved: int | None = None      # ... and its peak reserved and driver time there
    fit_driver_seconds: float | None = None
    front: bool = False                       # no other setting is at least as good on all three and better on one
    seconds: float = 0.0                      # wall time spent replaying it


def _replay(trace: Trace, policy: policies.Policy, device_memory: int, event_lag: int, cap: int = 0) -> dict:
    """One replay's result, with the allocator's statistics (no timeline, no second pass: what tune needs)."""
    alloc, out = run_requests(trace, policy, device_memory, samples=1, event_lag=event_lag, cap=cap)
    out["stats"], out["exportable"] = alloc.stats(), alloc.driver.exportable    # priced as replay prices them
    return out


def _smallest(fits: Callable[[int], bool], lo: int, hi: int, lo_fails: bool, hi_fits: bool, floor: int,
              ceiling: int) -> tuple[int, int]:
    """(the smallest size that fits, the largest that fails) by geometric bisection to RESOLUTION."""
    result, _ = drive(bisect_fraction(lo, hi, RESOLUTION, lo_fails=lo_fails, hi_fits=hi_fits, floor=floor,
                                      ceiling=ceiling), lambda x: fits(math.ceil(x)))
    return math.ceil(result.smallest_fit), math.ceil(result.largest_fail)


def evaluate(trace: Trace, setting: Setting, device_memory: int, fit: int | None = None,
             event_lag: int = 0) -> Outcome:
    """Replay `trace` through `setting` uncapped, bisect its smallest cap and device, and check `fit` (bytes; a cap
    below `device_memory`, else that device uncapped)."""
    started = time.perf_counter()
    choice = policies.resolve(setting.spec)
    policy = choice.policy
    full = _replay(trace, policy, device_memory, event_lag)
    stats = full["stats"]
    out = Outcome(policy=choice.label, spec=setting.spec, base=setting.policy, knobs=dict(setting.knobs),
                  failed=full["ooms"] > 0, peak_reserved=full["peak_reserved"], peak_allocated=full["peak_allocated"],
                  driver_seconds=driver_seconds(stats, exportable=full["exportable"]),
                  step_time_lost=step_time_lost(stats, exportable=full["exportable"]),
                  stitches=stats["stitches"], driver_calls=sum(stats["calls"].values()))
    if not out.failed:
        under_cap = lambda cap: _replay(trace, policy, device_memory, event_lag, cap=cap)["ooms"] == 0
        # Bounds that need no probe: its own uncapped peak reserved fits, a byte under its peak allocated cannot.
        out.smallest_cap, out.largest_failing_cap = _smallest(
            under_cap, out.peak_allocated - 1, out.peak_reserved, True, True, out.peak_allocated - 1,
            out.peak_reserved)
        # A device that size usually behaves as the cap does: start from the cap's bracket, probed, not assumed.
        on_device = lambda size: _replay(trace, policy, size, event_lag)["ooms"] == 0
        out.smallest_device, out.largest_failing_device = _smallest(
            on_device, max(out.largest_failing_cap, out.peak_allocated - 1), out.smallest_cap, False, False,
            out.peak_allocated - 1, device_memory)
    if fit is not None:
        at_fit = full if fit >= device_memory else _replay(trace, policy, device_memory, event_lag, cap=fit)
        out.fits = at_fit["ooms"] == 0
        if out.fits:
            out.fit_peak_reserved = at_fit["peak_reserved"]
            out.fit_driver_seconds = driver_seconds(at_fit["stats"], exportable=at_fit["exportable"])
            if fit < device_memory and out.smallest_cap is not None and fit < out.smallest_cap:
                # The bisection stops within RESOLUTION above the smallest cap; the fit itself is a cap it completes
                # under, so the smallest cap is at most that (never 18.408 GiB beside "fits 18.4 GiB: yes").
                out.smallest_cap = fit
                out.largest_failing_cap = min(out.largest_failing_cap, fit - 1)
    out.seconds = time.perf_counter() - started
    return out


# ------------------------------------------------------------------ parallel replay

_worker: dict = {}


def _start_worker(trace: Trace, device_memory: int, fit: int | None, event_lag: int) -> None:
    _worker.update(trace=trace, device_memory=device_memory, fit=fit, event_lag=event_lag)


def _evaluate_in_worker(setting: Setting) -> Outcome:
    w = _worker
    return evaluate(w["trace"], setting, w["device_memory"], w["fit"], w["event_lag"])


@dataclass
class TuneResult:
    """Every setting's outcome, and the one recommended (None where none fits)."""

    trace: str
    device_memory: int
    fit: int | None
    within: float
    outcomes: list[Outcome]
    recommended: Outcome | None
    reason: str
    jobs: int
    seconds: float
    event_lag: int = 0
    limit: int = field(default=0)     # the limit the recommended lines set (the fit, where it is a cap)
    trace_seconds: float | None = None    # the time the trace spans, where it records it

    def record(self) -> dict:
        """The JSON `gmlake tune --json` prints (sizes in bytes, times in seconds)."""
        best = self.recommended
        return {
            "trace": self.trace, "device_memory": self.device_memory, "fit": self.fit, "within": self.within,
            "event_lag": self.event_lag, "jobs": self.jobs, "seconds": round(self.seconds, 3),
            "trace_seconds": self.trace_seconds,
            "settings": [asdict(o) for o in self.outcomes],
            "recommended": None if best is None else {
                "policy": best.policy, "spec": best.spec, "reason": self.reason, "limit": self.limit,
                "env": env_line(best, self.limit), "enable": enable_call(best, self.limit)},
            "reason": self.reason,
        }


def tune(trace: Trace, fit: int | None = None, device_memory: int | None = None, event_lag: int = 0,
         within: float = WITHIN, jobs: int | None = None, settings: Iterable[Setting] | None = None,
         on_done: Callable[[Outcome], None] | None = None) -> TuneResult:
    """Replay every setting (default: `search_space(trace)`) on `jobs` processes (default: every core), mark the
    front and recommend one (`recommend`). `fit` in bytes: the memory the job must complete in (a cap on a device of
    `device_memory`, default the trace's); `on_done` is called with each outcome as it arrives."""
    device = modelled_device_memory(trace, device_memory)
    if fit is not None and not 0 < fit <= device:
        raise ValueError(f"--fit {format_size(fit)} is more than the modelled device's {format_size(device)}; give "
                         f"--device-memory to model a larger one")
    if not within >= 1:
        raise ValueError(f"--within must be at least 1, got {within!r}")
    chosen = list(settings) if settings is not None else search_space(trace)
    jobs = max(1, min(jobs or default_jobs(), len(chosen)))
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    if jobs == 1:
        for setting in chosen:
            outcomes.append(evaluate(trace, setting, device, fit, event_lag))
            if on_done:
                on_done(outcomes[-1])
    else:
        outcomes = map_in_processes(_evaluate_in_worker, chosen, jobs, _start_worker, (trace, device, fit, event_lag),
                                    on_done)
    mark_front(outcomes)
    trace_seconds = trace.meta.get("seconds")
    best, reason = recommend(outcomes, fit, within, trace_seconds)
    limit = fit if fit is not None and fit < device else 0
    return TuneResult(trace=trace.name, device_memory=device, fit=fit, within=within, outcomes=outcomes,
                      recommended=best, reason=reason, jobs=jobs, seconds=time.perf_counter() - started,
                      event_lag=event_lag, limit=limit, trace_seconds=trace_seconds)


def _objectives(o: Outcome) -> tuple[int, int, float]:
    return o.peak_reserved, o.smallest_cap or 0, o.driver_seconds


def mark_front(outcomes: list[Outcome]) -> None:
    """Mark the settings no other beats: none is at least as good in peak reserved, smallest cap and driver time,
    and better in one. Settings that ran out of memory uncapped are never on it."""
    ok = [o for o in outcomes if not o.failed]
    for o in outcomes:
        mine = _objectives(o)
        o.front = not o.failed and not any(
            all(a <= b for a, b in zip(_objectives(other), mine)) and _objectives(other) != mine for other in ok)


def worth_its_memory(o: Outcome, default: Outcome | None, trace_seconds: float | None,
                     fit: int | None = None) -> bool:
    """Whether `o` may be recommended against the default policy's outcome (Note [What tune may trade for
    memory]): it reserves no more than the default, or it saves driver time of at least VISIBLE of the time the
    trace spans. With `fit`: memory and driver time under that fit, where the default fits."""
    if default is None or o is default:
        return True
    if fit is not None:
        if not default.fits:
            return True
        memory, default_memory = o.fit_peak_reserved, default.fit_peak_reserved
        saved = default.fit_driver_seconds - o.fit_driver_seconds
    else:
        memory, default_memory = o.peak_reserved, default.peak_reserved
        saved = default.driver_seconds - o.driver_seconds
    if memory <= default_memory:
        return True
    return bool(trace_seconds) and saved >= VISIBLE * trace_seconds


def _margin_words(trace_seconds: float | None) -> str:
    if trace_seconds:
        return (f"; more memory than {DEFAULT_POLICY} only for driver time saved of {VISIBLE:.0%} of the "
                f"{trace_seconds:.1f} s the trace spans ({VISIBLE:.0%} of each step)")
    return (f"; none that reserves more than {DEFAULT_POLICY}: the trace records no run time to weigh the driver "
            f"time saved against")


def recommend(outcomes: list[Outcome], fit: int | None, within: float = WITHIN,
              trace_seconds: float | None = None) -> tuple[Outcome | None, str]:
    """The setting to use, and why in words. Only settings worth their memory against the default policy are
    candidates (`worth_its_memory`). With `fit`: the fastest (least priced driver time within that memory) of those
    that complete in it, ties to the least peak reserved there. Without: the least peak reserved among the settings
    whose driver time is within `within` times the fastest's or TIE_SECONDS of it, ties to the fastest. Settings
    that ran out of memory uncapped are never chosen."""
    ok = [o for o in outcomes if not o.failed]
    default = next((o for o in ok if o.base == DEFAULT_POLICY and not o.knobs), None)
    if fit is not None:
        fitting = [o for o in ok if o.fits]
        if not fitting:
            smallest = min(ok, key=lambda o: o.smallest_cap or math.inf, default=None)
            where = (f"; the smallest is {smallest.policy}'s, {smallest.smallest_cap / GiB:.3f} GiB"
                     if smallest and smallest.smallest_cap else "")
            return None, f"no setting completes within {format_size(fit)}{where}"
        fitting = [o for o in fitting if worth_its_memory(o, default, trace_seconds, fit)]
        best = min(fitting, key=lambda o: (o.fit_driver_seconds, o.fit_peak_reserved, len(o.knobs)))
        margin = _margin_words(trace_seconds) if default is not None and default.fits else ""
        return best, (f"the least driver time ({best.fit_driver_seconds:.3f} s) of the {_settings(len(fitting))} "
                      f"that complete within {format_size(fit)}{margin}")
    if not ok:
        return None, "every setting runs out of memory on the modelled device"
    ok = [o for o in ok if worth_its_memory(o, default, trace_seconds)]
    fastest = min(o.driver_seconds for o in ok)
    bound = max(within * fastest, fastest + TIE_SECONDS)
    near = [o for o in ok if o.driver_seconds <= bound]
    best = min(near, key=lambda o: (o.peak_reserved, o.driver_seconds, o.smallest_cap or 0, len(o.knobs)))
    margin = _margin_words(trace_seconds) if default is not None else ""
    return best, (f"the least peak reserved of the {_settings(len(near))} within {within:g}x or "
                  f"{TIE_SECONDS * 1000:g} ms of the fastest driver time ({fastest:.3f} s){margin}")


def _settings(n: int) -> str:
    return f"{n} settings" if n != 1 else "1 setting"


# ------------------------------------------------------------------ how to use it


def env_line(o: Outcome, limit: int = 0) -> str:
    """The environment that installs `o` in any PyTorch program (gmlake/torch/_autoload.py, gmlake.torch.options_from_env)."""
    parts = ["GMLAKE=1", f"GMLAKE_POLICY={o.base}"]
    if o.knobs:
        parts.append("GMLAKE_KNOBS=" + ",".join(f"{k}={knob_text(v)}" for k, v in o.knobs.items()))
    if limit:
        parts.append(f"GMLAKE_LIMIT={knob_text(limit)}")
    return " ".join(parts)


def _python_value(value: object) -> str:
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int) and value >= MiB and value % MiB == 0:
        return f"{value // MiB} << 20"
    return repr(value)


def enable_call(o: Outcome, limit: int = 0) -> str:
    """The gmlake.torch.enable() call that installs `o` from Python."""
    args = [repr(o.base), *(f"{k}={_python_value(v)}" for k, v in o.knobs.items())]
    if limit:
        args.append(f"limit={_python_value(limit)}")
    return f"gmlake.torch.enable({', '.join(args)})"


# ------------------------------------------------------------------ output


def table(result: TuneResult, every: bool = False, wide: bool = False):
    """The front (or `every` setting) as a rich Table, GiB and seconds. By default the columns that fit 80 columns
    (headers on two lines, long settings folded); `wide` adds the smallest device and the stitches."""
    # rich loads only when output is drawn, so importing this module stays light
    from rich.table import Table
    from rich.text import Text

    shown, seen = [], set()
    for o in sorted(result.outcomes, key=lambda o: (o is not result.recommended, len(o.knobs))):
        same = (o.failed, o.peak_reserved, o.smallest_cap, o.smallest_device, o.driver_seconds, o.stitches, o.fits,
                o.fit_driver_seconds)
        if every or ((o.front or not o.knobs or o is result.recommended) and (same not in seen or not o.knobs)):
            shown.append(o)
            seen.add(same)
    hidden = len(result.outcomes) - len(shown)
    fit_words = f", within {format_size(result.fit)}" if result.fit is not None else ""
    caption = (f"{hidden} more settings are beaten on all three or do the same as one shown (--all shows them); "
               if hidden else "") \
        + "driver time priced on an H200; * on the front, > recommended" \
        + ("" if wide else "; --wide: the smallest device, stitches" + (", driver s uncapped" if result.fit else ""))
    t = Table(title=Text(f"{result.trace}: {len(result.outcomes)} settings replayed on a "
                         f"{format_size(result.device_memory)} device{fit_words} (GiB, s)"), caption=caption)
    t.add_column("", no_wrap=True)
    t.add_column("setting", overflow="fold")
    # With --fit, the driver time under it stands in for the uncapped one (--wide shows both).
    uncapped_time = wide or result.fit is None
    columns = ["peak\nreserved", "smallest\ncap", *(["smallest\ndevice"] if wide else []),
               *(["driver s"] if uncapped_time else []), *(["stitches"] if wide else [])]
    if result.fit is not None:
        columns += [f"fits\n{format_size(result.fit)}", "driver s\nthere"]
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True)

    def gib(n: int | None) -> str:
        return "-" if n is None else f"{n / GiB:.3f}"

    order = sorted(shown, key=lambda o: (o.failed, o.peak_reserved))
    for o in order:
        mark = (">" if o is result.recommended else " ") + ("*" if o.front else " ")
        row = [mark, Name(o.policy), "OOM" if o.failed else gib(o.peak_reserved), gib(o.smallest_cap),
               *([gib(o.smallest_device)] if wide else []), *([f"{o.driver_seconds:.4f}"] if uncapped_time else []),
               *([str(o.stitches)] if wide else [])]
        if result.fit is not None:
            there = shown_driver_seconds(result, o)
            row += ["yes" if o.fits else "no", "-" if there is None else f"{there:.4f}"]
        t.add_row(*row, style="bold" if o is result.recommended else None)
    return t


def recommendation_lines(result: TuneResult, width: int | None = None) -> list[str]:
    """The recommendation in words, what replay predicts for it, then the two ways to use it. With `width`, every
    line fits it: words wrap, the shell line continues with a backslash and the Python call breaks between its
    arguments, so both still paste as they are."""
    best = result.recommended
    if best is None:
        return _wrapped([f"no recommendation: {result.reason}"], width)
    if result.limit:
        predicted = (f"peak reserved {best.fit_peak_reserved / GiB:.3f} GiB under the limit "
                     f"({best.peak_reserved / GiB:.3f} GiB without), driver time {best.fit_driver_seconds:.3f} s")
    else:
        predicted = f"peak reserved {best.peak_reserved / GiB:.3f} GiB, driver time {best.driver_seconds:.3f} s"
    words = [f"recommended: {best.policy}, {result.reason}",
             f"  predicted: {predicted}; completes under a cap of {(best.smallest_cap or 0) / GiB:.3f} GiB or more"]
    shell = f"  {env_line(best, result.limit)} python train.py ..."
    python = f"  import gmlake.torch; {enable_call(best, result.limit)}   # before any CUDA work"
    tail = ([f"  (the limit keeps the allocator within {format_size(result.fit)}, as the replay did)"]
            if result.limit else [])
    if width is None:
        return [*words, shell, python, *tail]
    return [*_wrapped(words, width), *_shell_lines(shell, width), *_python_lines(best, result.limit, width),
            *_wrapped(tail, width)]


def _wrapped(lines: list[str], width: int | None) -> list[str]:
    if width is None:
        return lines
    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()))
        out += textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent + "  ",
                             break_long_words=False, break_on_hyphens=False) or [""]
    return out


def _shell_lines(line: str, width: int) -> list[str]:
    """A shell command over lines of `width`, each but the last ending in a backslash."""
    out, current = [], ""
    for word in line.split():
        candidate = f"{current} {word}" if current else f"  {word}"
        if current and len(candidate) + 2 > width:
            out.append(current + " \\")
            current = f"    {word}"
        else:
            current = candidate
    return [*out, current]


def _python_lines(o: Outcome, limit: int, width: int) -> list[str]:
    """The enable() call, on one line where it fits, else one argument a line."""
    call = enable_call(o, limit)
    one = f"  import gmlake.torch; {call}   # before any CUDA work"
    if len(one) <= width:
        return [one]
    head, args = call.split("(", 1)
    lines = ["  import gmlake.torch   # then, before any CUDA work:", f"  {head}("]
    lines += [f"      {arg.strip()}," for arg in args.removesuffix(")").split(", ")]
    return [*lines, "  )"]


def shown_driver_seconds(result: TuneResult, o: Outcome) -> float | None:
    """The driver time the table's last column and the plot show for `o`: with --fit, under that fit (None where it
    does not fit), else uncapped."""
    return o.driver_seconds if result.fit is None else o.fit_driver_seconds


def plot(result: TuneResult, out: Path) -> Path:
    """Driver time (as the table shows it: under --fit where given) against peak reserved and against the smallest
    cap, one point per setting, the front joined and the recommendation ringed."""
    plt = pyplot()
    ok = [o for o in result.outcomes if not o.failed and shown_driver_seconds(result, o) is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    for ax, key, title in ((axes[0], "peak_reserved", "peak reserved (GiB)"),
                           (axes[1], "smallest_cap", "smallest cap it completes under (GiB)")):
        labelled = set()
        for o in sorted(ok, key=lambda o: len(o.knobs)):
            x, y = getattr(o, key) / GiB, shown_driver_seconds(result, o)
            color = BUILTIN_COLORS.get(o.base, "tab:gray") if not o.knobs else "tab:gray"
            ax.scatter([x], [y], s=40 if o.front else 18, color=color if o.front or not o.knobs else "0.7",
                       zorder=3)
            if (not o.knobs or o.front) and (x, y) not in labelled:
                labelled.add((x, y))
                ax.annotate(o.policy, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        front = sorted((getattr(o, key) / GiB, shown_driver_seconds(result, o)) for o in ok if o.front)
        if front:
            ax.plot(*zip(*front), color="tab:green", lw=0.8, alpha=0.6, zorder=2)
        if result.recommended is not None and result.recommended in ok:
            best = result.recommended
            ax.scatter([getattr(best, key) / GiB], [shown_driver_seconds(result, best)], s=160, facecolors="none",
                       edgecolors="black", zorder=4, label=f"recommended: {best.policy}")
            ax.legend(fontsize=8, loc="upper right")
        if result.fit is not None and key == "smallest_cap":
            ax.axvline(result.fit / GiB, color="tab:red", ls="--", lw=0.8, label=f"--fit {format_size(result.fit)}")
            ax.legend(fontsize=8, loc="upper right")
        ax.set_xlabel(title)
        ax.set_ylabel("driver time, priced on an H200 (s)" if result.fit is None else
                      f"driver time within {format_size(result.fit)}, priced on an H200 (s)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.trace}: gmlake tune, {len(result.outcomes)} settings")
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out


__all__ = ["TIE_SECONDS", "WITHIN", "Outcome", "Setting", "TuneResult", "enable_call", "env_line", "evaluate", "mark_front",
           "plot", "recommend", "recommendation_lines", "search_space", "table", "tune"]
