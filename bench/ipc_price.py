"""The price of exportable chunks (Note [Exporting a chunk]): each VMM call per handle, and an allocator's step.

    python -m bench ipc-price [--driver cuda|host] [--rounds N] [--calls N] [--steps N] [--out FILE]
    python -m bench ipc-price --price-table bench/results/<machine-date>/ipc-price.json

Three kinds of chunk: plain (no handle type), exportable (created with the POSIX file descriptor handle type and never
exported: every chunk, by default) and exported (exported once created and its descriptor closed: a shared chunk).
Two phases, steps first so that no export comes before them:
- steps: per round, `--steps` grow-and-release steps (every request maps new chunks) of a fresh allocator over a
  plain and over an exportable driver, interleaved (A B B A ..., the first kind alternating by round), after one
  untimed step of each;
- per-handle prices: per round, bench._bench.time_driver_calls over `--calls` chunks of each size for each kind
  (create, map, set_access, unmap, release, and the export), the order of kinds alternating by round.
A ratio is the median over rounds of each round's exportable / plain (or exported / plain), with its quartiles and
range. `decide` says whether exportable chunks are free: the default follows (docs/benchmarks.md). JSON to --out or
$OUT/ipc_price.json. --price-table writes a record's extra µs per exportable 2 MiB handle into replay's cost table
(per_handle_exportable_extra, gmlake/sim/data/driver_costs_h200.json) and names the record there.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import gmlake
from bench import RESULTS, ROOT
from bench.cli import OneLineParser, error_line, render_table
from bench.harness import environment
from gmlake import Allocator

MiB, SIZES_MIB = 1 << 20, (2, 20)
STEP_MIB = (6, 20, 64, 2, 40, 128, 20, 8)
KINDS = ("plain", "exportable", "exported")
# time_driver_calls' names -> the cost table's per_handle names (gmlake/sim/data/driver_costs_h200.json)
CALLS = {"create_chunk": "create_chunk", "map": "map", "set_access_per_handle": "set_access",
         "unmap_per_handle": "unmap", "release_chunk": "release_chunk"}
# Exportable / plain at most this, judged by the median over rounds, and a spread between the rounds' quartiles
# no wider than IPC_SAME - 1: exportable chunks cost nothing to speak of there. A wider spread cannot decide.
IPC_SAME = 1.05
TABLE_SIZE = "2MiB"     # the cost table prices 2 MiB handles
TABLE = ROOT / "gmlake" / "sim" / "data" / "driver_costs_h200.json"
TABLE_NOTE = ("µs each handle of an exportable chunk (created with the POSIX file descriptor handle type, as chunks "
              "are by default, Note [Exporting a chunk]) costs beyond per_handle's while it is not exported; replay "
              "adds them to every handle where the sim driver's chunks are exportable (SimDriver.exportable). "
              "Measured by `python -m bench ipc-price` on {gpu} (driver {nvidia_driver}), torch {torch}, {day}: "
              "{rounds} rounds of {calls} 2 MiB handles of each kind, the order alternating; the median over rounds "
              "of exportable less plain in the same round (per_handle_exportable_result; docs/benchmarks.md, "
              "\"Sharing CUDA tensors: exportable chunks\", shows all its prices, exported chunks' included, which "
              "replay does not use: it exports nothing). Measured on that GPU and added to per_handle's H200 prices.")


def spread(values: list[float]) -> dict:
    """Median, quartiles and range of `values` (two or more)."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values)}


def time_step(driver) -> float:
    """ms of one grow-and-release step (STEP_MIB MiB) of a fresh allocator over `driver`: every request grows."""
    alloc = Allocator(driver)
    started = time.perf_counter_ns()
    for ptr in [alloc.malloc(mib * MiB) for mib in STEP_MIB]:
        alloc.free(ptr)
    alloc.empty_cache()
    alloc.close()
    return (time.perf_counter_ns() - started) / 1e6


def measure_steps(drivers: dict, rounds: int, steps: int) -> dict:
    """Per round, `steps` steps of each kind interleaved A B B A ...; the ratio of the rounds' medians."""
    for name in ("plain", "exportable"):
        time_step(drivers[name])                                # untimed: first touches of the driver
    samples: dict = {"plain": [], "exportable": []}
    for r in range(rounds):
        order = ("plain", "exportable")[::1 if r % 2 == 0 else -1]
        taken: dict = {"plain": [], "exportable": []}
        for i in range(steps):
            for name in order[::1 if i % 2 == 0 else -1]:
                taken[name].append(time_step(drivers[name]))
        for name, values in taken.items():
            samples[name].append(values)
    medians = {name: [statistics.median(v) for v in by_round] for name, by_round in samples.items()}
    return {"median_ms": {name: statistics.median(v) for name, v in medians.items()},
            "ratio": spread([e / p for e, p in zip(medians["exportable"], medians["plain"])]),
            "samples_ms": samples}


def measure_prices(drivers: dict, rounds: int, calls: int) -> dict:
    """Per round and size, each kind's per-handle prices (its order alternating by round); medians, ratios to plain
    (paired within a round) and the extra µs per handle."""
    from bench.native import load
    time_driver_calls = load().time_driver_calls
    samples: dict = {f"{mib}MiB": {k: {} for k in KINDS} for mib in SIZES_MIB}
    for r in range(rounds):
        for kind in KINDS[::1 if r % 2 == 0 else -1]:
            driver = drivers["plain" if kind == "plain" else "exportable"]
            for mib in SIZES_MIB:
                got = time_driver_calls(driver, mib * MiB, calls, export=kind == "exported", copies=False)
                names = {**CALLS, "export": "export"} if kind == "exported" else CALLS
                for key, name in names.items():
                    samples[f"{mib}MiB"][kind].setdefault(name, []).append(got[key])
    out = {}
    for size, by_kind in samples.items():
        plain = by_kind["plain"]
        out[size] = {
            "median_us": {kind: {c: statistics.median(v) for c, v in by_call.items()} for kind, by_call in by_kind.items()},
            "ratio": {kind: {c: spread([a / b for a, b in zip(by_kind[kind][c], plain[c])]) for c in plain}
                      for kind in KINDS[1:]},
            "extra_us": {kind: {c: statistics.median([a - b for a, b in zip(by_kind[kind][c], plain[c])])
                                for c in plain} for kind in KINDS[1:]},
            "samples_us": by_kind}
    return out


def measure(kind: str, rounds: int, calls: int, steps: int) -> dict:
    drivers = ({"plain": gmlake.cuda_driver(0, False), "exportable": gmlake.cuda_driver(0, True)} if kind == "cuda"
               else {"plain": gmlake.HostDriver(), "exportable": gmlake.HostDriver()})
    steps_out = measure_steps(drivers, rounds, steps)
    return {"steps": steps_out, "per_handle": measure_prices(drivers, rounds, calls)}


def judge(ratio: dict) -> str:
    """'free', 'dearer' or 'cannot decide' (the quartiles further apart than the threshold) for a ratio's spread."""
    if ratio["q3"] - ratio["q1"] > IPC_SAME - 1:
        return "cannot decide"
    return "free" if ratio["median"] <= IPC_SAME else "dearer"


def decide(record: dict) -> dict:
    """Whether chunks should be exportable by default, from an ipc-price record: only if creating, mapping,
    setting access to, unmapping and releasing an exportable (not exported) chunk, at every size, and the
    grow-and-release step all judge 'free'. {"exportable": True, False, or None where the record cannot decide,
    "judged": {what: verdict}, "lacks": the fields an older record lacks}."""
    lacks = [key for key in ("per_handle", "steps") if key not in record]
    if lacks:
        return {"exportable": None, "judged": {}, "lacks": lacks}
    judged = {f"{call} ({size[:-3]} MiB)": judge(ratio) for size, row in record["per_handle"].items()
              for call, ratio in row["ratio"]["exportable"].items()}
    judged["grow-and-release step"] = judge(record["steps"]["ratio"])
    verdicts = set(judged.values())
    return {"exportable": None if "cannot decide" in verdicts else verdicts == {"free"}, "judged": judged, "lacks": []}


def table_extra(record: dict) -> dict:
    """The cost table's per_handle_exportable_extra from a record: the extra µs per 2 MiB exportable handle, per
    call, rounded as the table keeps it."""
    return {call: round(us, 3) for call, us in record["per_handle"][TABLE_SIZE]["extra_us"]["exportable"].items()}


def write_table(record: Path, table: Path | None = None) -> dict:
    """Put `record`'s table_extra into the cost table at `table` (default TABLE), with a note saying where it came from and the
    record's name (relative to bench/results) in per_handle_exportable_result. Returns the extras; ValueError for
    a record without per-handle prices."""
    data = json.loads(record.read_text())
    if "per_handle" not in data:
        raise ValueError(f"{record} has no per-handle prices (a record from before they were measured)")
    env = data.get("environment", {})
    table = table or TABLE
    costs, extra = json.loads(table.read_text()), table_extra(data)
    note = TABLE_NOTE.format(
        day=env.get("date", "?")[:10], **{k: env.get(k, "?") for k in ("gpu", "nvidia_driver", "torch", "rounds", "calls")})
    name = str(record.resolve().relative_to(RESULTS)) if record.resolve().is_relative_to(RESULTS) else str(record)
    out: dict = {}
    for key, value in costs.items():
        if key.startswith("per_handle_exportable_"):
            continue
        out[key] = value
        if key == "per_handle":
            out.update(per_handle_exportable_extra=extra, per_handle_exportable_note=note,
                       per_handle_exportable_result=name)
    table.write_text(json.dumps(out, indent=2) + "\n")
    return extra


def main(argv: list[str] | None = None, prog: str = "bench ipc-price") -> None:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=["cuda", "host"], default="cuda")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=128, help="chunks per size, kind and round")
    parser.add_argument("--steps", type=int, default=20, help="grow-and-release steps per kind and round")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--price-table", type=Path, metavar="RECORD",
                        help="write RECORD's extra per exportable handle into replay's cost table, and measure nothing")
    args = parser.parse_args(argv)
    if args.price_table:
        try:
            extra = write_table(args.price_table)
        except (OSError, ValueError) as exc:        # no such file, not JSON, or an older record
            parser.error(error_line(exc))
        print(f"{TABLE}: per_handle_exportable_extra = {extra} (µs per 2 MiB handle)")
        return
    if args.rounds < 2 or args.calls < 1 or args.steps < 1:
        parser.error("need --rounds >= 2 (the order alternates), --calls >= 1 and --steps >= 1")
    out = args.out or (Path(os.environ["OUT"]) / "ipc_price.json" if os.environ.get("OUT") else None)
    try:
        measured = measure(args.driver, args.rounds, args.calls, args.steps)
    except (RuntimeError, ImportError) as exc:      # no CUDA driver or device, a driver call refused, or no build
        sys.exit(f"{prog}: {error_line(exc)}")
    result = {"environment": environment(driver_kind=args.driver, rounds=args.rounds, calls=args.calls,
                                         steps=args.steps), **measured}
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    for size, row in result["per_handle"].items():
        med, ratio = row["median_us"], row["ratio"]
        rows = [[call, *(f"{med[k][call]:.2f}" for k in KINDS),
                 *(f"{ratio[k][call]['median']:.3f} ({ratio[k][call]['q1']:.3f}-{ratio[k][call]['q3']:.3f})"
                   for k in KINDS[1:])] for call in med["plain"]]
        rows.append(["export", "", "", f"{med['exported']['export']:.1f}", "", ""])
        print(render_table(f"{size[:-3]} MiB chunks: µs per handle, medians over rounds",
                           ["call", *KINDS, "exportable / plain (q1-q3)", "exported / plain (q1-q3)"], rows))
    steps, decision = result["steps"], decide(result)
    print("grow-and-release step (ms): {plain:.3f} plain, {exportable:.3f} exportable".format(**steps["median_ms"])
          + " ({median:.3f}x, quartiles {q1:.3f}-{q3:.3f})".format(**steps["ratio"]))
    said = {True: "exportable chunks are free: exportable by default", False: "exportable chunks cost more",
            None: "cannot decide"}[decision["exportable"]]
    for verdict in ("dearer", "cannot decide"):
        named = [what for what, v in decision["judged"].items() if v == verdict]
        said += f"; {verdict}: {', '.join(named)}" if named else ""
    print(said)
