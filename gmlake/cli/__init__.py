"""The gmlake command: replay, explain, compare, tune, traces, capture, convert, run.

    gmlake replay TRACE [--policy POLICY ...] [--set [POLICY.]KNOB=VALUE ...] [--device-memory 80GiB] [--cap SIZE]
                        [--json]
    gmlake explain TRACE [--policy POLICY ...] [--set [POLICY.]KNOB=VALUE ...] [--cap SIZE] [--json]
    gmlake compare [TRACE ...] [--cap SIZE] [--out DIR] [--smallest-cap [--jobs N]] [--json]
    gmlake tune TRACE [--fit SIZE] [--json] [--plot FILE]   (which policy and knobs suit this job)
    gmlake traces                          (the bundled traces, usable by name as TRACE)
    gmlake capture -o run.pickle.gz -- python train.py ...
    gmlake convert SNAPSHOT [-o trace.gmtrace]
    gmlake run train.py args...            (gmlake as PyTorch's CUDA allocator; or: gmlake run -m module args...)

Exit statuses: 0 success; 2 bad input (one line on stderr, nothing written), including a policy of the user's whose
hook raised or answered out of range (GMLAKE_TRACEBACK=1 shows the hook's own traceback); 3 a replay in which
requests ran out of memory (results are still printed and written, marked as failed); 1 an internal error (a bug: one
line on stderr, GMLAKE_TRACEBACK=1 shows the traceback); 130 interrupted. `run` and `capture` end with the program's
own status.

POLICY is a spec (gmlake.policies.resolve): a built-in name, a name an installed package declares in the
`gmlake.policies` entry point group, `module:Class` or `path/to/file.py:Class`, optionally followed by its own knobs
in brackets, `gmlake[min_saved_chunks=0,chunk_size=8MiB]`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from gmlake import __version__, policies
from gmlake.core.errors import PolicyError
from gmlake.policies.knobs import parse_size
from gmlake.sim import MAX_DEVICE_MEMORY

EXIT_OK = 0
EXIT_INTERNAL_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_OUT_OF_MEMORY = 3
EXIT_INTERRUPTED = 130
# What `pip install 'gmlake[sim]'` adds (pyproject.toml): the replay and analysis commands need it, `run` does not.
SIM_EXTRA = ("numpy", "matplotlib")

_POLICY_NAMES = ", ".join(policies.names())
_INSTALLED = ", ".join(sorted(policies.installed()))


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(message)


def error_line(exc: BaseException) -> str:
    """The one line of stderr that reports `exc`: its message without a leading 'gmlake: ' (the line adds its own)
    and on one line; for an OSError, the file and the reason."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    while text.startswith("gmlake: "):
        text = text[len("gmlake: "):]
    return text


# ---------------------------------------------------------------------------------------------- argument types


def _size_type(what: str, minimum: int, maximum: int = (1 << 63) - 1,
               round_down: bool = False) -> Callable[[str], int]:
    """An argparse type: a byte size with optional unit (80GiB), in [minimum, maximum]. Argparse names the flag."""
    def parse(text: str) -> int:
        try:
            return parse_size(text, what=what, minimum=minimum, maximum=maximum, round_down=round_down)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _event_lag(text: str) -> int:
    """An argparse type: requests between an event's recording and its completion (Note [Event lag in replay])."""
    try:
        lag = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"event lag must be a whole number of requests, got {text!r}") from None
    if lag < 0:
        raise argparse.ArgumentTypeError(f"event lag must be 0 or more requests, got {text!r}")
    return min(lag, (1 << 63) - 1)      # any lag past the trace's length means "never"


_device_memory = _size_type("device memory", 1, MAX_DEVICE_MEMORY, round_down=True)   # 5.58GiB: about that
_cap = _size_type("a memory cap", 1, MAX_DEVICE_MEMORY, round_down=True)
_byte_count = _size_type("size", 0)


def _count(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    try:
        value = int(text.replace("_", "")) if len(text) <= 30 else -1
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


# ---------------------------------------------------------------------------------------------- shared steps


def _policy_choices(specs: list[str] | None, settings: list[str] | None) -> list[policies.PolicyChoice]:
    """The chosen policies (default: every built-in one), each with its --set knobs and inline knobs, validated."""
    return policies.choose(specs or policies.names(), settings or [])


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


def _output_file(path: str, flag: str) -> Path:
    """An output file that can be created: its folder exists and it is not a folder itself."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    if not out.parent.is_dir():
        raise UsageError(f"{flag} {path}: no such directory {str(out.parent)!r}")
    return out


def _output_dir(path: str, flag: str) -> Path:
    """An output folder that exists or can be created (nothing on its way is a file)."""
    out = Path(path)
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                raise UsageError(f"{flag} {path}: {str(folder)!r} is a file, not a folder")
            break
    return out


def _console(piped_width: int = 240, wide: bool = False):
    """The console tables print to: the terminal's width (or room for every column, `wide`); piped, `piped_width`
    unless COLUMNS is set."""
    from rich.console import Console

    if wide:
        return Console(width=1000)
    # COLUMNS, where set, is the width asked for, piped too (rich reads it).
    return Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=piped_width)


def _write_atomically(files: dict[Path, Callable[[Path], object]]) -> None:
    """Write each file through `write(tmp_path)` to a temporary name, then rename them all; on failure remove the
    temporary files, so nothing is half-written."""
    tmps = {path: path.with_name(path.name + ".tmp") for path in files}
    try:
        for path, write in files.items():
            write(tmps[path])
        for path, tmp in tmps.items():
            tmp.replace(path)
    except BaseException:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        raise


def _torch_cuda_problem(what: str) -> str | None:
    """Why this interpreter's PyTorch cannot serve `gmlake {what}`, or None. `capture` records a run, so it also
    needs a usable device; `run` does not (the program decides what it does without one)."""
    from gmlake.torch.capture import torch_cuda_problem

    problem = torch_cuda_problem(device=what == "capture")
    return f"gmlake {what}: {problem}" if problem else None


# ---------------------------------------------------------------------------------------------- commands


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

        _console(120, args.wide).print(table(results, [trace], wide=args.wide))
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
    from dataclasses import asdict

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
            print(json.dumps({**asdict(b), "why": b.why, "words": b.words}))
        return status
    console = _console()
    for b in found:                               # why, in words, before the account
        console.print(Text(f"{b.policy}: {b.words}"), soft_wrap=True)
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
    return status


def cmd_tune(args) -> int:
    """`gmlake tune`: replay a search of policies and knobs, print the front and the setting to use."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gmlake.sim import tune

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if not args.within >= 1:        # also NaN
        raise UsageError(f"--within must be a factor of at least 1, got {args.within}")
    plot = _output_file(args.plot, "--plot") if args.plot else None
    (trace,) = _load([args.trace], args.device)
    settings = tune.search_space(trace)
    bar = Progress(TextColumn("tuning {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[last]}"), console=Console(stderr=True),
                   disable=not sys.stderr.isatty(), transient=True)
    with bar:
        task = bar.add_task(trace.name, total=len(settings), last="")
        result = tune.tune(trace, fit=args.fit, device_memory=args.device_memory, event_lag=args.event_lag,
                           within=args.within, jobs=args.jobs, settings=settings,
                           on_done=lambda o: bar.update(task, advance=1, last=o.policy))
    _note_unsized([trace], args.device_memory)
    if plot:
        _write_atomically({plot: lambda tmp: tune.plot(result, tmp)})
    if args.json:
        print(json.dumps(result.record()))
    else:
        console = _console(wide=args.wide)
        console.print(tune.table(result, every=args.all, wide=args.wide))
        for line in tune.recommendation_lines(result):
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
    console = _console(120, args.wide)
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

    from gmlake.policies.knobs import format_knob

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


def _program(args, usage: str) -> list[str]:
    """The program to run, after an optional `--`."""
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        raise UsageError(f"nothing to run: {usage}")
    if program[0] == "-m" and len(program) < 2:
        raise UsageError(f"-m needs a module name: {usage}")
    return program


def _check_script(program: list[str]) -> None:
    """A program is `-m module args`, `-c code args` or `script.py args`; the script must exist."""
    if program[0] == "-c" and len(program) < 2:
        raise UsageError("-c needs the code to run, as python -c takes it")
    if program[0] not in ("-m", "-c") and not Path(program[0]).is_file():
        raise UsageError(f"no such script: {program[0]}")


def cmd_capture(args) -> int:
    """`gmlake capture`: run a Python program with allocator history on, then dump its snapshot. A bare `python`
    (or `python3`, ...) means this interpreter, the one gmlake is installed in; a path to a Python is honoured."""
    usage = "gmlake capture -o OUT -- python script.py args...  (or: -- python -m module args..., -- python -c CODE)"
    program = _program(args, usage)
    first = program[0]
    if first in ("-m", "-c") or first.endswith(".py"):
        python, rest = sys.executable, program
    elif Path(first).name.startswith("python"):
        python, rest = (first if os.sep in first else sys.executable), program[1:]
    else:
        raise UsageError(f"capture runs Python programs: {usage}")
    if not rest:
        raise UsageError(f"nothing to run: {usage}")
    if rest[0] == "-m" and len(rest) < 2:
        raise UsageError(f"-m needs a module name: {usage}")
    _check_script(rest)
    output = _output_file(args.output, "--output")
    if python == sys.executable:
        problem = _torch_cuda_problem("capture")
        if problem:
            raise UsageError(problem)
    cmd = [python, "-m", "gmlake.torch.capture", str(output)]
    if args.name:
        cmd += ["--name", args.name]
    cmd += ["--", *rest]
    try:
        return subprocess.call(cmd, env=os.environ.copy())
    except OSError as exc:
        raise UsageError(f"cannot start {python}: {exc.strerror or exc}") from None


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


def _run_policy(args) -> tuple[policies.PolicyChoice, int]:
    """The policy and per-device limit `gmlake run` installs: the GMLAKE_* environment, overridden by the flags
    (--policy, --chunk-size, --limit, --max-cached-sblocks, --no-stitch), then --set; checked for any driver, so an
    unknown policy or an unknown or ill-typed knob fails before the program runs."""
    from gmlake import torch as gtorch

    opts = gtorch.options_from_env()
    spec = args.policy if args.policy is not None else opts.get("policy", "gmlake")
    opts.pop("policy", None)
    limit = args.limit if args.limit is not None else opts.pop("limit", 0)
    opts.pop("limit", None)
    for flag in ("chunk_size", "max_cached_sblocks"):
        if getattr(args, flag) is not None:
            opts[flag] = getattr(args, flag)
    if args.no_stitch:
        opts["stitch"] = False
    (choice,) = policies.choose([spec], args.set or [], base_knobs=opts, granularity=1)
    return choice, limit


def cmd_run(args) -> int | Callable[[], int]:
    """`gmlake run`: check every setting, install gmlake as PyTorch's CUDA allocator, and return the program to run
    (main runs it outside gmlake's error handling: its errors are its own)."""
    import runpy

    from gmlake import torch as gtorch

    program = _program(args, "gmlake run script.py args...  (or: gmlake run -m module args...)")
    choice, limit = _run_policy(args)
    _check_script(program)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("gmlake run needs PyTorch, which is not installed here") from None
    problem = _torch_cuda_problem("run")
    if problem:
        raise UsageError(problem)
    gtorch.enable(choice, limit=limit)

    def run_program() -> int:
        if program[0] == "-m":
            sys.argv = program[1:]
            runpy.run_module(program[1], run_name="__main__", alter_sys=True)
        elif program[0] == "-c":
            sys.argv = ["-c", *program[2:]]
            exec(compile(program[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - python -c
        else:
            script = Path(program[0])
            sys.argv = program
            sys.path.insert(0, str(script.resolve().parent))
            runpy.run_path(str(script), run_name="__main__")
        return EXIT_OK

    return run_program


# ---------------------------------------------------------------------------------------------- the parser

_TRACE_HELP = ("a PyTorch snapshot pickle (.pickle, .pickle.gz), a .gmtrace file, or the name of a bundled trace "
               "(see `gmlake traces`)")
_SPEC_HELP = (f"a built-in policy ({_POLICY_NAMES}), an installed one"
              + (f" ({_INSTALLED})" if _INSTALLED else "")
              + ", module:Class, or path/to/file.py:Class (loading a module or file runs its code); add knobs for "
                "this policy alone in brackets: 'gmlake[min_saved_chunks=0]' (quote it for the shell)")
_POLICY_HELP = _SPEC_HELP + ". Repeatable, also with one policy twice under different knobs; default: all built-in"
_SET_HELP = ("change a knob of every chosen policy, e.g. stitch=false or chunk_size=8MiB (each policy must have it), or "
             "of one: POLICY.knob=value, POLICY as given to --policy or its position from 1 (gmlake.stitch=false, "
             "my.py:MaxPieces.max_pieces=2, 2.min_saved_chunks=0). Repeatable; a policy's [knobs] win over "
             "POLICY.knob, which wins over knob (knobs: gmlake/policies/base.py)")
_DEVICE_HELP = "which device's trace, if the snapshot has several"
_DEVICE_MEMORY_HELP = ("simulated device size: bytes or with a unit, e.g. 80GiB (default: the captured device's, "
                       f"or {MAX_DEVICE_MEMORY >> 40} TiB where the trace records none; at most "
                       f"{MAX_DEVICE_MEMORY >> 40} TiB)")
_WIDE_HELP = "every column of the table (fragmentation, driver calls, time lost, replay speed), however wide"
_JSON_HELP = "one JSON object per line, one per policy"
_CAP_HELP = ("replay under this memory cap, as torch.cuda.set_per_process_memory_fraction or GMLAKE_LIMIT set one "
             "(bytes or with a unit, e.g. 7.9GiB), on the modelled device")
_EVENT_LAG_HELP = ("complete each event the allocator records N requests after it (default 0: at once), as if the "
                   "GPU trailed the CPU; matters only where blocks are shared across streams (cross_stream)")


def _add_device_options(p: argparse.ArgumentParser) -> None:
    """The options that say what a replay models, defined once for replay, explain and compare: which device's
    trace, the device's size, a memory cap on it, and how far its events trail the requests."""
    p.add_argument("--device", type=int, help=_DEVICE_HELP)
    p.add_argument("--device-memory", type=_device_memory, metavar="SIZE", help=_DEVICE_MEMORY_HELP)
    p.add_argument("--cap", type=_cap, metavar="SIZE", help=_CAP_HELP)
    p.add_argument("--event-lag", type=_event_lag, default=0, metavar="N", help=_EVENT_LAG_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the gmlake command."""
    parser = _Parser(prog="gmlake", description="GPU memory allocator with virtual memory stitching: tools. Exit "
                     "status: 0 success, 2 bad input, 3 a replay ran out of memory, 1 internal error.")
    parser.add_argument("--version", action="version", version=f"gmlake {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    for name, func, text in (("replay", cmd_replay, "replay one trace through policies on the sim driver"),
                             ("explain", cmd_explain,
                              ("where a policy's reserved memory is at its moment of peak growth (the first request "
                               "that brings reserved within 1 %% of its peak), replaying one trace"))):
        p = sub.add_parser(name, help=text)
        p.add_argument("trace", help=_TRACE_HELP)
        p.add_argument("--policy", action="append", metavar="POLICY", help=_POLICY_HELP)
        p.add_argument("--set", action="append", metavar="KNOB=VALUE", help=_SET_HELP)
        p.add_argument("--json", action="store_true", help=_JSON_HELP)
        _add_device_options(p)
        if name == "replay":
            p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
            p.add_argument("--smallest-cap", dest="smallest_cap", action="store_true",
                           help="instead: bisect, by replay, for the smallest memory cap each policy serves "
                                "every request under (torch.cuda.set_per_process_memory_fraction's cap, on the "
                                "trace's device: what a job fits into) and, beside it, the smallest device with "
                                "no cap (where the device itself is the limit)")
        p.set_defaults(func=func)

    p = sub.add_parser("compare", help="replay traces (default: the bundled ones) under every policy; table + PNG")
    p.add_argument("traces", nargs="*", metavar="TRACE", help=_TRACE_HELP + "; default: every bundled trace")
    p.add_argument("--policy", action="append", metavar="POLICY", help=_POLICY_HELP)
    p.add_argument("--set", action="append", metavar="KNOB=VALUE", help=_SET_HELP)
    _add_device_options(p)
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line, one per trace and policy, instead of the table (compare.jsonl "
                        "holds the same)")
    p.add_argument("--smallest-cap", dest="smallest_cap", action="store_true",
                   help="also bisect, by replay, for the smallest device (no cap: the device itself is the limit) "
                        "and the smallest memory cap (torch.cuda.set_per_process_memory_fraction's) each policy "
                        "serves every request on, as `gmlake replay --smallest-cap` does: columns in the table, "
                        "bytes in the JSON")
    p.add_argument("--jobs", type=_count, metavar="N",
                   help="processes for --smallest-cap's searches (default: every core)")
    p.add_argument("--out", default="gmlake-compare", metavar="DIR",
                   help="folder for compare.png and compare.jsonl, created if missing (default: gmlake-compare)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("tune", help="find the policy and knobs that suit a trace: replay a search, print the front "
                                    "of memory and driver time, recommend one")
    p.add_argument("trace", help=_TRACE_HELP)
    p.add_argument("--fit", type=_cap, metavar="SIZE",
                   help="the memory the job must complete in, e.g. 12GiB: a cap on the modelled device (what "
                        "GMLAKE_LIMIT sets); recommend the fastest setting that completes within it (default: the "
                        "least peak reserved within --within of the fastest driver time)")
    p.add_argument("--within", type=float, default=1.05, metavar="X",
                   help="without --fit: consider settings whose driver time is at most X times the fastest's, "
                        "or 50 ms more (default 1.05)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: every setting's outcome and the recommendation")
    p.add_argument("--plot", metavar="FILE", help="write a PNG of driver time against memory, the front marked")
    p.add_argument("--all", action="store_true", help="show every setting, not only the front and the built-ins")
    p.add_argument("--wide", action="store_true", help="also the smallest device and the stitches, however wide")
    p.add_argument("--jobs", type=_count, metavar="N", help="processes to replay on (default: every core)")
    p.add_argument("--device", type=int, help=_DEVICE_HELP)
    p.add_argument("--device-memory", type=_device_memory, metavar="SIZE", help=_DEVICE_MEMORY_HELP)
    p.add_argument("--event-lag", type=_event_lag, default=0, metavar="N", help=_EVENT_LAG_HELP)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("traces", help="list the bundled traces, which replay, explain and compare take by name")
    p.add_argument("--names", action="store_true", help="only the names, one a line")
    p.set_defaults(func=cmd_traces)

    p = sub.add_parser("policies", help="list the policies and the knobs each reads, with defaults and units")
    p.add_argument("policy", nargs="*", metavar="POLICY", help="only these (" + _SPEC_HELP + ")")
    p.set_defaults(func=cmd_policies)

    p = sub.add_parser("capture", help="record a memory snapshot of a Python training run")
    p.add_argument("-o", "--output", default="gmlake-capture.pickle.gz", metavar="FILE",
                   help="the snapshot to write, a gzipped pickle (default: gmlake-capture.pickle.gz)")
    p.add_argument("--name", help="a name for the run, kept in the snapshot")
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="[--] python script.py args...  (a bare `python` is this interpreter), or script.py, or "
                        "-m module args...")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("run", help="run a Python program with gmlake as PyTorch's CUDA allocator")
    p.add_argument("--policy", metavar="POLICY", help=_SPEC_HELP + " (env GMLAKE_POLICY; default gmlake)")
    p.add_argument("--chunk-size", type=_byte_count, metavar="SIZE",
                   help="chunk size of a policy that grows by chunks (segment_rule=chunks, e.g. gmlake-paper), "
                        "e.g. 2MiB (env GMLAKE_CHUNK_SIZE); refused where the policy does not read it")
    p.add_argument("--limit", type=_byte_count, metavar="SIZE",
                   help="cap on each device's memory, e.g. 24GiB; 0 = none (env GMLAKE_LIMIT)")
    p.add_argument("--max-cached-sblocks", type=_count, metavar="N",
                   help="stitched blocks kept mapped after their free (env GMLAKE_MAX_CACHED_SBLOCKS)")
    p.add_argument("--no-stitch", action="store_true", help="never stitch (env GMLAKE_STITCH=0)")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE",
                   help="any policy knob, e.g. min_saved_chunks=0 (repeatable; env GMLAKE_KNOBS=k=v,k=v; "
                        "POLICY.knob=value also works)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="[--] script.py args...  or  -m module args...")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("convert", help="convert a snapshot to the compact .gmtrace format")
    p.add_argument("snapshot", help="a PyTorch snapshot pickle (.pickle, .pickle.gz) or a .gmtrace file")
    p.add_argument("-o", "--output", metavar="FILE.gmtrace",
                   help="the .gmtrace file to write (default: the snapshot's name with .gmtrace, beside it)")
    p.add_argument("--name", help="a name for the trace, kept in it (default: the file's)")
    p.add_argument("--device", type=int, help=_DEVICE_HELP)
    p.set_defaults(func=cmd_convert)
    return parser


def _mark_program_start(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """For `run` and `capture`: argv with `--` inserted where the program starts, so that the program's own options
    (and `-m module`) are never taken for gmlake's. An option gmlake does not know is left to argparse to report."""
    if not argv or argv[0] not in ("run", "capture"):
        return argv
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[argv[0]]
    takes_value = {s: a.nargs != 0 for a in sub._actions for s in a.option_strings}
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv
        if token == "-m" or not token.startswith("-") or token == "-":
            break
        option = token.split("=", 1)[0]
        if option not in takes_value:
            return argv
        i += 1 + (takes_value[option] and "=" not in token)
    return [*argv[:i], "--", *argv[i:]]


def _join_negative_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """argv with `--opt -5GiB` written `--opt=-5GiB` for the subcommand's options that take a value, so that a
    negative size reaches the option's own check ("must be at least 1 B") instead of argparse's "expected one
    argument" (argparse takes `-5GiB` for an option). A program's arguments after `--` are left alone."""
    if not argv:
        return argv
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    sub = subs.get(argv[0])
    if sub is None:
        return argv
    takes_value = {s for a in sub._actions for s in a.option_strings if a.nargs is None}
    out, i = [argv[0]], 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return out + argv[i:]
        if token in takes_value and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def _internal_error(exc: BaseException) -> int:
    """A bug: one line and exit status 1, never a traceback unless GMLAKE_TRACEBACK asks for it."""
    if os.environ.get("GMLAKE_TRACEBACK"):
        traceback.print_exception(exc)
    print(f"gmlake: internal error (a bug, please report it; GMLAKE_TRACEBACK=1 shows where): "
          f"{type(exc).__name__}: {error_line(exc)}", file=sys.stderr)
    return EXIT_INTERNAL_ERROR


def main(argv: list[str] | None = None) -> int:
    """Entry point of the gmlake command; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        if not argv:                              # a bare `gmlake`: what it can do, not only that it needs more
            print(parser.format_help(), end="")
            print("gmlake: error: name a command (listed above; gmlake COMMAND --help for one)", file=sys.stderr)
            return EXIT_BAD_INPUT
        args = parser.parse_args(_join_negative_values(_mark_program_start(argv, parser), parser))
        outcome = args.func(args)
    except SystemExit as exc:                     # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ImportError as exc:
        if exc.name not in SIM_EXTRA:
            return _internal_error(exc)
        # The analysis commands' dependencies are an extra: a training install has none of them.
        print(f"gmlake: error: this command needs {exc.name}, which the sim extra brings: "
              f"pip install 'gmlake[sim]'", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (UsageError, ValueError, OverflowError, MemoryError, OSError, PolicyError) as exc:
        # TraceError, knob and size errors are ValueErrors; OSError: a file that cannot be read or written;
        # PolicyError: the user's policy hook raised or answered out of range (their code, whose traceback they get).
        if isinstance(exc, PolicyError) and os.environ.get("GMLAKE_TRACEBACK"):
            traceback.print_exception(exc.__cause__ or exc)
        print(f"gmlake: error: {error_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the last resort: one line and exit status 1, never a traceback
        return _internal_error(exc)
    if callable(outcome):                         # `gmlake run`: the program, outside gmlake's error handling
        return outcome()
    return outcome


if __name__ == "__main__":
    sys.exit(main())
