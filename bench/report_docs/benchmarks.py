"""docs/benchmarks.md's generated sections, from the result records in bench/results, and docs/training.png (the
README's figure) from the training suite's. The README (bench.report_docs.readme) and docs/graphs.md sum up the same
records."""
from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path

from bench import RESULTS, ROOT
from bench.report_docs.common import GiB, MiB, _and, _env_line, _fill, _json, _less, _n, _of, _pct, _runs_by_key, _span
from bench.speed_ab import markdown_table
from gmlake.sim.replay import driver_costs

DOC = ROOT / "docs" / "benchmarks.md"
PNG = ROOT / "docs" / "training.png"

# The training suite's current runs. A relabelling names what a run was in today's terms (None: left out): the FSDP
# call ran today's default as `gmlake-wait`, next to the default of its day; native's FSDP runs are another call's.
TRAINING: list[tuple[str, dict[str, str | None] | None]] = [
    ("train/speed-2026-11-30e/train-gpu0.json", None),
    ("train/speed-2026-11-30g/train-gpu0.json", None),
    ("train/speed-2026-11-30h/train-gpu0.json", None),
    ("train/speed-2026-11-30h/train-offload.json", None),
    ("train/fsdp-2026-12-01/train-fsdp.json", {"gmlake-wait": "gmlake", "gmlake": None, "expandable": "expandable"}),
    ("train/fsdp-2026-11-30d/train-fsdp.json", {"native": "native"}),
]
DYNAMIC = "train/speed-2026-11-30c/summary.json"
# Cap searches: per workload and allocator the latest finished search among these counts.
CAPS = ["train/cap-2026-11-30b", "train/cap-2026-11-30c", "train/cap-2026-12-01", "train/cap-2026-12-01c",
        "train/cap-2026-12-01d", "train/cap-2026-12-01e", "train/cap-2026-12-01f", "train/cap-2026-12-01g",
        "train/cap-2026-12-01h", "train/cap-2026-12-01i", "train/cap-2026-12-01j"]
# At the edge of memory, by replay: `python -m bench edge --json` (held by bench/tests/test_edge.py).
EDGE = RESULTS / "edge-figures.json"
# The device as the limit with CUDA's libraries loading lazily (`python -m bench edge_fit`), every call's runs, with the
# calibration runs' traces (tests/data/edge) that replay predicts each run from.
EDGE_FIT = "h200-2026-12-04/edge-fit.json"
FINE_SPEED = "h200-2026-12-04/speed-page2m.json"
# `python -m bench plan-goals` of each variant of where fine pages go, one record each, and bench edge of the plan
PLAN_VARIANTS = RESULTS / "plan-variants"
EDGE_BY_POLICY = {"gmlake": EDGE, "gmlake[tail_page=2MiB,plan=true]": RESULTS / "edge-figures-plan.json"}
EDGE_GOALS = {"smallest_device": "smallest device within 0.2 % of P of the better reference",
              "smallest_cap": "smallest cap, the same", "cap_1.02": "priced time at a cap of 1.02x P, at most 1.5x "
              "expandable's", "device_1.02": "the same at a device of 1.02x P", "cap_1.05": "at a cap of 1.05x P",
              "device_1.05": "at a device of 1.05x P", "unbinding": "a cap of 2x P costs nothing"}
# `python -m bench edge` with finer pages judged, by page in MiB (held by bench/tests/test_edge.py)
EDGE_PAGES = {page: RESULTS / f"edge-figures-page{page}m.json" for page in (2, 4, 10)}
# 20 MiB pages with the page a block's tail partly covers in 2 MiB slots (`tail_page=2MiB`), the same method
EDGE_TAIL = RESULTS / "edge-figures-tail2m.json"
# The tail pages with pages cut at reuse while memory is laid out (Note [Fine pages at reuse]): on the edge traces,
# and on traces no setting was chosen on, with the default and the tail pages alone beside
EDGE_CUT = RESULTS / "edge-figures-cut25.json"
EDGE_CUT_HELDOUT = RESULTS / "edge-figures-cut25-heldout.json"
# The replay goals of the default on the tuning and the held-out traces (`python -m bench plan-goals`)
REPLAY_GOALS = RESULTS / "replay-goals-default.json"
TAIL_SPEED = "h200-2026-12-05/speed-tail2m.json"
TAIL_EDGE_FIT = "h100-2026-12-05/edge-fit-tail2m.json"
CUT_SPEED = "h100-2026-12-06/speed-cut25.json"
UNLIMITED_SPEED = ("h100-2026-12-05/speed-unlimited.json", "h100-2026-12-05/speed-unlimited-2.json")
# The same programs probed on the H200 just under and just over replay's smallest device (held by
# bench/tests/test_edge_fit.py).
EDGE_BRACKET = "h200-2026-12-04/edge-bracket.json"
MICRO = "micro-h200-2026-11-30-2003.json"
AB = "h200-2026-12-01-ab/ab.json"
LATENCY_GOAL = 1.1          # torch.empty + del under gmlake: at most this times native's time
ALLOCATORS = ("native", "expandable", "gmlake")


def training() -> str:
    """The training suite: peaks, utilization and tokens/s per workload and allocator."""
    runs, envs = _runs_by_key(TRAINING)
    lines = [("| workload | peak reserved GiB: native / expandable / gmlake | utilization: native / expandable / "
             "gmlake | gmlake tokens/s / expandable's (medians) | runs: native / expandable / gmlake |"),
             "|---|---|---|---|---|"]
    for workload in sorted({w for w, _ in runs}):
        got = {a: runs.get((workload, a), []) for a in ALLOCATORS}
        reserved = {a: max((r["max_memory_reserved"] for r in rs), default=None) for a, rs in got.items()}
        util = {a: min((r["max_memory_allocated"] / r["max_memory_reserved"] for r in rs), default=None)
                for a, rs in got.items()}
        speed = {a: statistics.median(r["tokens_per_s"] for r in rs) if rs else None for a, rs in got.items()}
        least = min(v for v in reserved.values() if v)
        gib = {a: "-" if v is None else (f"**{v / GiB:.2f}**" if v == least else f"{v / GiB:.2f}")
               for a, v in reserved.items()}
        ratio = (f"{speed['gmlake'] / speed['expandable']:.2f}" if speed["gmlake"] and speed["expandable"] else "-")
        lines.append(f"| {workload}{' (per rank, two GPUs)' if 'fsdp' in workload else ''} | "
                     + " / ".join(gib[a] for a in ALLOCATORS) + " | "
                     + " / ".join("-" if util[a] is None else f"{util[a]:.3f}" for a in ALLOCATORS)
                     + f" | {ratio} | " + " / ".join(str(len(got[a])) for a in ALLOCATORS) + " |")
    return "\n".join(lines) + "\n\n" + _env_line(envs) + "\n"


def dynamic() -> str:
    """The dynamic-shape speed suite: time against native, peaks and utilization, from its summary's rows."""
    data = _json(DYNAMIC)
    rows = {(r["workload"], r["allocator"]): r for r in data["rows"]}
    lines = [("| workload | step time / native's: expandable / gmlake (min-max over runs) | native's own spread | "
             "peak reserved GiB: native / expandable / gmlake | utilization: native / expandable / gmlake |"),
             "|---|---|---|---|---|"]
    for workload in dict.fromkeys(w for w, _ in rows):
        r = {a: rows.get((workload, a)) for a in ALLOCATORS}
        if not all(r.values()):
            continue

        time = {a: f"{x['vs_native']:.3f} ({x['vs_native_min']:.3f}-{x['vs_native_max']:.3f})" for a, x in r.items()}
        spread = r["native"]["spread_pct"]
        lines.append(f"| {workload} | {time['expandable']} / {time['gmlake']} | "
                     + (f"{spread:.1f} %" if r["native"]["runs"] > 1 else "one run") + " | "
                     + " / ".join(f"{r[a]['peak_reserved_gib']:.2f}" for a in ALLOCATORS) + " | "
                     + " / ".join(f"{r[a]['utilization']:.3f}" for a in ALLOCATORS) + " |")
    return "\n".join(lines) + "\n\n" + _env_line([data["environment"]]) + "\n"


def caps() -> str:
    """The cap search: per workload the largest cap that failed and the smallest that fit, per allocator."""
    latest, peaks, envs = _cap_search()
    lines = ["| workload | peak allocated GiB | expandable segments: failed / fit | gmlake: failed / fit | searched |",
             "|---|---|---|---|---|"]
    for workload in sorted({w for w, _ in latest}):
        cells = []
        for a in ("expandable", "gmlake"):
            got = latest.get((workload, a))
            cells.append("-" if got is None else f"{'-' if got[2] is None else f'{got[2]:.3f}'} / {got[1]:.3f}")
        dates = sorted({latest[k][0][:10] for k in latest if k[0] == workload})
        peak = f"{peaks[workload] / GiB:.2f}" if workload in peaks else "-"
        lines.append(f"| {workload} | {peak} | {cells[0]} | {cells[1]} | {', '.join(dates)} |")
    return "\n".join(lines) + "\n\n" + _env_line(envs) + "\n"


def _per_round(values: list, digits: str) -> str:
    """One figure when every round gave the same, else each round's (in round order) joined by ' / '."""
    return format(values[0], digits) if len(set(values)) == 1 else " / ".join(format(v, digits) for v in values)


def _gpu_outcome(run: dict) -> str:
    return "fit" if run["outcome"] == "fit" else f"{run['outcome']} at step {run['steps_done']}"


def _run_policy(run: dict) -> str:
    """The policy spec a GPU run ran under: its allocator with the knobs the record names."""
    knobs = run.get("knobs") or {}
    return run["allocator"] + (f"[{','.join(f'{k}={v}' for k, v in knobs.items())}]" if knobs else "")


def _replay_policy(policy: str) -> str:
    """The replay policy of a GPU run's: a bench candidate (gmlake-tail2m) is the --policy it starts gmlake with."""
    from bench.harness import CANDIDATES

    flags = CANDIDATES.get(policy, [])
    return flags[flags.index("--policy") + 1] if "--policy" in flags else policy


def edge_fit_rows(path: str = EDGE_FIT) -> list[dict]:
    """Per run of the edge-fit results: its workload, k, allocator, policy label, round, what the H200 did and what
    replay of the workload's calibration trace (its libraries' memory included) says on a device of the bytes the
    run had after its filler."""
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    data = _json(path)
    traces = {w: load(ROOT / trace) for w, trace in data["traces"].items()}
    rows = []
    for run in data["runs"]:
        policy = _run_policy(run)
        got = replay(traces[run["workload"]], _replay_policy(policy), device_memory=run["free_after_filler"],
                     samples=1)
        rows.append({"workload": run["workload"], "k": run["k"], "policy": policy, "round": run["round"],
                     "gpu": run["outcome"], "gpu_text": _gpu_outcome(run), "gpu_reserved": run["max_memory_reserved"],
                     "replay": got.failure_kind or "fit", "replay_reserved": got.peak_reserved})
    return rows


def edge_fit(path: str = EDGE_FIT) -> str:
    """The edge-fit table: per workload, k and policy, each round's outcome on the GPU beside replay's."""
    data = _json(path)
    cal = data["calibrations"]
    cells: dict[tuple, dict] = {}
    for row in edge_fit_rows(path):
        cell = cells.setdefault((row["workload"], row["k"], row["policy"]), {"replay": row["replay"]})
        cell[row["round"]] = row["gpu_text"]
    lines = ["| workload | P (GiB) | L (MiB) | k | allocator | round 0 | round 1 | replay says |",
             "|---|---|---|---|---|---|---|---|"]
    order = {w: i for i, w in enumerate(cal)}
    for (workload, k, policy), cell in sorted(cells.items(), key=lambda i: (order[i[0][0]], i[0][1], i[0][2])):
        c = cal[workload]
        lines.append(f"| {workload} | {c['P'] / GiB:.2f} | {c['L'] / MiB:.0f} | {k} | {policy} | "
                     f"{cell.get(0, 'not run')} | {cell.get(1, 'not run')} | {cell['replay']} |")
    return "\n".join(lines) + f"\n\n{data['machine']}, {data['date']}; {data['method']}.\n"


def edge_bracket_rows() -> list[dict]:
    """Per workload and allocator of the bracket results: replay's smallest device as k (over P, the libraries' L
    aside), the probes just under and over it on the H200 (k, what the run did, what replay says of its device)."""
    from gmlake.sim.cap import smallest_device_memory
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    fits = _json(EDGE_FIT)
    data = _json(EDGE_BRACKET)
    pairs: dict[tuple, dict] = {}
    for run in data["runs"]:
        w, a = run["workload"], _run_policy(run)
        if (w, a) not in pairs:
            cal = fits["calibrations"][w]
            trace = load(ROOT / fits["traces"][w])
            smallest = smallest_device_memory(trace, a, 2e-4)[0]
            pairs[(w, a)] = {"workload": w, "allocator": a, "replay_k": (smallest - cal["L"]) / cal["P"],
                             "trace": trace, "probes": []}
        got = replay(pairs[(w, a)]["trace"], a, device_memory=run["free_after_filler"], samples=1)
        pairs[(w, a)]["probes"].append({"k": run["k"], "gpu": run["outcome"], "replay": got.failure_kind or "fit"})
    for pair in pairs.values():
        del pair["trace"]
    return sorted(pairs.values(), key=lambda p: (p["workload"], p["allocator"]))


def edge_bracket() -> str:
    """The bracket table: replay's smallest device beside the H200's probes just under and over it."""
    data = _json(EDGE_BRACKET)
    lines = ["| workload | allocator | replay's smallest k | GPU under it | GPU over it | replay says there |",
             "|---|---|---|---|---|---|"]
    for pair in edge_bracket_rows():
        probes = sorted(pair["probes"], key=lambda p: p["k"])
        under, over = probes[0], probes[-1]
        lines.append(f"| {pair['workload']} | {pair['allocator']} | {pair['replay_k']:.4f} | "
                     f"{under['gpu']} at {under['k']} | {over['gpu']} at {over['k']} | "
                     f"{under['replay']}, {over['replay']} |")
    return "\n".join(lines) + f"\n\n{data['machine']}, {data['date']}; {data['method']}.\n"


# Half-lives (asks) the libraries' measured reserve is judged at, beside the fixed floor (0) and no decay at all
LIBRARIES_HALF_LIVES = (0, 8, 16, 32, 64, 1 << 40)


def edge_libraries_rows() -> list[dict]:
    """Per edge-fit workload: the libraries' reserve as the default policy measured it on the H200 (the first of its
    runs under the default, from edge-fit.json) and as replay of the calibration trace measures it on a device of
    the bytes that run had; and replay's smallest device (as k over P, the libraries' L aside) per half-life."""
    from gmlake.sim.cap import smallest_device_memory
    from gmlake.sim.replay import run_requests
    from gmlake.sim.trace import load

    data = _json(EDGE_FIT)
    rows = []
    for workload, path in data["traces"].items():
        trace, cal = load(ROOT / path), data["calibrations"][workload]
        gpu = next(r for r in data["runs"] if r["workload"] == workload and r.get("libraries") and not r.get("knobs"))
        alloc, _ = run_requests(trace, "gmlake", device_memory=gpu["free_after_filler"], samples=1)
        stats = alloc.stats()
        keys = ("libraries_largest_rise_bytes", "device_asks", "libraries_reserve_bytes")
        smallest = {h: (smallest_device_memory(trace, f"gmlake[libraries_half_life={h}]", 2e-4)[0] - cal["L"])
                    / cal["P"] for h in LIBRARIES_HALF_LIVES}
        rows.append({"workload": workload, "L": cal["L"], "k": gpu["k"], "gpu": {k: gpu["libraries"][k] for k in keys},
                     "replay": {k: stats[k] for k in keys}, "smallest_k": smallest})
    return rows


def edge_libraries() -> str:
    """The libraries' measured reserve: the H200's measure beside replay's, and what each half-life costs in fit."""
    data = _json(EDGE_FIT)
    rows = edge_libraries_rows()
    head = " / ".join("fixed" if h == 0 else "none" if h == LIBRARIES_HALF_LIVES[-1] else str(h)
                      for h in LIBRARIES_HALF_LIVES)
    lines = [("| workload | L (MiB) | largest rise MiB: GPU / replay | asks: GPU / replay | reserve at the end MiB: "
              f"GPU / replay | replay's smallest k by half-life: {head} |"), "|---|---|---|---|---|---|"]
    for row in rows:
        g, r = row["gpu"], row["replay"]
        lines.append(f"| {row['workload']} | {row['L'] / MiB:.0f} | {g['libraries_largest_rise_bytes'] / MiB:.0f} / "
                     f"{r['libraries_largest_rise_bytes'] / MiB:.0f} | {g['device_asks']} / {r['device_asks']} | "
                     f"{g['libraries_reserve_bytes'] / MiB:.0f} / {r['libraries_reserve_bytes'] / MiB:.0f} | "
                     + " / ".join(f"{row['smallest_k'][h]:.4f}" for h in LIBRARIES_HALF_LIVES) + " |")
    return "\n".join(lines) + (f"\n\n{data['machine']}, 2026-12-04; GPU: the default's first run per workload in "
                               f"python -m bench edge-fit (bench/edge_fit.py); replay: gmlake replay of the "
                               f"calibration trace on that run's device.\n")


def _edge_rows(rows: dict[str, dict[str, dict]]) -> tuple[dict[str, str], dict[str, str]]:
    """The edge table's rows by the name each shows, and each trace's row name: traces whose figures are the same
    (one workload captured under two allocators) share a row under their common name."""
    shown: dict[str, str] = {}
    names: dict[str, str] = {}
    for name, by in rows.items():
        g, e, p = by["gmlake"], by["expandable"], by["gmlake-paper"]
        peak = g["peak_allocated"]
        device, cap = (" / ".join(f"{r[limit] / peak:.4f}" for r in (g, e, p))
                       for limit in ("smallest_device", "smallest_cap"))
        cells = (f"{peak / GiB:.2f} | {device} | {cap} | "
                 f"{g['cap_1.05']['driver_seconds']:.3f} / {e['cap_1.05']['driver_seconds']:.3f} | "
                 f"{g['cap_unbinding']['driver_calls']:,} / {g['uncapped']['driver_calls']:,} | "
                 f"{g['utilization']:.3f} / {p['utilization']:.3f}")
        twin = next((other for other, c in shown.items() if c == cells), None)
        if twin is not None:           # the same workload under another allocator: one row, the common name
            common = twin
            while common and not name.startswith(common):
                common = common[:-1]
            common = common.rstrip("-") or twin
            shown[common] = shown.pop(twin)
            names.update({t: common for t, n in names.items() if n == twin})
            names[name] = common
            continue
        shown[name] = cells
        names[name] = name
    return shown, names


def edge() -> str:
    """At the edge of memory, by replay: per trace the smallest device and cap as multiples of the peak allocated P
    for the default, the expandable model and gmlake-paper, the priced driver time at a cap of 1.05x P, the driver
    calls of a cap that never binds, utilization; then how many traces meet each goal. Traces whose figures are the
    same (one workload captured under two allocators) share a row."""
    record = json.loads(EDGE.read_text())
    rows: dict[str, dict[str, dict]] = {}
    for r in record["rows"]:
        rows.setdefault(r["trace"], {})[r["policy"]] = r
    lines = [("| trace | P GiB | smallest device, x P: gmlake / expandable / paper | smallest cap, x P | "
              "priced driver s, cap 1.05x P: gmlake / expandable | calls, cap 2x P / none (gmlake) | "
              "utilization, none: gmlake / paper |"), "|---|---|---|---|---|---|---|"]
    shown, _ = _edge_rows(rows)
    lines += [f"| {name} | {cells} |" for name, cells in shown.items()]
    goals = record["goals"]
    met = {k: sum(g[k]["met"] for g in goals) for k in goals[0] if k != "trace"}
    words = {"smallest_device": "smallest device", "smallest_cap": "smallest cap",
             "cap_1.02": "speed at a cap of 1.02x P",
             "device_1.02": "at a device of 1.02x P", "cap_1.05": "at a cap of 1.05x P",
             "device_1.05": "at a device of 1.05x P", "unbinding": "a 2x cap costs nothing",
             "uncapped": "utilization 0.99 uncapped"}
    return ("\n".join(lines) + f"\n\nOf {len(goals)} traces, each goal met on: "
            + ", ".join(f"{words[k]} {n}" for k, n in met.items()) + ".\n")


def edge_missed() -> str:
    """The goals at the edge the default misses, per goal the traces and their figures (from the same record as the
    edge table); a workload's captures under several allocators that miss alike are one entry."""
    record = json.loads(EDGE.read_text())
    words = {"smallest_device": "The smallest device", "smallest_cap": "The smallest cap",
             "cap_1.02": "Speed at a cap of 1.02x P", "device_1.02": "Speed at a device of 1.02x P",
             "cap_1.05": "Speed at a cap of 1.05x P", "device_1.05": "Speed at a device of 1.05x P",
             "unbinding": "A 2x cap costing nothing", "uncapped": "Utilization 0.99 without a limit"}
    goals = record["goals"]
    rows: dict[str, dict[str, dict]] = {}
    for r in record["rows"]:
        rows.setdefault(r["trace"], {})[r["policy"]] = r
    _, names = _edge_rows(rows)

    def figure(key: str, got: dict) -> str:
        if key in ("smallest_device", "smallest_cap"):
            return f"{got['ratio']:.4f} P against {got['bound']:.4f}"
        if key == "uncapped":
            return f"{got['utilization']:.3f}"
        if key == "unbinding":
            return "not free"
        if got["oom"]:
            return "out of memory" + (", as the expandable model" if got["expandable_oom"] else "")
        return f"{got['ratio']:.2f}x the expandable model's driver time"

    lines = []
    for key, title in words.items():
        cells: dict[str, list[str]] = {}
        for g in goals:
            if not g[key]["met"]:
                row = cells.setdefault(figure(key, g[key]), [])
                if names[g["trace"]] not in row:
                    row.append(names[g["trace"]])
        if not cells:
            lines.append(f"- **{title}**: met on all {_n(len(goals))}.")
            continue
        missed = sum(not g[key]["met"] for g in goals)
        lines.append(_fill(f"- **{title}**: missed on {missed} of {len(goals)} traces: "
                           + "; ".join(f"{', '.join(shown)} ({cell})" for cell, shown in cells.items()) + ".",
                           115, "  "))
    return "\n".join(lines) + "\n"


def micro() -> str:
    """The micro benchmark: the core's cache hits (an A/B of the current core) and the driver's calls."""
    runs = _json(AB)
    hits = [r["ns"] for r in runs if r["kind"] == "micro" and r["side"] == "B"]
    lines = ["| case | ns per malloc+free (median of the runs, min-max) |", "|---|---|"]
    for case in hits[0]:
        values = [h[case] for h in hits]
        lines.append(f"| {case} | {statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f}) |")
    data = _json(MICRO)
    lines += ["", "| handle | create | reserve | map | set_access per handle | unmap per handle | release |",
              "|---|---|---|---|---|---|---|"]
    for size, row in data["driver_call_us"].items():
        lines.append(f"| {size} | " + " | ".join(f"{row[k]:.2f}" for k in (
            "create_chunk", "reserve", "map", "set_access_per_handle", "unmap_per_handle", "release_chunk")) + " |")
    env = data["environment"]
    return "\n".join(lines) + (f"\n\nCache hits: {len(hits)} runs pinned to one CPU (`scripts/gpu-ab.sh`, "
                               f"`{AB}`); driver calls (µs): `{MICRO}`. " + _env_line([env]) + "\n")


# `python -m bench ipc-price --out bench/results/<machine-date>/ipc-price.json`: the newest record of that name prices
# exportable chunks (Note [Exporting a chunk]) and decides the default (`decide`); while none exists the section says
# how to make one. `python -m bench ipc-price --price-table RECORD` writes its extras into replay's cost table.
IPC_PRICE = "ipc-price.json"
IPC_STEPS = "speed-ab-ipc.json"   # training steps without and with exportable chunks, beside the price
# Exportable / plain at most this, judged by the median over rounds, with the rounds' quartiles no further apart
# than IPC_SAME - 1: exportable chunks cost nothing to speak of there. A wider spread cannot decide.
IPC_SAME = 1.05
IPC_KINDS = ("plain", "exportable", "exported")
COST_TABLE = ROOT / "gmlake" / "sim" / "data" / "driver_costs_h200.json"
TABLE_SIZE = "2MiB"     # the cost table prices 2 MiB handles
TABLE_NOTE = ("µs each handle of an exportable chunk (created with the POSIX file descriptor handle type, as chunks "
              "are by default, Note [Exporting a chunk]) costs beyond per_handle's while it is not exported; replay "
              "adds them to every handle where the sim driver's chunks are exportable (SimDriver.exportable). "
              "Measured by `python -m bench ipc-price` on {gpu} (driver {nvidia_driver}), torch {torch}, {day}: "
              "{rounds} rounds of {calls} 2 MiB handles of each kind, the order alternating; the median over rounds "
              "of exportable less plain in the same round (per_handle_exportable_result; docs/benchmarks.md, "
              "\"Sharing CUDA tensors: exportable chunks\", shows all its prices, exported chunks' included, which "
              "replay does not use: it exports nothing). Measured on that GPU and added to per_handle's H200 prices.")


def ipc_price_record() -> str | None:
    """The newest `*/ipc-price.json` under bench/results (by the date its folder's name ends with), relative to it."""
    found = sorted(RESULTS.glob(f"*/{IPC_PRICE}"), key=lambda p: (re.sub(r"^.*?(\d{4}-\d\d-\d\d)", r"\1",
                                                                            p.parent.name), p.parent.name))
    return str(found[-1].relative_to(RESULTS)) if found else None


def _spread(values: list[float]) -> dict:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values)}


def ipc_summary(record: dict) -> dict:
    """From an ipc-price record's samples: per size, each kind's median µs per call, and against plain each round's
    ratio and extra µs (the ratio's median, quartiles and range over rounds; the extra's median); the step's median ms
    per kind (of the rounds' medians) and the rounds' ratios."""
    out: dict = {"per_handle": {}}
    for size, by_kind in record["per_handle"].items():
        plain = by_kind["plain"]
        pairs = {(k, c): list(zip(by_kind[k][c], plain[c])) for k in IPC_KINDS[1:] for c in plain}
        out["per_handle"][size] = {
            "median_us": {k: {c: statistics.median(v) for c, v in calls.items()} for k, calls in by_kind.items()},
            "ratio": {k: {c: _spread([a / b for a, b in pairs[k, c]]) for c in plain} for k in IPC_KINDS[1:]},
            "extra_us": {k: {c: statistics.median([a - b for a, b in pairs[k, c]]) for c in plain}
                         for k in IPC_KINDS[1:]},
            # a handle's whole life (create, map, set_access, unmap, release), round by round: the price growth
            # and release pay per handle, and the sum the default is judged on (a call of half a µs alone, map,
            # has a ratio that a tenth of a µs of noise moves past any threshold)
            "life_ratio": {k: _spread([sum(by_kind[k][c][r] for c in plain) / sum(plain[c][r] for c in plain)
                                       for r in range(len(plain[next(iter(plain))]))]) for k in IPC_KINDS[1:]}}
    steps = {k: [statistics.median(r) for r in rounds] for k, rounds in record["steps"]["samples_ms"].items()}
    out["steps"] = {"median_ms": {k: statistics.median(v) for k, v in steps.items()},
                    "ratio": _spread([e / p for e, p in zip(steps["exportable"], steps["plain"])])}
    return out


def judge(ratio: dict) -> str:
    """'free', 'dearer' or 'cannot decide' (the quartiles further apart than the threshold) for a ratio's spread."""
    if ratio["q3"] - ratio["q1"] > IPC_SAME - 1:
        return "cannot decide"
    return "free" if ratio["median"] <= IPC_SAME else "dearer"


def decide(record: dict) -> dict:
    """Whether chunks should be exportable by default, from an ipc-price record: only if a handle's whole life
    (creating, mapping, setting access to, unmapping and releasing it) exportable but not exported, at every size,
    and the grow-and-release step all judge 'free'. Each call's own ratio is shown beside them, not judged: a call
    of half a µs (map) moves past any threshold on a tenth of a µs of noise, while what growth pays is the sum.
    {"exportable": True, False, or None where the record cannot decide, "judged": {what: verdict}, "lacks": the
    fields an older record lacks}."""
    lacks = [key for key in ("per_handle", "steps") if key not in record]
    if lacks:
        return {"exportable": None, "judged": {}, "lacks": lacks}
    summary = ipc_summary(record)
    judged = {f"a handle's life ({size[:-3]} MiB)": judge(row["life_ratio"]["exportable"])
              for size, row in summary["per_handle"].items()}
    judged["grow-and-release step"] = judge(summary["steps"]["ratio"])
    verdicts = set(judged.values())
    return {"exportable": None if "cannot decide" in verdicts else verdicts == {"free"}, "judged": judged, "lacks": []}


def table_extra(record: dict) -> dict:
    """The cost table's per_handle_exportable_extra from a record: the extra µs per 2 MiB exportable handle, per
    call, rounded as the table keeps it."""
    extra = ipc_summary(record)["per_handle"][TABLE_SIZE]["extra_us"]["exportable"]
    return {call: round(us, 3) for call, us in extra.items()}


def write_table(record: Path, table: Path | None = None) -> dict:
    """Put `record`'s table_extra into the cost table at `table` (default COST_TABLE), with a note saying where it
    came from and the record's name (relative to bench/results) in per_handle_exportable_result. Returns the extras;
    ValueError for a record without per-handle prices."""
    data = json.loads(record.read_text())
    if "per_handle" not in data:
        raise ValueError(f"{record} has no per-handle prices (a record from before they were measured)")
    env, table = data.get("environment", {}), table or COST_TABLE
    costs, extra = json.loads(table.read_text()), table_extra(data)
    note = TABLE_NOTE.format(day=env.get("date", "?")[:10],
                             **{k: env.get(k, "?") for k in ("gpu", "nvidia_driver", "torch", "rounds", "calls")})
    name = str(record.resolve().relative_to(RESULTS)) if record.resolve().is_relative_to(RESULTS) else str(record)
    out: dict = {}
    for key, value in costs.items():
        if not key.startswith("per_handle_exportable_"):
            out[key] = value
        if key == "per_handle":
            out.update(per_handle_exportable_extra=extra, per_handle_exportable_note=note,
                       per_handle_exportable_result=name)
    table.write_text(json.dumps(out, indent=2) + "\n")
    return extra


def _ratio(r: dict) -> str:
    return f"{r['median']:.3f} ({r['q1']:.3f}-{r['q3']:.3f})"


def ipc_replay_price() -> str:
    """What replay adds per handle of an exportable chunk, from the cost table, and where the table has it from."""
    costs = driver_costs()
    extra = ", ".join(f"{call} {us:+g}" for call, us in costs["per_handle_exportable_extra"].items())
    source = costs.get("per_handle_exportable_result")
    return (f"Replay prices each handle of an exportable chunk at the cost table's per-handle price plus ({extra}) µs "
            + (f"(`{source}`)." if source else "(provisional: a raw measurement on an H100 that the table's note "
               "describes, until a record with per-handle prices is written into it with `python -m bench ipc-price "
               "--price-table RECORD`)."))


def ipc_price(record: str | None = None) -> str:
    """What exportable chunks cost, from `bench ipc-price`'s newest record (or `record`), and the default."""
    record = record or ipc_price_record()
    if record is None:
        return (f"Not measured yet: `python -m bench ipc-price --out bench/results/<machine-date>/{IPC_PRICE}` on a "
                f"GPU measures it. Chunks are {_ipc_default()}. " + ipc_replay_price() + "\n")
    return ipc_section(_json(record), f"bench/results/{record}") + ipc_training_steps(record)


def _ipc_default() -> str:
    from gmlake.drivers._cuda_driver import EXPORTABLE_DEFAULT

    return ("exportable by default (`GMLAKE_IPC=0` turns it off)" if EXPORTABLE_DEFAULT
            else "not exportable unless `GMLAKE_IPC=1`")


def ipc_section(data: dict, name: str) -> str:
    """The section for one ipc-price record, `data`, called `name`: each VMM call per handle for plain, exportable
    and exported chunks, the grow-and-release step, the default that follows (`decide`), and what replay prices. An
    older record is named with the fields it lacks."""
    default, same, env, decision = _ipc_default(), f"{(IPC_SAME - 1) * 100:.0f} %", data["environment"], decide(data)
    if decision["lacks"]:
        sizes = [k for k in data if k.endswith("MiB") and "create_ratio" in data[k]]
        ratios = _and([f"{data[k]['create_ratio']:.3f} at {k[:-3]} MiB" for k in sizes]) if sizes else ""
        return (f"The newest record, `{name}`, lacks {_and([f'`{k}`' for k in decision['lacks']])}: it predates the "
                "per-handle prices and the sampled step, so it cannot decide the default"
                + (f" (it found cuMemCreate exportable / plain {ratios}, the other calls unmeasured)" if ratios
                   else "") + f". Chunks are {default}. `python -m bench ipc-price --out "
                f"bench/results/<machine-date>/{IPC_PRICE}` on a GPU makes a record that decides. "
                + ipc_replay_price() + " " + _env_line([env]) + "\n")
    summary = ipc_summary(data)
    rows = [("| chunk | call | plain (µs) | exportable (µs) | exportable / plain (q1-q3) | judged | exported (µs) | "
             "exported / plain (q1-q3) |"), "|---|---|---|---|---|---|---|---|"]
    for size, row in summary["per_handle"].items():
        med, ratio = row["median_us"], row["ratio"]
        for call in med["plain"]:
            rows.append(f"| {size[:-3]} MiB | {call} | {med['plain'][call]:.2f} | {med['exportable'][call]:.2f} | "
                        f"{_ratio(ratio['exportable'][call])} | | "
                        f"{med['exported'][call]:.2f} | {_ratio(ratio['exported'][call])} |")
        life, life_key = row["life_ratio"], f"a handle's life ({size[:-3]} MiB)"
        rows.append(f"| {size[:-3]} MiB | a handle's life | {sum(med['plain'].values()):.2f} | "
                    f"{sum(med['exportable'][c] for c in med['plain']):.2f} | {_ratio(life['exportable'])} | "
                    f"{decision['judged'][life_key]} | "
                    f"{sum(med['exported'][c] for c in med['plain']):.2f} | {_ratio(life['exported'])} |")
        rows.append(f"| {size[:-3]} MiB | export | | | | | {med['exported']['export']:.0f} | |")
    steps = summary["steps"]
    step = (f"An allocator's grow-and-release step (every request maps new chunks), {env.get('steps', '?')} of each "
            f"kind per round, interleaved, before any chunk is exported: {steps['median_ms']['plain']:.3f} ms plain, "
            f"{steps['median_ms']['exportable']:.3f} ms exportable, exportable / plain {_ratio(steps['ratio'])}, "
            f"range {steps['ratio']['min']:.3f}-{steps['ratio']['max']:.3f}: "
            f"{decision['judged']['grow-and-release step']}.")
    named = {v: [w for w, x in decision["judged"].items() if x == v] for v in ("dearer", "cannot decide")}
    dearer = [call for call in next(iter(summary["per_handle"].values()))["ratio"]["exported"]
              if any(row["ratio"]["exported"][call]["median"] > IPC_SAME for row in summary["per_handle"].values())]
    exported = (f"An exported chunk (a shared one) costs more than {same} over plain at {_and(dearer)}." if dearer
                else f"An exported chunk (a shared one) costs within {same} of plain at every call.")
    if decision["exportable"]:
        verdict = (f"A handle's whole life (creating, mapping, setting access to, unmapping and releasing it) "
                   f"exportable but not exported, and the step, are each within {same} of plain, their quartiles no "
                   f"further apart: free, so the default is exportable; chunks are {default}.")
    elif decision["exportable"] is False:
        verdict = (f"{_and(named['dearer'])} cost more than {same} over plain, so the default is not exportable; "
                   f"chunks are {default}.")
    else:
        verdict = (f"{_and(named['cannot decide'])} cannot decide (their quartiles further apart than {same} of "
                   f"plain), so the record does not decide the default; chunks are {default}.")
    return ("\n".join(rows) + f"\n\nµs per handle, medians of {env.get('rounds', '?')} rounds of "
            f"{env.get('calls', '?')} chunks of each kind (the order alternating); a ratio is the median over rounds "
            f"of the round's own, with its quartiles, judged free within {same}. {step} `{name}`. "
            + verdict + f" {exported} The export is paid once per shared chunk, when a tensor on it is first shared. "
            + ipc_replay_price() + " " + _env_line([env]) + "\n")


def ipc_training_steps(record: str) -> str:
    """Training steps with chunks not exportable (gmlake-noipc, the baseline) against the default, from the speed-ab
    record beside the ipc-price one, where there is one."""
    beside = str(Path(record).parent / IPC_STEPS)
    if not (RESULTS / beside).exists():
        return ""
    return ("\nWarm training steps, `gmlake-noipc` (chunks not exportable) as the baseline against the default, "
            "interleaved (`python -m bench speed-ab`, \"Speed to 2 %\"):\n\n" + markdown_table(_json(beside)) + "\n")


def sync_price() -> str:
    """The price replay puts on a synchronize: the driver cost table's, with the GPU measurement it came from."""
    costs = driver_costs()
    price, source = costs["per_call"]["synchronize"], costs.get("synchronize_result")
    if not source:
        return (f"Replay prices each synchronize at **{price:g} µs**, a placeholder not yet measured "
                "(`python -m bench sync-price` measures it).\n")
    data = _json(source)
    cells = " | ".join(f"{data[k]['median']:.1f} ({data[k]['p10']:.1f}-{data[k]['p90']:.1f})"
                       for k in ("idle_us", "queued_us", "loaded_us"))
    return ("| idle | after 8 short kernels | step time in a training-like loop | replay's price |\n|---|---|---|---|\n"
            f"| {cells} | {price:g} |\n\nµs, median (p10-p90), `{source}`. " + _env_line([data["environment"]]) + "\n")


def latency() -> str:
    """torch.empty + del through the whole PyTorch stack, the current core against native, from the same A/B."""
    runs = [r for r in _json(AB) if r["kind"] == "latency" and r["side"] in ("native", "B")]
    lines = ["| size | native µs (median, min-max) | gmlake µs (median, min-max) | gmlake / native (medians) |",
             "|---|---|---|---|"]
    for size in [k for k in runs[0]["us"] if k != "probe_us"]:   # probe_us: the host's load, not a size
        side = {s: [r["us"][size] for r in runs if r["side"] == s] for s in ("native", "B")}
        med = {s: statistics.median(v) for s, v in side.items()}
        lines.append(f"| {size} | {med['native']:.2f} ({min(side['native']):.2f}-{max(side['native']):.2f}) | "
                     f"{med['B']:.2f} ({min(side['B']):.2f}-{max(side['B']):.2f}) | {med['B'] / med['native']:.2f} |")
    count = len([r for r in runs if r["side"] == "B"])
    worst = {size: max(r["us"][size] for r in runs if r["side"] == "B")
             / min(r["us"][size] for r in runs if r["side"] == "native") for size in runs[0]["us"] if size != "probe_us"}
    met = [s for s, w in worst.items() if w <= LATENCY_GOAL]
    return "\n".join(lines) + "\n\n" + _fill(
        f"{count} rounds, native and gmlake alternated, every run pinned to one CPU (`bench/results/{AB}`). "
        f"Judged by the runs' extremes (gmlake's slowest over native's fastest), the goal of {LATENCY_GOAL}x is met at "
        f"{_and(met) if met else 'no size'}" + "".join(f"; not resolved at {s}, where the runs allow up to {w:.2f}x"
                                                      for s, w in worst.items() if s not in met) + ".", 115) + "\n"


# CUDA graphs: a small transformer under torch.compile, each mode and allocator in its own file of interleaved runs
# (`tests/gpu_scripts/reduce_overhead.py`), and that program's trace, captured under native, replayed.
GRAPHS = "graphs-2026-11-30b"
GRAPH_MODES = ("default", "reduce-overhead")


def _graph_runs() -> dict[tuple[str, str], list[dict]]:
    """Per (torch.compile mode, allocator) the runs, in the order they ran."""
    return {(mode, a): [json.loads(line) for line in (RESULTS / GRAPHS / f"compile-{a}-{mode}.json").read_text()
                        .splitlines() if line.strip()]
            for mode in GRAPH_MODES for a in ("native", "gmlake")}


def _graph_replays() -> dict[str, dict]:
    """The captured trace's replay, per policy."""
    rows = [json.loads(line) for line in (RESULTS / GRAPHS / "replay-graphs.jsonl").read_text().splitlines()
            if line.strip()]
    return {r["policy"]: r for r in rows}


def _sci(x: float) -> str:
    """A small relative difference as the docs write it: 1.9e-6."""
    return re.sub(r"e-0*", "e-", f"{x:.1e}")


def _loss_gap(mode: str, runs: dict[tuple[str, str], list[dict]]) -> float:
    """The largest relative difference of a gmlake run's losses from those of native's run in the same place of the
    interleaving."""
    return max(abs(a - b) / abs(b) for ours, theirs in zip(runs[(mode, "gmlake")], runs[(mode, "native")])
               for a, b in zip(ours["losses"], theirs["losses"]))


def _graph_time_inside(mode: str, runs: dict[tuple[str, str], list[dict]]) -> bool:
    """gmlake's mean timed seconds against native's lie within the larger of the two allocators' spreads."""
    times = {a: [r["timed_s"] for r in runs[(mode, a)]] for a in ("native", "gmlake")}
    ratio = statistics.mean(times["gmlake"]) / statistics.mean(times["native"])
    return abs(ratio - 1) <= max(max(t) / min(t) - 1 for t in times.values())


def graphs() -> str:
    """docs/benchmarks.md, "CUDA graphs": peaks, timed seconds and graph replays per mode and allocator, the losses
    against native's, and the captured trace replayed."""
    runs = _graph_runs()
    lines = [("| torch.compile mode | allocator | peak reserved GiB | peak allocated GiB | timed s (runs in order) | "
              "graph replays |"), "|---|---|---|---|---|---|"]
    for mode in GRAPH_MODES:
        least = min(max(r["max_memory_reserved"] for r in runs[(mode, a)]) for a in ("native", "gmlake"))
        for a in ("native", "gmlake"):
            mine = runs[(mode, a)]
            reserved = max(r["max_memory_reserved"] for r in mine)
            cell = f"{reserved / GiB:.3f}"
            lines.append(f"| {mode} | {a} | {f'**{cell}**' if reserved == least else cell} | "
                         f"{max(r['max_memory_allocated'] for r in mine) / GiB:.3f} | "
                         + ", ".join(f"{r['timed_s']:.3f}" for r in mine) + " | "
                         + _per_round([r["graph_replays"] for r in mine], "d") + " |")
    steps = {len(r["losses"]) for rs in runs.values() for r in rs}
    count = {len(rs) for rs in runs.values()}
    inside = [_graph_time_inside(m, runs) for m in GRAPH_MODES]
    replays = _graph_replays()
    caching = replays["caching"]
    text = (f"{' or '.join(map(str, sorted(steps)))} steps, {' or '.join(_n(c) for c in sorted(count))} interleaved "
            f"runs per mode and allocator (`bench/results/{GRAPHS}/`). Losses match those of native's run in the same "
            f"place to {_sci(_loss_gap('reduce-overhead', runs))} (relative) with CUDA graphs and "
            f"{_sci(_loss_gap('default', runs))} without; gmlake's timed seconds against native's lie "
            + ("inside the runs' spread in both modes." if all(inside) else
               "outside the runs' spread in " + " and ".join(m for m, i in zip(GRAPH_MODES, inside) if not i) + ".")
            + f" The same program's trace, captured under native in a run of its own ({caching['events']:,} events), "
            f"replays to {caching['peak_reserved'] / GiB:.3f} GiB reserved under the caching model and "
            f"{replays['gmlake']['peak_reserved'] / GiB:.3f} under the default (`replay-graphs.jsonl`).")
    return "\n".join(lines) + "\n\n" + _fill(text, 115) + "\n"


def replayed() -> str:
    """The bundled traces replayed under every built-in policy (computed here: replay is deterministic)."""
    from gmlake import policies
    from gmlake.sim.replay import bundled_traces, replay
    from gmlake.sim.trace import load

    names = policies.names()
    lines = ["| trace | captured: max reserved GiB | " + " | ".join(f"{n}: reserved GiB / utilization / driver s"
                                                              for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for path in bundled_traces():
        trace = load(path)
        real = trace.meta.get("max_memory_reserved")
        cells = []
        for name in names:
            r = replay(trace, name)
            cells.append(f"{r.peak_reserved / GiB:.2f} / {r.utilization:.3f} / {r.driver_seconds:.3f}")
        lines.append(f"| {trace.name} | {real / GiB:.2f} | " if real else f"| {trace.name} | - | ")
        lines[-1] += " | ".join(cells) + " |"
    return "\n".join(lines) + "\n"


def fidelity() -> str:
    """docs/benchmarks.md, "Replay on CPU": each bundled trace replayed through the policy that models the allocator
    it was captured under, against the run's own peak reserved, and replay's goal (gmlake.sim.replay.FIDELITY)."""
    from gmlake.sim.replay import FIDELITY, bundled_traces, replay
    from gmlake.sim.trace import load

    off = []
    for path in bundled_traces():
        trace = load(path)
        policy, _ = FIDELITY[trace.meta["allocator"]]
        real = trace.meta["max_memory_reserved"]
        got = replay(trace, policy).peak_reserved
        if got != real:
            off.append(f"{trace.name} ({100 * (got / real - 1):+.2f} %)")
    goal = " and ".join(f"{100 * tol:g} % for {allocator}" for allocator, (_, tol) in FIDELITY.items())
    return _fill("**Fidelity**: replayed through the policy that models the allocator it was captured under, "
                 + ("each bundled trace gives the run's real `max_memory_reserved` to the byte"
                    + (f", but {', '.join(off)}" if off else ""))
                 + f" (`tests/test_replay.py`; goal {goal}).", 115) + "\n"


# GPU fidelity: records `*/fidelity-<program>.json`, each a program run on the GPU under gmlake and under expandable
# segments with a snapshot, and both snapshots replayed under both policies (their commands are in the record).
FIDELITY_RECORDS = "*/fidelity-*.json"


def gpu_fidelity() -> str:
    """Each GPU fidelity record: the runs' max_memory_reserved beside replay's peak for every snapshot and policy."""
    lines = ["| program | allocator | GPU reserved GiB | replayed from its own snapshot | from the other's | machine, date |",
             "|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob(FIDELITY_RECORDS)):
        record = _json(str(path.relative_to(RESULTS)))
        program = path.stem.removeprefix("fidelity-")
        gpu_name = record["machine"].split(",")[0]
        for allocator, run in record["gpu"].items():
            real = run["max_memory_reserved"]
            mine = [r for r in record["replay"] if r["policy"] == allocator]
            own = [r for r in mine if r["trace"].endswith(f"-{allocator}")]
            other = [r for r in mine if r not in own]

            def off(rows: list[dict], real: int = real) -> str:
                return " / ".join("exact" if r["peak_reserved"] == real
                                  else f"{100 * (r['peak_reserved'] / real - 1):+.2f} %" for r in rows) or "-"
            lines.append(f"| {program} | {allocator} | {real / GiB:.3f} | {off(own)} | {off(other)} | "
                         f"{gpu_name}, {record['date']} (`{path.relative_to(RESULTS)}`) |")
    return "\n".join(lines) + "\n"


RESTITCH_SNAPSHOT = "h100-2026-12-07/fidelity-sage-gmlake.pickle.gz"   # the GNN-like program's, under the old limit


def restitch_share() -> str:
    """The GNN-like program's GPU snapshot replayed with the restitch limit on every request and as the default
    spares large ones, beside expandable segments and the paper design (Note [Stitching a size again])."""
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    trace = load(str(RESULTS / RESTITCH_SNAPSHOT))
    lines = ["| policy | reserved GiB | utilization | stitches | driver calls |", "|---|---|---|---|---|"]
    for policy in ("gmlake[restitch_share=0]", "gmlake", "expandable", "gmlake-paper"):
        r = replay(trace, policy)
        lines.append(f"| `{policy}` | {r.peak_reserved / GiB:.2f} | {r.utilization:.3f} | {r.stats['stitches']} | "
                     f"{sum(r.stats['calls'].values())} |")
    return "\n".join(lines) + "\n"


# A change to the core checked against the core before it: the newest records of these names under bench/results.
CORE_CHANGE_REPLAY = "replay-speed-refactor.txt"      # replay's events/s per trace and policy, old and new core
CORE_CHANGE_STEPS = "speed-ab-refactor-*.json"        # GPU warm steps, the old core as baseline, interleaved


def _newest(pattern: str) -> list[Path]:
    """The files matching `pattern` in the newest folder (by the date its name ends with) that has any."""
    found = sorted(RESULTS.glob(f"*/{pattern}"), key=lambda p: re.sub(r"^.*?(\d{4}-\d\d-\d\d)", r"\1", p.parent.name))
    return [p for p in found if found and p.parent == found[-1].parent]


def core_change() -> str:
    """The last change to the core's structure, checked against the core before it: replay's speed and GPU steps."""
    parts = []
    for path in _newest(CORE_CHANGE_REPLAY):
        text = path.read_text().splitlines()
        mean = next((line for line in text if line.startswith("geometric mean")), "")
        parts.append(f"Replay speed, {text[0].split(' (')[0]}: {mean} (`{path.relative_to(RESULTS)}`).")
    for path in _newest(CORE_CHANGE_STEPS):
        parts.append("\n" + markdown_table(_json(str(path.relative_to(RESULTS)))))
    return "\n".join(parts) + "\n"


# The default against both references on the GPU, without a limit and at a device of 1.02x P: the newest records.
GPU_GOALS_STEPS = "speed-ab-goals-*.json"        # interleaved warm steps: expandable (baseline), default, paper
GPU_GOALS_EDGE = "edge-fit.json"                 # edge-fit at 1.02x P, the same three, beside replay
# Programs no setting was chosen on (bench/plan_goals.py's validation set holds their traces); the rest are tuned on.
VALIDATION_PROGRAMS = ("rl", "sage", "moe")


def gpu_goals() -> str:
    """Per program of the newest goal records: peak reserved of expandable segments, the paper design and the
    default, the default's excess over the better of the two, its warm step time against expandable's with the
    spread, its driver calls per warm step and the verdict; then the edge-fit runs at 1.02x P beside replay."""
    header = ("| program | set | reserved GiB: expandable / paper / default | excess over the better | "
              "default's step vs expandable (ratio spread) | driver calls per warm step: default / paper | verdict |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    notes, edge = [], ""
    for path in _newest(GPU_GOALS_STEPS):
        record = _json(str(path.relative_to(RESULTS)))
        rows = {(r["workload"], r["allocator"]): r for r in record["rows"]}
        for workload in dict.fromkeys(r["workload"] for r in record["rows"]):
            exp, paper, mine = (rows[(workload, a)] for a in ("expandable", "gmlake-paper", "gmlake"))
            better = min(exp["peak_reserved_gib"], paper["peak_reserved_gib"])
            lines.append(
                f"| {workload} | {'validation' if workload in VALIDATION_PROGRAMS else 'tuning'} | "
                f"{exp['peak_reserved_gib']:.2f} / {paper['peak_reserved_gib']:.2f} / {mine['peak_reserved_gib']:.2f} | "
                f"{100 * (mine['peak_reserved_gib'] / better - 1):+.1f} % | "
                f"{mine['ratio']:.3f}x ({mine['ratio_spread_pct']:.1f} %) | "
                f"{mine['driver_calls_per_warm_step']:.1f} / {paper['driver_calls_per_warm_step']:.1f} | "
                f"{mine['verdict']} |")
        env = record["environment"]
        notes.append(f"{env['gpu']} (driver {env['nvidia_driver']}), torch {env['torch']}, Python {env['python']}, "
                     f"{env['date'][:10]}: `{env['command'].split('__main__.py ')[-1]}` (`{path.relative_to(RESULTS)}`)")
    for path in _newest(GPU_GOALS_EDGE)[:1]:
        edge = "\n" + edge_fit(str(path.relative_to(RESULTS)))
    return "\n".join(lines) + "\n\n" + ";\n".join(notes) + ".\n" + edge


# The handle-size table: gmlake-paper's chunk_size over the bundled workloads (one capture each: both make the same
# requests).
HANDLE_TRACES = ["gpt2l-lora-ckpt-native", "opt1.3b-lora-native", "opt350m-full-ckpt-native"]
HANDLE_SIZES = [2, 4, 8, 20]


def handle_size() -> str:
    """gmlake-paper with handles of each size: utilization and priced driver time per bundled workload."""
    from gmlake.policies import PaperPolicy
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    default = PaperPolicy().chunk_size // MiB
    lines = ["| workload | " + " | ".join(f"{m} MiB handles" + (" (its default)" if m == default else "")
                                          for m in HANDLE_SIZES) + " |", "|---" * (len(HANDLE_SIZES) + 1) + "|"]
    for name in HANDLE_TRACES:
        trace = load(name)
        cells = []
        for m in HANDLE_SIZES:
            r = replay(trace, f"gmlake-paper[chunk_size={m}MiB]")
            cells.append(f"{r.utilization:.3f} / {r.driver_seconds:.2f} s")
        lines.append(f"| {name.removesuffix('-native')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(png: Path) -> None:
    """The training suite as a picture: utilization, peak reserved and median step time against native's, per
    workload and allocator (the README's figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, _ = _runs_by_key(TRAINING)
    workloads = sorted({w for w, _ in runs})
    colors = {"native": "tab:red", "expandable": "tab:blue", "gmlake": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.6))
    width = 0.27
    for i, a in enumerate(ALLOCATORS):
        xs = [k + (i - 1) * width for k in range(len(workloads))]
        got = [runs.get((w, a), []) for w in workloads]
        native = [statistics.median(r["median_step_s"] for r in runs.get((w, "native"), [])) for w in workloads]
        axes[0].bar(xs, [min(r["max_memory_allocated"] / r["max_memory_reserved"] for r in rs) for rs in got],
                    width, color=colors[a], label=a)
        axes[1].bar(xs, [max(r["max_memory_reserved"] for r in rs) / GiB for rs in got], width, color=colors[a])
        axes[2].bar(xs, [statistics.median(r["median_step_s"] for r in rs) / n for rs, n in zip(got, native)], width,
                    color=colors[a])
    titles = ("utilization (peak allocated / peak reserved)", "peak reserved, GiB",
              "median step time / native's (inside the runs' noise)")
    for ax, title in zip(axes, titles):
        ax.set_xticks(range(len(workloads)), workloads, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[0].set_ylim(0, 1.05)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(png, dpi=100)
    plt.close(fig)
# Fixed probes that settled caps a bisection left tied (`python -m bench cap probe`).
CAP_PROBES = ["train/cap-probe-2026-12-01/cap-probe.json"]


def _peaks() -> tuple[dict[str, dict[str, tuple[int, float]]], set[str], list[dict]]:
    """Per workload of the training and speed suites, per allocator: (peak reserved bytes, utilization), as the
    benchmark tables give them; the speed suite's workloads; the runs' environments."""
    runs, envs = _runs_by_key(TRAINING)
    peaks: dict[str, dict[str, tuple[int, float]]] = {}
    for (workload, allocator), rs in runs.items():
        peaks.setdefault(workload, {})[allocator] = (
            max(r["max_memory_reserved"] for r in rs),
            min(r["max_memory_allocated"] / r["max_memory_reserved"] for r in rs))
    data = _json(DYNAMIC)
    envs.append(data["environment"])
    dynamic = set()
    for r in data["rows"]:
        dynamic.add(r["workload"])
        peaks.setdefault(r["workload"], {})[r["allocator"]] = (round(r["peak_reserved_gib"] * GiB), r["utilization"])
    return peaks, dynamic, envs


def _cap_search() -> tuple[dict[tuple[str, str], tuple[str, float, float | None]], dict[str, int], list[dict]]:
    """The cap searches: per (workload, allocator) the latest finished search's (date, smallest fit GiB, largest
    failure GiB or None); per workload its peak allocated; the searches' environments."""
    latest: dict[tuple[str, str], tuple[str, float, float | None]] = {}
    peaks: dict[str, int] = {}
    envs = []
    for folder in CAPS:
        record = _json(f"{folder}/cap.json")
        envs.append(record["environment"])
        total = record["device_total_memory"]
        for pair in record["pairs"]:
            if pair.get("status") != "done" or not pair.get("smallest_fit"):
                continue
            date = record["environment"]["date"]
            key = (pair["workload"], pair["allocator"])
            if key not in latest or latest[key][0] <= date:
                fail = pair.get("largest_fail")
                latest[key] = (date, pair["smallest_fit"] * total / GiB, fail * total / GiB if fail else None)
            reference = pair.get("reference") or {}
            if reference.get("max_memory_allocated"):
                peaks[pair["workload"]] = reference["max_memory_allocated"]
    return latest, peaks, envs


def _cap_brackets() -> dict[str, dict[str, tuple[float | None, float]]]:
    """Per workload and allocator (expandable, gmlake): the largest cap that failed and the smallest that fit (GiB),
    from the searches and the fixed probes together."""
    latest, _, _ = _cap_search()
    out: dict[str, dict[str, tuple[float | None, float]]] = {}
    for (workload, allocator), (_, fit, fail) in latest.items():
        out.setdefault(workload, {})[allocator] = (fail, fit)
    for relative in CAP_PROBES:
        for p in _json(relative)["probes"]:
            if not isinstance(p.get("fit"), bool) or p["allocator"] not in out.get(p["workload"], {}):
                continue
            fail, fit = out[p["workload"]][p["allocator"]]
            cap = p["cap_bytes"] / GiB
            if p["fit"]:
                fit = min(fit, cap)
            else:
                fail = cap if fail is None else max(fail, cap)
            out[p["workload"]][p["allocator"]] = (fail, fit)
    return out


def _cap_won(brackets: dict[str, tuple[float | None, float]]) -> bool:
    """gmlake fit at a cap where expandable segments ran out of memory."""
    fail = brackets["expandable"][0]
    return fail is not None and brackets["gmlake"][1] < fail


def _memory_text(peaks: dict, dynamic: set[str]) -> str:
    """How much less gmlake reserved than expandable segments (and native) on the suites' workloads."""
    llm = {w: p for w, p in peaks.items() if w not in dynamic and "fsdp" not in w}
    saved = [_less(p["gmlake"][0], p["expandable"][0]) for p in llm.values()]
    won = [s for s in saved if s > 0]
    native = [_less(p["gmlake"][0], p["native"][0]) for p in llm.values()]
    fsdp = [_less(p["gmlake"][0], p["expandable"][0]) for w, p in peaks.items() if "fsdp" in w]
    text = (f"- **Memory**, against expandable segments: {_pct(won)} % less reserved on {_of(len(won), len(llm))} "
            f"single-GPU LLM workloads ({_pct(native)} % less than native)"
            + "".join(f", equal on {w}" for w, s in zip(llm, saved) if s == 0)
            + f", {_pct(fsdp)} % less per rank under FSDP")
    if not dynamic:
        return text + "."
    dyn = [_less(peaks[w]["gmlake"][0], peaks[w]["expandable"][0]) for w in dynamic]
    return text + (f", {_pct(dyn)} % less on the {_n(len(dynamic))} programs whose shapes change every step "
                   f"(expandable segments reach {_span([peaks[w]['expandable'][1] for w in dynamic], 3)} there).")


def _cap_wins() -> tuple[dict, dict, list[float]]:
    """The single-GPU workloads both allocators were searched on, those where gmlake fit at a cap expandable
    segments failed at, and by how much of that cap (%)."""
    single = {w: b for w, b in _cap_brackets().items() if "fsdp" not in w and {"expandable", "gmlake"} <= set(b)}
    wins = {w: b for w, b in single.items() if _cap_won(b)}
    return single, wins, [100 * (1 - b["gmlake"][1] / b["expandable"][0]) for b in wins.values()]


# ------------------------------------------------------------------ docs/benchmarks.md: the prose's figures

LONG = ["train/long-2026-12-01a/speed/summary.json", "train/long-2026-12-01b/speed/summary.json",
        "train/long-2026-12-01c/speed/summary.json"]
# `gmlake tune --fit` on the bundled traces (its --json), and the real run of its recommendation: (trace, folder).
TUNE_GPU = [("opt350m", "h200-2026-12-02"), ("gpt2l", "h200-2026-12-02")]


def _machine(folder: str) -> str:
    """A folder's machine.txt (date; GPU index, name, driver, memory; python and torch) as the env line writes it."""
    lines = (RESULTS / folder / "machine.txt").read_text().splitlines()
    gpu, torch = [s.strip() for s in lines[1].split(",")], lines[2].split()
    return f"{gpu[1]} (driver {gpu[2]}), torch {torch[3]}, Python {torch[1]}, {lines[0][:10]}"


def versions() -> str:
    """The benchmark doc's opening line on the machines: every GPU record's GPU, driver, torch and dates."""
    envs = _runs_by_key(TRAINING)[1] + _cap_search()[2] + [_json(DYNAMIC)["environment"], _json(MICRO)["environment"]]
    dates = sorted(e["date"][:10] for e in envs)
    return _fill(f"All GPU figures come from {_and(sorted({e['gpu'] for e in envs}))} (driver "
                 f"{_and(sorted({e['nvidia_driver'] for e in envs}))}) with torch {_and(sorted({e['torch'] for e in envs}))}"
                 f", measured {dates[0]} to {max(dates[-1], _json(EDGE_FIT)['date'][:10])}, on shared cloud machines "
                 "whose run-to-run noise is large (see \"Speed\"); each table names its records. CPU figures are from "
                 "a 2-core virtual machine.", 115) + "\n"


def training_notes() -> str:
    """The training suite's findings: memory and utilization from its records."""
    peaks, _, _ = _peaks()
    train = {w: p for w, p in peaks.items() if w in {w for w, _ in _runs_by_key(TRAINING)[0]}}
    least = sum(p["gmlake"][0] == min(v[0] for v in p.values()) for p in train.values())
    util = [p["gmlake"][1] for p in train.values()]
    ckpt = [p["gmlake"][1] for w, p in train.items() if "ckpt" in w and "fsdp" not in w]
    return "\n".join(_fill(s, 115, "  ") for s in (
        _memory_text(train, set()).replace("**Memory**", f"**Memory: the least reserved on {_of(least, len(train))}**"),
        f"- **Utilization** {_span(util, 3)}; the {_n(len(ckpt))} recomputation workloads stop at {_span(ckpt, 3)}.")) + "\n"


def dynamic_notes() -> str:
    """The speed suite's findings (its summary) and the long runs' (theirs)."""
    data = _json(DYNAMIC)
    rows = {(r["workload"], r["allocator"]): r for r in data["rows"]}
    work = list(dict.fromkeys(w for w, _ in rows))
    margin = [_less(rows[(w, "gmlake")]["peak_reserved_gib"], rows[(w, "expandable")]["peak_reserved_gib"]) for w in work]
    after = [r["gmlake_after_warmup"] for r in data["runs"] if r["allocator"] == "gmlake" and r.get("returncode") == 0]
    text = (f"gmlake reserved {_pct(margin)} % less than expandable segments at "
            f"{_span([rows[(w, 'gmlake')]['utilization'] for w in work], 3)} utilization: these workloads fragment "
            f"little under expandable segments. After warm-up gmlake made {_span([a['stitches'] for a in after], 0)} "
            f"stitches and {_span([a['driver_calls'] for a in after], 0)} driver calls per run.")
    long = [_json(path) for path in LONG]
    pairs = [({r["allocator"]: r for r in d["rows"] if r["workload"] == w}, d["settings"]) for d in long
             for w in d["settings"]["workloads"]]
    gm = [p["gmlake"] for p, _ in pairs]
    ratio = [sum(p["gmlake"]["timed_s"]) / sum(p["expandable"]["timed_s"]) for p, _ in pairs]
    steps = {(s["steps"], s["warmup"]) for _, s in pairs}
    more = [f"{w} {_span([_less(p['gmlake']['peak_reserved_gib'], p['expandable']['peak_reserved_gib']) for p, _ in pairs if p['gmlake']['workload'] == w], 1)} %"
            for w in dict.fromkeys(p["gmlake"]["workload"] for p, _ in pairs)]
    text2 = (f"**Long runs** ({' or '.join(f'{a:,} steps, {b} warm-up' for a, b in sorted(steps))}; "
             f"{len(pairs)} runs of {_and(list(dict.fromkeys(g['workload'] for g in gm)))} against expandable segments; "
             + ", ".join(f"`bench/results/{p}`" for p in LONG) + f"): {_span([g['stitches_after_warmup'] for g in gm], 0)} "
             f"stitches and {_span([g['driver_calls_after_warmup'] for g in gm], 0)} driver calls after warm-up, "
             f"gmlake reserving less by {_and(more)}, in {_span(ratio, 3)}x expandable segments' time (summed).")
    return _fill(text, 115) + "\n\n" + _fill(text2, 115) + "\n"


def caps_notes() -> str:
    """The cap search's findings: where gmlake fit below expandable segments' failure, the fixed probes, FSDP."""
    single, wins, by = _cap_wins()
    probes = [p for relative in CAP_PROBES for p in _json(relative)["probes"] if isinstance(p.get("fit"), bool)]
    fixed = "; ".join(f"{p['workload']} under {p['allocator']} at {p['cap_bytes']:,} bytes ({p['cap_bytes'] / GiB:.3f} "
                      "GiB): " + ("fit" if p["fit"] else f"out of memory at step {p['oom_step']}") for p in probes)
    fsdp = {w: b for w, b in _cap_brackets().items() if "fsdp" in w}
    ties = "; ".join(f"{w}: " + ", ".join(f"{a} ({'-' if f is None else f'{f:.3f}'}, {fit:.3f}]" for a, (f, fit)
                                          in sorted(b.items())) for w, b in fsdp.items())
    return "\n".join(_fill(s, 115, "  ") for s in (
        (f"- **gmlake completed training at a cap where expandable segments ran out of memory on "
         f"{_of(len(wins), len(single))} single-GPU workloads**, by {_span(by, 2)} % of the cap, counting the fixed "
         f"probes that settled caps a bisection left tied ({fixed}; `bench/results/{CAP_PROBES[0]}`)."),
        f"- **FSDP**, in (failed, fit] brackets: {ties}.")) + "\n"


def tune_gpu() -> str:
    """`gmlake tune --fit` recommendations then (each record's), predicted and run for real on the GPU."""
    lines = ["| trace | --fit | recommended then | predicted peak reserved under the fit | real | completed |",
             "|---|---|---|---|---|---|"]
    for name, folder in TUNE_GPU:
        tune, run = _json(f"{folder}/tune-predicted-{name}.json"), _json(f"{folder}/tune-{name}.json")
        best = tune["recommended"]
        got = next(s for s in tune["settings"] if s["spec"] == best["spec"])["fit_peak_reserved"]
        real = run["max_memory_reserved"]
        lines.append(f"| {tune['trace']} | {tune['fit']:,} B | `{best['spec']}` | {got:,} B | "
                     f"{real:,} B ({100 * (real / got - 1):+.2f} %) | "
                     f"{'yes' if run.get('timed_s') and real <= tune['fit'] else 'no'} |")
    return "\n".join(lines) + "\n\n" + _machine(TUNE_GPU[0][1]) + " (" + ", ".join(
        f"`bench/results/{f}/tune-*{n}.json`" for n, f in TUNE_GPU) + ").\n"


def micro_notes() -> str:
    """What a handle costs (the micro record) and what it does to the paper's design in replay."""
    from gmlake.sim.replay import bundled_traces, replay
    from gmlake.sim.trace import load

    calls, stitch = _json(MICRO)["driver_call_us"], _json(MICRO)["stitch_512MiB"]
    small = [c["set_access_per_handle"] + c["unmap_per_handle"] for k, c in calls.items() if int(k[:-3]) <= 8]
    paper = [replay(t, "gmlake-paper").driver_seconds / replay(t, "expandable").driver_seconds
             for t in map(load, bundled_traces())]
    return _fill(f"`set_access` and `unmap` together cost {_span(small, 0)} µs per handle mapped in the range for "
                 "handles up to 8 MiB, whatever the handle's size. That is why the default grows in large pages "
                 "and stitches only where it saves several: the paper's 2 MiB chunks spend "
                 f"{_span(paper, 0)}x the driver time of expandable segments on the bundled traces (replayed). "
                 f"Stitching 512 MiB costs its driver calls and no more (ratio "
                 f"{_span([s['ratio_to_driver_calls'] for k, s in stitch.items() if int(k[:-3]) <= 8], 2)} at 2-8 MiB "
                 f"handles; {stitch['2MiB']['stitch_us'] / 1000:.1f} ms for {stitch['2MiB']['handles']} 2 MiB handles; "
                 f"`bench/results/{MICRO}`).", 115) + "\n"


# The stall model's judged runs: the speed suites' and the paper policy's single runs (bench/tests/test_stall_model.py).
STALL = [RESULTS / DYNAMIC.rsplit("/", 1)[0], *(ROOT / "tests/data/results/train" / p for p in (
    "speed-2026-11-30d", "stall-2026-11-30/vit-paper.json", "stall-2026-11-30/t5-paper.json"))]
STALL_TOLERANCE = 0.3


def stall() -> str:
    """The stall model against the GPU runs it is judged on (`python -m bench report stall`)."""
    from bench import stall_check
    from gmlake.sim.replay import driver_costs

    judged = [r for r in stall_check.check(stall_check.load_runs(STALL), STALL_TOLERANCE) if r["judged"]]
    ratios = [r["measured_s"] / r["priced_s"] for r in judged]
    return _fill(f"Its stall factor, {driver_costs()['stall_factor']}, is the geometric mean of the {_n(len(judged))} "
                 f"judged runs' ratios ({_span(ratios, 2)}x). It predicts {sum(bool(r['ok']) for r in judged)} of the "
                 f"{len(judged)} runs within {100 * STALL_TOLERANCE:.0f} % (`python -m bench report stall "
                 + " ".join(str(Path(p).relative_to(ROOT)) for p in STALL) + "`).", 115) + "\n"


def edge_page_sizes() -> str:
    """The edge goals by the page the default policy maps (records of `python -m bench edge`, each with one page
    judged; 20 MiB is the default's own table): per page how many traces meet each goal, the priced driver time
    without a limit against the default's and per GiB of peak reserved (the expandable model's beside it), and the
    traces whose fit goal no page meets."""
    records = [("20 MiB (default)", json.loads(EDGE.read_text()))] + \
        [(f"{page} MiB", json.loads(path.read_text())) for page, path in sorted(EDGE_PAGES.items(), reverse=True)]
    tails = [("20 MiB, the tail's page in 2 MiB slots (`tail_page=2MiB`)", json.loads(EDGE_TAIL.read_text())),
             ("the same, pages cut at reuse too (`cut_at_reuse=25`)", json.loads(EDGE_CUT.read_text()))]
    n = len(records[0][1]["goals"])
    keys = ("smallest_device", "smallest_cap", "device_1.02", "device_1.05", "cap_1.02", "cap_1.05", "uncapped")
    lines = [("| page | fit: device | fit: cap | speed: device 1.02x / 1.05x | speed: cap 1.02x / 1.05x | "
              "uncapped | priced time without a limit, x the default's | priced ms per GiB reserved |"),
             "|---|---|---|---|---|---|---|---|"]
    base = {r["trace"]: r["uncapped"]["driver_seconds"] for r in records[0][1]["rows"] if r["policy"] == "gmlake"}

    def per_gib(rows: list[dict]) -> str:
        """Median (and range) over the traces of priced driver ms per GiB of peak reserved, without a limit."""
        v = sorted(r["uncapped"]["driver_seconds"] * 1e3 / (r["uncapped"]["peak_reserved"] / (1 << 30)) for r in rows)
        return f"{v[len(v) // 2]:.1f} ({v[0]:.1f}-{v[-1]:.1f})"
    missed_by_all = None
    for page, record in records + tails:
        met = {k: sum(g[k]["met"] for g in record["goals"]) for k in keys}
        label = next(r["policy"] for r in record["rows"] if r["policy"] not in ("expandable", "gmlake-paper"))
        ours = {r["trace"]: r["uncapped"]["driver_seconds"] for r in record["rows"] if r["policy"] == label}
        ratios = sorted(ours[t] / base[t] for t in ours if base.get(t))
        missed = {g["trace"] for g in record["goals"] if not (g["smallest_device"]["met"] and g["smallest_cap"]["met"])}
        missed_by_all = missed if missed_by_all is None else missed_by_all & missed
        lines.append(f"| {page} | {met['smallest_device']} | "
                     f"{met['smallest_cap']} | {met['device_1.02']} / {met['device_1.05']} | "
                     f"{met['cap_1.02']} / {met['cap_1.05']} | {met['uncapped']} | "
                     f"{ratios[len(ratios) // 2]:.1f} ({ratios[0]:.1f}-{ratios[-1]:.1f}) | "
                     f"{per_gib([r for r in record['rows'] if r['policy'] == label])} |")
    finest = records[-1][1]
    misses = [f"{g['trace']} (device {g['smallest_device']['ratio']:.4f} P, cap {g['smallest_cap']['ratio']:.4f} P "
              f"with {records[-1][0]} pages, against {g['smallest_device']['bound']:.4f})"
              for g in finest["goals"] if g["trace"] in (missed_by_all or ())]
    expandable = per_gib([r for r in records[0][1]["rows"] if r["policy"] == "expandable"])
    return (f"Traces meeting each goal, of {n}; the priced time is the median (and range) over the traces; the "
            f"expandable model's per GiB reserved: {expandable}. "
            f"The fit goal is missed at every page by {', '.join(misses) or 'none'}.\n\n" + "\n".join(lines) + "\n")


def reuse_cuts() -> str:
    """Pages cut at reuse beside the tail pages alone, per edge trace (records of `python -m bench edge`): the
    smallest device and cap as multiples of P against the fit goal's bound, and without a limit the peak reserved
    (the paper's design's beside), the pages cut and the synchronizes; then the fit goal judged on traces no setting
    was chosen on, for the candidate, the default and the tail pages alone."""
    from bench.edge import goals

    def by_trace(record: dict, label: str) -> dict[str, dict]:
        return {r["trace"]: r for r in record["rows"] if r["policy"] == label}
    cut_record, tail_record = json.loads(EDGE_CUT.read_text()), json.loads(EDGE_TAIL.read_text())
    cut, tail = by_trace(cut_record, CUT_LABEL), by_trace(tail_record, "gmlake(tail_page=2MiB)")
    paper = by_trace(cut_record, "gmlake-paper")
    judged = {g["trace"]: g for g in cut_record["goals"]}
    lines = [("| trace | fit bound | tail pages: device / cap | cut at reuse: device / cap | reserved GiB without a "
              "limit: tail / cut / paper | pages cut (synchronizes) without a limit |"), "|---|---|---|---|---|---|"]
    for name in sorted(cut):
        c, t, g = cut[name], tail[name], judged[name]
        peak = c["peak_allocated"]
        met = "" if g["smallest_device"]["met"] and g["smallest_cap"]["met"] else " (missed)"
        lines.append(f"| {name} | {g['smallest_device']['bound']:.4f} | {t['smallest_device'] / peak:.4f} / "
                     f"{t['smallest_cap'] / peak:.4f} | {c['smallest_device'] / peak:.4f} / "
                     f"{c['smallest_cap'] / peak:.4f}{met} | {t['uncapped']['peak_reserved'] / GiB:.3f} / "
                     f"{c['uncapped']['peak_reserved'] / GiB:.3f} / {paper[name]['uncapped']['peak_reserved'] / GiB:.3f} | "
                     f"{c['uncapped']['tails_cut_at_reuse']} ({c['uncapped']['synchronizes']}) |")
    met = sum(g["smallest_device"]["met"] and g["smallest_cap"]["met"] for g in cut_record["goals"])
    held = json.loads(EDGE_CUT_HELDOUT.read_text())
    names = sorted({r["trace"] for r in held["rows"]})
    counts = []
    for label, what in ((CUT_LABEL, "cut at reuse"), ("gmlake", "the default"),
                        ("gmlake(tail_page=2MiB)", "tail pages alone")):
        rows = [r for r in held["rows"] if r["policy"] in (label, "expandable", "gmlake-paper")]
        fit = [g["trace"] for g in goals(rows, default=label) if g["smallest_device"]["met"] and g["smallest_cap"]["met"]]
        counts.append(f"{what} {len(fit)}")
    return ("\n".join(lines) + f"\n\nThe fit goal is met on {met} of {len(cut)} traces. On {len(names)} traces no "
            f"setting was chosen on ({', '.join(names)}), the fit goal is met by {', '.join(counts)}.\n")


CUT_LABEL = "gmlake(tail_page=2MiB, cut_at_reuse=25)"


def replay_goals() -> str:
    """The default's replay goals per trace of the tuning and the held-out validation sets (`python -m bench
    plan-goals`, held by bench/tests/test_plan_goals.py): peak reserved without a limit beside the references', the
    excess over the better of them, the priced driver time against the budget; then each set's counts and the edge
    fit from the bench edge record."""
    record = json.loads(REPLAY_GOALS.read_text())
    goal = record["goals"]
    lines = [("| set | trace | reserved GiB: expandable / paper / default | excess over the better | priced driver s: "
              "default / budget | driver calls per 1000 requests |"), "|---|---|---|---|---|---|"]
    for name, chosen in record["sets"].items():
        for r in chosen["traces"]:
            c = r["candidate"]
            lines.append(f"| {name} | {r['trace']} | {r['expandable']['peak_reserved'] / GiB:.2f} / "
                         f"{r['paper']['peak_reserved'] / GiB:.2f} / {c['peak_reserved'] / GiB:.2f} | "
                         f"{r['excess_pct']:+.2f} %{'' if r['memory_met'] else ' (missed)'} | "
                         f"{c['driver_seconds']:.3f} / {r['time_budget']:.3f}{'' if r['time_met'] else ' (missed)'} | "
                         f"{1000 * c['driver_calls'] / c['requests']:.1f} |")
    env = record["environment"]
    command = env["command"].split(" plan-goals", 1)[-1]
    return ("\n".join(lines) + f"\n\nGoals: reserved at most the better reference's + {goal['memory_excess_pct']} %; "
            f"priced driver time at most expandable's + {goal['time_share']} of the paper design's extra. "
            + "; ".join(record["summary"]) + f". Replayed on the CPU ({env['cpu']}, Python {env['python']}, gmlake "
            f"sources {env['gmlake_source_sha256']}), {env['date'][:10]}: `python -m bench plan-goals{command}`.\n")


def plan_variants() -> str:
    """Where fine pages go, variant by variant (`python -m bench plan-goals`, one record each in
    bench/results/plan-variants/): each set's goal counts; then the bench edge goals of the default and of the plan
    (Note [A plan learned from the run])."""
    lines = ["| policy | tuning: memory, time, both | validation: memory, time, both |", "|---|---|---|"]
    env = None
    for path in sorted(PLAN_VARIANTS.glob("*.json")):
        record = json.loads(path.read_text())
        env = record["environment"]
        counts = [", ".join(re.findall(r"(\d+/\d+)", line)) for line in record["summary"]]
        lines.append(f"| `{record['spec']}` | {counts[0]} | {counts[1]} |")
    edge_lines = ["| bench edge goal | " + " | ".join(f"`{label}`" for label in EDGE_BY_POLICY) + " |",
                  "|---|" + "---|" * len(EDGE_BY_POLICY)]
    met = {label: {k: sum(g[k]["met"] for g in json.loads(path.read_text())["goals"]) for k in EDGE_GOALS}
           for label, path in EDGE_BY_POLICY.items()}
    total = len(json.loads(EDGE.read_text())["goals"])
    edge_lines += [f"| {EDGE_GOALS[k]} | " + " | ".join(f"{met[label][k]}/{total}" for label in met) + " |"
                   for k in EDGE_GOALS]
    return ("\n".join(lines) + f"\n\nReplayed on the CPU ({env['cpu']}, Python {env['python']}, gmlake sources "
            f"{env['gmlake_source_sha256']}), {env['date'][:10]}: `python -m bench plan-goals --sets all --policy SPEC "
            "--references bench/results/replay-goals-references.json --json bench/results/plan-variants/NN.json`, "
            "one per row.\n\n" + "\n".join(edge_lines) + "\n\nFrom `python -m bench edge --policy SPEC --policy "
            "expandable --policy gmlake-paper --json FILE`, its goals for the first policy (bench/edge.py).\n")


def fine_pages_speed(record: str = FINE_SPEED) -> str:
    """The speed runs of a candidate (2 MiB pages; 2 MiB tail slots) beside the default's and expandable segments'
    (bench speed, interleaved): each run's timed seconds after warm-up, the spread, and the driver's calls and time
    after warm-up."""
    data = _json(record)
    env, settings = data["environment"], data["settings"]
    lines = [("| workload | allocator | timed s, each run | spread | driver calls after warm-up | "
              "driver ms after warm-up | peak reserved GiB |"), "|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        calls, busy = row.get("driver_calls_after_warmup"), row.get("driver_busy_s_after_warmup")
        spread = f"{row['spread_pct']:.1f} %" if row["runs"] > 1 else "one run"
        lines.append(f"| {row['workload']} | {row['allocator']} | {', '.join(f'{t:.2f}' for t in row['timed_s'])} | "
                     f"{spread} | {'-' if calls is None else f'{calls:.0f}'} | "
                     f"{'-' if busy is None else f'{busy * 1e3:.1f}'} | {row['peak_reserved_gib']:.2f} |")
    return ("\n".join(lines) + f"\n\n{env['gpu']} (driver {env['nvidia_driver']}), torch {env['torch']}, Python "
            f"{env['python']}, {env['date'][:10]}; `python -m bench speed --workloads {' '.join(settings['workloads'])} "
            f"--allocators {' '.join(settings['allocators'])} --rounds {settings['rounds']} --steps {settings['steps']} "
            f"--warmup {settings['warmup']}`, one call, runs interleaved; a run the deadline cut is not there.\n")


TABLES: dict[str, Callable[[], str]] = {
    "versions": versions, "training": training, "training-notes": training_notes, "dynamic": dynamic,
    "dynamic-notes": dynamic_notes, "unlimited-speed": lambda: "\n".join(fine_pages_speed(r) for r in UNLIMITED_SPEED),
    "caps": caps, "caps-notes": caps_notes, "edge": edge, "edge-missed": edge_missed, "edge-page-sizes": edge_page_sizes,
    "fine-pages-speed": fine_pages_speed, "tail-pages-speed": lambda: fine_pages_speed(TAIL_SPEED),
    "tail-pages-edge-fit": lambda: edge_fit(TAIL_EDGE_FIT), "reuse-cuts": reuse_cuts,
    "replay-goals": replay_goals, "plan-variants": plan_variants,
    "reuse-cuts-speed": lambda: fine_pages_speed(CUT_SPEED), "edge-fit": edge_fit, "edge-bracket": edge_bracket,
    "edge-libraries": edge_libraries, "tune-gpu": tune_gpu, "stall": stall, "latency": latency, "micro": micro,
    "micro-notes": micro_notes, "replay": replayed, "fidelity": fidelity, "handle-size": handle_size, "graphs": graphs,
    "sync-price": sync_price, "ipc-price": ipc_price,
    "gpu-fidelity": gpu_fidelity, "core-change": core_change, "restitch-share": restitch_share,
    "gpu-goals": gpu_goals}


def draw() -> list[Path]:
    """The figure drawn from this document's records: the README's, training.png."""
    plot(PNG)
    return [PNG]
