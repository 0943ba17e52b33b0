"""The commands that study traces on a CPU: replay, explain, compare, tune, traces, policies, convert. Their
dependencies (numpy, matplotlib: the `sim` extra) are imported when a command runs, so `gmlake run` needs none."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from gmlake import policies
from gmlake.cli.common import (
    EXIT_OK,
    EXIT_OUT_OF_MEMORY,
    UsageError,
    _console,
    _output_dir,
    _output_file,
    _policy_choices,
    _write_atomically,
)
from gmlake.policies.settings import KNOBS_VARIABLE, env_knobs
from gmlake.sim import MAX_DEVICE_MEMORY

if TYPE_CHECKING:
    from gmlake.sim.tune import TuneResult

# The commands below import gmlake.sim's modules (numpy, matplotlib: the optional sim extra) and rich's widgets inside
# their functions: `gmlake run` and `gmlake capture` need neither, and only a command that replays needs the extra.


def _load(specs: list[str], device: int | None):
    """Traces by path or by bundled name, each under a name of its own: results, tables and plots are keyed by a
    trace's name, so a second trace of the same name (two runs' `trace.gmtrace`, a rank's snapshot converted under
    rank 0's name) is shown as `NAME (2)`, with a note on stderr, instead of taking the first one's rows."""
    from gmlake.sim.replay import trace_path
    from gmlake.sim.trace import Trace, load

    traces, seen = [], {}
    for spec in specs:
        trace = load(trace_path(spec), device)
        seen[trace.name] = seen.get(trace.name, 0) + 1
        if seen[trace.name] > 1:
            renamed = f"{trace.name} ({seen[trace.name]})"
            print(f"gmlake: note: {spec} is named {trace.name!r} like an earlier trace; shown as {renamed!r}",
                  file=sys.stderr)
            trace = Trace(trace.events, {**trace.meta, "name": renamed})
        traces.append(trace)
    return traces


def _note_unsized(traces, device_memory: int | None) -> None:
    """One line on stderr for each trace that records no device size, where none was given: its replay models a
    device of MAX_DEVICE_MEMORY, on which nothing runs out (a policy that hoards looks only wasteful). Said after
    the replays, so that a command refusing its input still says one line."""
    if device_memory is not None:
        return
    for trace in traces:
        if not trace.meta.get("device_total"):
            print(f"gmlake: note: {trace.meta.get('name', 'trace')} records no device size, so it replays on a "
                  f"{MAX_DEVICE_MEMORY >> 40} TiB device; give --device-memory SIZE to model yours", file=sys.stderr)


def cmd_replay(args) -> int:
    """`gmlake replay`: one trace through each policy; a table, or JSON lines. Exit 3 if requests ran out."""
    from gmlake.sim.replay import replay

    chosen = _policy_choices(args.policy, args.set)
    if args.smallest_cap and (args.device_memory is not None or args.cap is not None):
        raise UsageError("--smallest-cap searches for the memory cap itself; drop "
                         + ("--device-memory" if args.device_memory is not None else "--cap"))
    (trace,) = _load([args.trace], args.device)
    if args.smallest_cap:
        return _smallest_caps(trace, chosen, args.json, args.event_lag, args.wide)
    results = [replay(trace, choice, device_memory=args.device_memory, event_lag=args.event_lag, cap=args.cap or 0,
                      progress=True)
               for choice in chosen]
    _note_unsized([trace], args.device_memory)
    if args.json:
        for r in results:
            print(json.dumps(r.summary()))
    else:
        from gmlake.sim.compare import table

        _console(wide=args.wide).print(table(results, [trace], wide=args.wide))
    return EXIT_OUT_OF_MEMORY if any(r.failed for r in results) else EXIT_OK


GiB = 1 << 30


def _smallest_caps(trace, chosen: list, as_json: bool, event_lag: int = 0, wide: bool = False) -> int:
    """`gmlake replay --smallest-cap`: per policy, the smallest memory cap the trace fits under and, beside it, the
    smallest device it fits on with no cap (gmlake.sim.cap.limits, on the machine's cores)."""
    from rich.table import Table
    from rich.text import Text

    from gmlake.sim.compare import limit_cells, smallest_limits

    rows = smallest_limits([trace], chosen, event_lag=event_lag, progress=sys.stderr.isatty())
    for row in rows:
        if "error" in row:
            raise UsageError(f"{row['error']}; give a larger --device-memory to replay it")
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return EXIT_OK
    t = Table(title=f"{trace.name}: the smallest memory cap and the smallest device (no cap) per policy "
                    f"(GiB, and over the peak allocated: xP; by replay, to 0.2 %)",
              caption=None if wide else "--wide: the uncapped peak reserved and the replays each search took")
    # Headers on two lines, so that the default columns fit 80 columns; --wide adds two more.
    columns = ("policy", "peak allocated", "smallest cap", "cap xP", "smallest device", "device xP",
               *(("uncapped reserved", "replays") if wide else ()))
    for col in columns:
        t.add_column(col.replace(" ", "\n"), justify="left" if col == "policy" else "right",
                     overflow="fold", no_wrap=col != "policy")
    for r in rows:
        cells = {**limit_cells(r), "policy": Text(r["policy"]), "peak allocated": f"{r['peak_allocated'] / GiB:.3f}",
                 "uncapped reserved": f"{r['uncapped_peak_reserved'] / GiB:.3f}", "replays": str(r["replays"])}
        t.add_row(*(cells[col] for col in columns))
    _console(wide=wide).print(t)
    return EXIT_OK


def cmd_explain(args) -> int:
    """`gmlake explain`: where each policy's reserved bytes are at its peak; a table, or JSON lines."""
    from rich.table import Table
    from rich.text import Text

    from gmlake.sim.compare import cap_words
    from gmlake.sim.explain import explain

    chosen = _policy_choices(args.policy, args.set)
    (trace,) = _load([args.trace], args.device)
    found = [explain(trace, policy, device_memory=args.device_memory, cap=args.cap or 0, event_lag=args.event_lag)
             for policy in chosen]
    _note_unsized([trace], args.device_memory)
    status = EXIT_OUT_OF_MEMORY if any(b.ooms for b in found) else EXIT_OK
    if args.json:
        for b in found:
            print(json.dumps({**asdict(b), "why": b.why, "words": b.words, "plan_words": b.plan_words}))
        return status
    console = _console()
    for b in found:                               # why, in words, before the account
        console.print(Text(f"{b.policy}: {b.words}"))
    caption = None
    if status:
        where = " under the memory cap" if args.cap else ""
        caption = "[red]FAILED: " + "; ".join(f"{b.policy}: {b.ooms} requests out of memory{where}" for b in found
                                              if b.ooms) + " (the peak covers the requests served)[/red]"
    table = Table(title=Text(f"{trace.name}: reserved memory at each policy's peak growth"
                             f"{cap_words([args.cap or 0])} (GiB, % of reserved)"), caption=caption)
    table.add_column("")
    for b in found:
        table.add_column(Text(b.policy), justify="right")
    table.add_row("request explained", *(f"#{b.request_index}, {b.request_size / 2**20:.2f} MiB" for b in found))
    table.add_row("it grew reserved by", *(f"{b.growth / 2**30:.3f}" for b in found))
    table.add_row("later growth", *(f"{b.later_growth / 2**30:.3f}" for b in found))
    table.add_row("peak reserved (request)", *(f"{b.peak_reserved / 2**30:.3f} (#{b.peak_request_index})"
                                                for b in found))
    table.add_row("reserved", *(f"{b.reserved / 2**30:.3f}" for b in found), end_section=True)
    labels = [label for label, _ in found[0].rows()]
    for i, label in enumerate(labels):
        table.add_row(label, *(f"{b.rows()[i][1] / 2**30:.3f}  {100 * b.rows()[i][1] / b.reserved:5.1f}%"
                               for b in found), end_section=i == len(labels) - 1)

    def blocks(count: int, size: int) -> str:
        return f"{size / 2**30:.3f} in {count} block{'' if count == 1 else 's'}"

    table.add_row(Text("free large blocks, by size:", style="italic"), *("" for _ in found))
    for label in found[0].fragments:
        table.add_row(f"  {label}", *(blocks(*b.fragments[label]) for b in found),
                      end_section=label == list(found[0].fragments)[-1])
    table.add_row(Text("live blocks in the chunks that hold free pieces:", style="italic"), *("" for _ in found))
    for label in found[0].pinning:
        table.add_row(f"  {label}", *(blocks(*b.pinning[label]) for b in found))
    console.print(table)
    for b in found:
        console.print(Text(f"{b.policy}: {b.why}"))
        if b.plan_words:
            console.print(Text(f"{b.policy}: {b.plan_words}"))
    return status


def cmd_tune(args) -> int:
    """`gmlake tune`: replay a search of policies and knobs, print the front and the setting to use."""
    return show_tune(args, tune_result(args))


def tune_result(args) -> TuneResult:
    """`gmlake tune ARGS`'s search, replayed (its arguments checked first): the gmlake.sim.tune.TuneResult that
    show_tune prints. The docs generator calls the two in turn, as the command does."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gmlake.sim import tune

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if not args.within >= 1:        # also NaN
        raise UsageError(f"--within must be a factor of at least 1, got {args.within}")
    if args.plot:
        _output_file(args.plot, "--plot")
    if _policy_choices([tune.DEFAULT_POLICY], []) and env_knobs():     # checked, as every command checks it
        print(f"gmlake: note: tune searches the knobs itself; {KNOBS_VARIABLE}={os.environ[KNOBS_VARIABLE]} is "
              f"not applied to its replays", file=sys.stderr)
    (trace,) = _load([args.trace], args.device)
    settings = tune.search_space(trace)
    bar = Progress(TextColumn("tuning {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[last]}"), console=Console(stderr=True),
                   disable=not sys.stderr.isatty(), transient=True,
                   auto_refresh=False)   # no thread of its own to copy into the forked workers
    with bar:
        task = bar.add_task(trace.name, total=len(settings), last="")
        result = tune.tune(trace, fit=args.fit, device_memory=args.device_memory, event_lag=args.event_lag,
                           within=args.within, jobs=args.jobs, settings=settings,
                           on_done=lambda o: bar.update(task, advance=1, last=o.policy, refresh=True))
    _note_unsized([trace], args.device_memory)
    return result


def show_tune(args, result: TuneResult) -> int:
    """Print `result` (tune_result's) as `gmlake tune ARGS` does, write its --plot; the command's exit status."""
    from gmlake.sim import tune

    plot = _output_file(args.plot, "--plot") if args.plot else None
    if plot:
        _write_atomically({plot: lambda tmp: tune.plot(result, tmp)})
    if args.json:
        print(json.dumps(result.record()))
    else:
        console = _console(wide=args.wide)
        console.print(tune.table(result, every=args.all, wide=args.wide))
        for line in tune.recommendation_lines(result, None if args.wide else console.width):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        console.print(f"{len(result.outcomes)} settings in {result.seconds:.1f} s on {result.jobs} "
                      f"process{'es' if result.jobs > 1 else ''}"
                      + (f"; wrote {plot}" if plot else ""), markup=False, highlight=False)
    return EXIT_OK if result.recommended is not None else EXIT_OUT_OF_MEMORY


# What `compare --smallest-cap` adds to each replay's record, from gmlake.sim.cap.limits (None where the policy ran out
# of memory even uncapped)
LIMIT_KEYS = ("smallest_device_memory", "largest_failing_device_memory", "smallest_device_memory_x_peak",
              "smallest_cap", "largest_failing_cap", "smallest_cap_x_peak", "replays")


def cmd_compare(args) -> int:
    """`gmlake compare`: traces (default: the bundled ones) under every policy; table, PNG, JSON lines."""
    from gmlake.sim import compare
    from gmlake.sim.replay import bundled_traces

    chosen = _policy_choices(args.policy, args.set)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if args.smallest_cap and (args.device_memory is not None or args.cap is not None):
        raise UsageError("--smallest-cap searches for the device and the memory cap itself; drop "
                         + ("--device-memory" if args.device_memory is not None else "--cap"))
    if args.jobs is not None and not args.smallest_cap:
        raise UsageError("--jobs sets the processes of --smallest-cap's searches; give --smallest-cap too")
    out = _output_dir(args.out, "--out")
    specs = args.traces or [str(p) for p in bundled_traces()]
    if not specs:
        raise UsageError("no traces given and none bundled")
    traces = _load(specs, args.device)
    results = compare.run(traces, chosen, progress=sys.stderr.isatty(), device_memory=args.device_memory,
                          event_lag=args.event_lag, cap=args.cap or 0)
    limits = (compare.smallest_limits(traces, chosen, event_lag=args.event_lag, jobs=args.jobs,
                                      progress=sys.stderr.isatty()) if args.smallest_cap else None)
    _note_unsized(traces, args.device_memory)
    records = [r.summary() for r in results]
    for record, row in zip(records, limits or ()):
        record.update({key: row.get(key) for key in LIMIT_KEYS})
    console = _console(wide=args.wide)
    if args.json:
        for record in records:
            print(json.dumps(record))
    else:
        console.print(compare.table(results, traces, wide=args.wide, limits=limits))
    out.mkdir(parents=True, exist_ok=True)
    png, jsonl = out / "compare.png", out / "compare.jsonl"
    lines = "".join(json.dumps(record) + "\n" for record in records)
    _write_atomically({png: lambda tmp: compare.plot(results, traces, tmp, format="png"),
                       jsonl: lambda tmp: tmp.write_text(lines)})
    if not args.json:
        console.print(f"wrote {png} and {jsonl}", markup=False, highlight=False)
    return EXIT_OUT_OF_MEMORY if any(r.failed for r in results) else EXIT_OK


def cmd_traces(args) -> int:
    """`gmlake traces`: the bundled traces, which replay, explain and compare take by name."""
    from rich.table import Table

    from gmlake.sim.replay import bundled_traces
    from gmlake.sim.trace import load

    if args.names:
        for path in bundled_traces():
            print(path.name.removesuffix(".gmtrace"))
        return EXIT_OK
    table = Table(title="bundled traces (use the name as TRACE: gmlake replay NAME)")
    # The names whole (they are what one types), the other headers on two lines: 80 columns hold the table.
    for col in ("name", "captured under", "device", "events", "captured reserved GiB"):
        table.add_column(col if col == "name" else col.replace(" ", "\n"),
                         justify="right" if col in ("events", "captured reserved GiB") else "left",
                         no_wrap=col in ("name", "events"), overflow="fold")
    for path in bundled_traces():
        meta = load(path).meta
        table.add_row(path.name.removesuffix(".gmtrace"), meta.get("allocator", "-"), meta.get("device_name", "-"),
                      f"{meta.get('events', 0):,}", f"{meta.get('max_memory_reserved', 0) / 2**30:.2f}")
    _console().print(table)
    return EXIT_OK


def cmd_policies(args) -> int:
    """`gmlake policies`: each policy (built-in, installed, or the specs given) with the knobs it reads: default and
    unit (knobs its growth does not read are refused, so they are not listed)."""
    from rich.table import Table

    from gmlake.policies.settings import format_knob

    specs = args.policy or policies.names() + sorted(policies.installed())
    for spec in specs:
        policy = policies.resolve(spec, granularity=None).policy
        cls = type(policy)
        table = Table(title=f"{spec} ({cls.__qualname__}, segment_rule={policy.segment_rule})", title_justify="left")
        for col in ("knob", "default", "unit"):
            table.add_column(col)
        for name, default, unit in cls.knob_rows():
            table.add_row(name, format_knob(default, unit), unit)
        _console().print(table)
    return EXIT_OK


def cmd_convert(args) -> int:
    """`gmlake convert`: a snapshot to the compact .gmtrace format (the only format it writes)."""
    from gmlake.sim.trace import save_compact, snapshot_stem

    source = Path(args.snapshot)
    output = args.output or str(source.with_name(snapshot_stem(source) + ".gmtrace"))
    if not output.endswith(".gmtrace"):
        raise UsageError(f"convert writes the compact .gmtrace format; name the output *.gmtrace, got {output!r}")
    out = _output_file(output, "--output")
    (trace,) = _load([args.snapshot], args.device)
    if args.name:
        trace.meta["name"] = args.name
    save_compact(trace, out)
    print(f"wrote {out}: {len(trace)} events, compact .gmtrace format")
    return EXIT_OK
