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
import os
import re
import signal
import sys
import traceback

from gmlake import __version__
from gmlake.cli.analysis import cmd_compare, cmd_convert, cmd_explain, cmd_policies, cmd_replay, cmd_traces, cmd_tune
from gmlake.cli.common import (
    _INSTALLED,
    _POLICY_NAMES,
    EXIT_BAD_INPUT,
    EXIT_INTERNAL_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUT_OF_MEMORY,
    SIM_EXTRA,
    UsageError,
    _byte_count,
    _cap,
    _count,
    _device_memory,
    _event_lag,
    _Parser,
    error_line,
)
from gmlake.cli.job import cmd_capture, cmd_run
from gmlake.core.errors import PolicyError
from gmlake.sim import MAX_DEVICE_MEMORY

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
             "POLICY.knob, which wins over knob, which wins over env GMLAKE_KNOBS=k=v,k=v (knobs: "
             "gmlake/policies/knobs.py)")


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
                   help="folder for compare.png and compare.jsonl, created if missing in a folder that exists "
                        "(default: gmlake-compare)")
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
    as_program = argv is None
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
        if as_program:      # on the way out: a second Ctrl-C (or one still pending) must not end it in a traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("gmlake: interrupted", file=sys.stderr)
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


__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERNAL_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_OUT_OF_MEMORY", "build_parser",
           "main"]
