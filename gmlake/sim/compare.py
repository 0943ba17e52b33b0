"""Replay traces under several policies side by side: a table, and a plot of memory over time."""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from gmlake.policies import Policy, PolicyChoice, choice_of
from gmlake.sim.cap import limits
from gmlake.sim.plots import policy_colors, pyplot
from gmlake.sim.replay import ReplayResult, driver_costs, replay
from gmlake.sim.trace import Trace
from gmlake.sim.workers import default_jobs, map_in_processes

GiB = float(1 << 30)

def run(traces: list[Trace], policies: list[Policy | str | PolicyChoice], progress: bool = True,
        device_memory: int | None = None, event_lag: int = 0, cap: int = 0) -> list[ReplayResult]:
    """Every trace under every policy (specs, Policy objects or PolicyChoices), with a progress bar on the
    terminal. `event_lag` and `cap` (bytes, 0: none): see gmlake.sim.replay.replay."""
    # rich loads only when output is drawn, so importing this module stays light
    from rich.progress import Progress
    from rich.text import Text

    chosen = [choice_of(p) for p in policies]
    results = []
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("replaying", total=len(traces) * len(chosen))
        for trace in traces:
            for choice in chosen:
                bar.update(task, description=Text(f"{trace.name} / {choice.label}"))
                results.append(replay(trace, choice, device_memory=device_memory, event_lag=event_lag,
                                      cap=cap))
                bar.advance(task)
    return results


# ------------------------------------------------------------------ the smallest device and cap (--smallest-cap)

_limit_worker: dict = {}


def _start_limit_worker(traces: list[Trace], chosen: list[PolicyChoice], event_lag: int) -> None:
    _limit_worker.update(traces=traces, chosen=chosen, event_lag=event_lag)


def _limits_of(traces: list[Trace], chosen: list[PolicyChoice], event_lag: int, pair: tuple[int, int]) -> dict:
    """gmlake.sim.cap.limits of one (trace, policy) pair by index, or {"error": why} where the policy runs out of
    memory even uncapped (its replay in the table says so already)."""

    trace, choice = traces[pair[0]], chosen[pair[1]]
    try:
        return limits(trace, choice, event_lag=event_lag)
    except ValueError as exc:
        return {"trace": trace.name, "policy": choice.label, "error": str(exc)}


def _limits_in_worker(pair: tuple[int, int]) -> dict:
    w = _limit_worker
    return _limits_of(w["traces"], w["chosen"], w["event_lag"], pair)


def smallest_limits(traces: list[Trace], policies: list[Policy | str | PolicyChoice], event_lag: int = 0,
                    jobs: int | None = None, progress: bool = True) -> list[dict]:
    """gmlake.sim.cap.limits (the smallest device and the smallest cap, by replay) of every trace under every policy, in
    `run`'s order (trace by trace, the policies in turn), on `jobs` processes (default: every core, as `gmlake tune`),
    with a progress bar on stderr. A pair whose policy runs out of memory even uncapped is {"error": why}."""
    # rich loads only when output is drawn, so importing this module stays light
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


    chosen = [choice_of(p) for p in policies]
    pairs = [(t, c) for t in range(len(traces)) for c in range(len(chosen))]
    jobs = max(1, min(jobs or default_jobs(), len(pairs)))
    bar = Progress(TextColumn("smallest device and cap"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=Console(stderr=True), disable=not progress,
                   transient=True, auto_refresh=False)   # no thread of its own to copy into the forked workers
    if jobs == 1:
        out = []
        with bar:
            task = bar.add_task("", total=len(pairs))
            for pair in pairs:
                out.append(_limits_of(traces, chosen, event_lag, pair))
                bar.update(task, advance=1, description=f"{out[-1]['trace']} / {out[-1]['policy']}", refresh=True)
        return out
    with bar:
        task = bar.add_task("", total=len(pairs))
        return map_in_processes(
            _limits_in_worker, pairs, jobs, _start_limit_worker, (traces, chosen, event_lag),
            lambda row: bar.update(task, advance=1, description=f"{row['trace']} / {row['policy']}", refresh=True))


# The columns of the smallest device and cap, shared by `gmlake replay --smallest-cap` and `gmlake compare
# --smallest-cap`: (header, key of gmlake.sim.cap.limits' row, as GiB or as a multiple of the peak allocated).
LIMIT_COLUMNS = {"smallest device": ("smallest_device_memory", "GiB"),
                 "device xP": ("smallest_device_memory_x_peak", "x"),
                 "smallest cap": ("smallest_cap", "GiB"), "cap xP": ("smallest_cap_x_peak", "x")}


LIMIT_WORDS = ("device, cap: the smallest device (no cap) and the smallest memory cap "
               "(set_per_process_memory_fraction) on which each policy serves every request, by replay to 0.2 %, in GiB and over its peak allocated "
               "(xP)")


def limit_cells(row: dict | None) -> dict:
    """The cells of LIMIT_COLUMNS for one row of gmlake.sim.cap.limits ("-" for none, or a row that has an error)."""
    if not row or "error" in row:
        return dict.fromkeys(LIMIT_COLUMNS, "-")
    return {col: f"{row[key] / GiB:.3f}" if unit == "GiB" else f"{row[key]:.4f}"
            for col, (key, unit) in LIMIT_COLUMNS.items()}


def cap_words(caps: Iterable[int]) -> str:
    """The memory caps replayed, for a title: ' under a 1.900 GiB memory cap', '' where there was none (0), and
    each cap (none included) where replays differ."""
    distinct = sorted(set(caps))
    if not any(distinct):
        return ""
    if len(distinct) == 1:
        return f" under a {distinct[0] / GiB:.3f} GiB memory cap"
    return " under memory caps of " + ", ".join(f"{c / GiB:.3f}" if c else "none" for c in distinct) + " GiB"


_BREAKS = re.compile(r"(?<=[-_.,/=+\[( ])")


class Name:
    """A name in a table cell (a trace's, a policy's; plain text, never rich markup): whole where the column holds
    it, else broken after a separator (- _ . , / = + [ ( or a space), never inside a word; only a piece wider than
    the column is folded."""

    def __init__(self, text: str, style: str | None = None):
        self.text, self.style = text, style

    def __str__(self) -> str:
        return self.text

    @property
    def plain(self) -> str:         # as rich's Text has it
        return self.text

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        longest = max(map(len, _BREAKS.split(self.text)), default=0)
        return Measurement(min(longest, options.max_width), min(len(self.text), options.max_width))

    def __rich_console__(self, console, options):
        from rich.text import Text

        lines = [""]
        for piece in _BREAKS.split(self.text):
            if lines[-1].strip() and len(lines[-1]) + len(piece) > options.max_width:
                lines.append("")
            lines[-1] += piece
        yield Text("\n".join(lines), style=self.style or "", overflow="fold")


# The table's columns: (header, the cell of a result). DEFAULT_COLUMNS fit an 80-column terminal; `--wide` shows
# them all. By default the trace and policy share a column, GROUPED: each trace's name on a row of its own, with the
# captured run's own peak reserved in the reserved column, its policies indented under it; long names fold onto more
# lines rather than widen the table. A failed replay brings a column of OOMs (in place of allocated), the smallest
# device and cap (`--smallest-cap`) two columns over the peak allocated (in place of allocated and stitches).
GROUPED = "trace / policy"
NAMES = ("trace", "policy", GROUPED)
DEFAULT_COLUMNS = (GROUPED, "reserved", "allocated", "alloc/res", "stitches", "driver s")


def _cells(r: ReplayResult, meta: dict) -> dict:
    from rich.text import Text  # names come from untrusted traces: plain text, never rich markup

    s = r.summary()
    captured = meta.get("max_memory_reserved")
    return {
        "trace": Name(r.trace),
        "captured": f"{captured / GiB:.3f}" if captured else "-",
        "real reserved (under)": Text(f"{captured / GiB:.3f} ({meta.get('allocator', '?')})" if captured else "-"),
        "policy": Name(r.policy),
        # a library's failure (its memory did not fit beside the allocator's) counts as the run's out-of-memory
        "OOMs": f"[red]{r.ooms + r.library_failures}[/red]" if r.failed else "0",
        "allocated": f"{r.peak_allocated / GiB:.3f}",
        "reserved": f"{r.peak_reserved / GiB:.3f}",
        "alloc/res": "[red]failed[/red]" if r.failed else f"{r.utilization:.4f}",
        "req/res": "-" if r.failed else f"{r.requested_utilization:.4f}",
        "int frag MiB": f"{r.internal_fragmentation / (1 << 20):.1f}",
        "ext@peak": f"{r.external_fragmentation / GiB:.3f}",
        "ext@growth": f"{r.external_fragmentation_at_growth / GiB:.3f}",
        "stitches": str(s["stitches"]),
        "evictions": str(s["sblock_evictions"]),
        "re-backed": str(s["rebacked_chunks"]),
        "driver calls": str(s["driver_calls"]),
        "driver s": f"{r.driver_seconds:.3f}",
        "time lost s": f"{r.step_time_lost:.3f}",
        "Mevents/s": f"{r.events / r.seconds / 1e6:.1f}" if r.seconds else "-",
    }


WIDE_COLUMNS = ("trace", "real reserved (under)", "policy", "OOMs", "allocated", "reserved", "alloc/res", "req/res",
                "int frag MiB", "ext@peak", "ext@growth", "stitches", "evictions", "re-backed", "driver calls",
                "driver s", "time lost s", "Mevents/s")


def table(results: list[ReplayResult], traces: list[Trace], wide: bool = False, limits: list[dict] | None = None):
    """A rich Table of the results, with each trace's real peak where the trace records it, and the memory cap in
    the title where replays had one. A failed replay (some requests out of memory) shows its out-of-memory count in
    red, no utilization, and a caption says so. By default the columns that fit a 120-column terminal (peaks in GiB,
    utilization, stitches, priced driver time); `wide`: every column, fragmentation and the stall model included.
    `limits` (`smallest_limits`, one row per result, in order): the smallest device and cap over the peak allocated
    beside them (`wide`: in GiB too)."""
    # rich loads only when output is drawn, so importing this module stays light
    from rich.table import Table
    from rich.text import Text

    real = {t.name: t.meta for t in traces}
    failed = [r for r in results if r.failed]
    columns = list(WIDE_COLUMNS if wide else DEFAULT_COLUMNS)
    grouped = not wide
    if limits is not None:
        if wide:
            columns[columns.index("alloc/res") + 1:columns.index("alloc/res") + 1] = list(LIMIT_COLUMNS)
        else:
            columns[columns.index("allocated")] = "device xP"
            columns[columns.index("stitches")] = "cap xP"
    if failed and "OOMs" not in columns:
        if "allocated" in columns:
            columns.remove("allocated")
        columns.insert(1, "OOMs")
    caption = None
    if failed:
        # Under a cap the cap binds first, unless it is at or above the modelled device's memory.
        where = ("memory under the memory cap on the modelled device" if any(r.cap for r in failed)
                 else "the modelled device's memory")
        libraries = sum(r.library_failures for r in failed)
        caption = (f"[red]FAILED: {len(failed)} of {len(results)} replays ran out of {where} "
                   f"(requests OOM"
                   + (f", {libraries} of them the libraries' memory growing where the device had no room left"
                      if libraries else "")
                   + "); their peaks cover only the requests served[/red]")
    elif wide:
        caption = ("alloc/res: peak allocated / peak reserved; req/res: peak requested / peak reserved; int frag: "
                   "allocated - requested (MiB) and ext@peak: reserved - allocated, when reserved first peaked; "
                   "ext@growth: reserved - allocated after the request that brought reserved within 1 % of its peak "
                   "(the moment `gmlake explain` explains); evictions: stitched blocks unmapped to reuse their "
                   "memory; re-backed: partly used pages whose live blocks were moved to free the rest; time lost: "
                   f"driver time x the stall factor {driver_costs()['stall_factor']}, a rough estimate (the loss "
                   "per driver second ranged 0.85-2.5x over six GPU runs)"
                   + (f"; {LIMIT_WORDS}" if limits is not None else ""))
    elif limits is not None:
        caption = f"alloc/res: peak allocated / peak reserved (utilization); {LIMIT_WORDS}; --wide: every column, " \
                  "--json: every figure"
    else:
        caption = ("a trace's row: its captured run's own peak reserved; alloc/res: peak allocated / peak reserved "
                   "(utilization); --wide: fragmentation, evictions, re-backing, driver calls, time lost; --json: "
                   "every figure")
    t = Table(title=f"replay on the sim driver{cap_words(r.cap for r in results)} (GiB; driver time at H200 "
                    "micro-benchmark prices, which calls made inside training took a median "
                    f"{driver_costs()['in_training_factor']}x of)", caption=caption)
    widest = {"trace": max((len(r.trace) for r in results), default=5),
              "policy": max((len(r.policy) for r in results), default=6)}
    for col in columns:
        t.add_column(col, justify="left" if col in NAMES else "right", overflow="fold",
                     min_width=min(widest.get(col, 0), 28) or None, no_wrap=col not in NAMES)
    for i, r in enumerate(results):
        cells = {**_cells(r, real.get(r.trace, {})), **limit_cells(limits[i] if limits is not None else None)}
        if grouped:
            if i == 0 or results[i - 1].trace != r.trace:       # a trace's name, then its policies' rows
                if i:
                    t.add_section()
                row = dict.fromkeys(columns, "")
                row[GROUPED] = Name(r.trace, style="bold")
                row["reserved"] = Text(cells["captured"], style="dim")
                t.add_row(*(row[col] for col in columns))
            cells[GROUPED] = Name("  " + r.policy)
        t.add_row(*(cells[col] for col in columns))
    return t


def plot(results: list[ReplayResult], traces: list[Trace], out: Path, format: str | None = None) -> Path:
    """One panel per trace: reserved (solid) and allocated (dotted) memory over the trace, per policy, with the
    captured run's own reserved memory where the trace records it. `format`: the image format (default: from the
    file name)."""
    plt = pyplot()
    names = [t.name for t in traces]
    cols = min(2, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    colors = policy_colors([r.policy for r in results])
    for ax, trace in zip(axes.flat, traces):
        requests_at = None
        for r in results:
            if r.trace != trace.name:
                continue
            tl = r.timeline
            color = colors[r.policy]
            label = r.policy.replace("$", r"\$")   # a label, not matplotlib mathtext
            ax.plot(tl["event"], tl["reserved"] / GiB, color=color, label=f"{label} reserved")
            ax.plot(tl["event"], tl["allocated"] / GiB, color=color, linestyle=":", linewidth=1)
            requests_at = tl["event"]
        curve = trace.real_reserved_curve()
        if curve is not None and requests_at is not None:
            # The real curve is indexed by all events; the replay's by request events. Map through the mask.

            req_index = np.flatnonzero(trace.events["action"] <= 1)
            ax.plot(np.arange(len(req_index)), curve[req_index] / GiB, color="black", linewidth=0.8,
                    linestyle="--", alpha=0.7, label=f"captured run ({trace.meta.get('allocator', '?')})")
        name = trace.name.replace("$", r"\$")   # an untrusted name, not matplotlib mathtext
        caps = cap_words(r.cap for r in results if r.trace == trace.name)
        ax.set_title(f"{name}{caps}: reserved (solid), allocated (dotted)", fontsize=10)
        ax.set_xlabel("request")
        ax.set_ylabel("GiB")
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, format=format)
    plt.close(fig)
    return out
