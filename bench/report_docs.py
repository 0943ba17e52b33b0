"""Rewrite the generated tables of the docs: docs/benchmarks.md's from the result files in bench/results, and the
manual's sample outputs and replayed figures (docs/policies.md) by running the commands they show.

    python -m bench report docs [--check] [--doc docs/policies.md ...]

It also draws docs/training.png, the README's figure, from the training suite's results, and docs/tune.png from the
tune sample's run (docs/policies.md).
Each generated table sits between `<!-- generated: NAME -->` and `<!-- end generated -->`; everything else in the
document is prose and stays as it is. NAME picks the table and the results it is made of (RESULTS below), so the
figures in the document are the files' and nothing else. --check rewrites nothing and exits 1 if the document is not
what the files give (a stale table).
"""
from __future__ import annotations

import json
import re
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from bench import RESULTS, ROOT
from bench.cli import OneLineParser

GiB = 1 << 30
MiB = 1 << 20
DOC = ROOT / "docs" / "benchmarks.md"
PNG = ROOT / "docs" / "training.png"
MARK = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)

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
# `python -m bench edge` with finer pages judged, by page in MiB (held by bench/tests/test_edge.py)
EDGE_PAGES = {page: RESULTS / f"edge-figures-page{page}m.json" for page in (2, 4, 10)}
# 20 MiB pages with the page a block's tail partly covers in 2 MiB slots (`tail_page=2MiB`), the same method
EDGE_TAIL = RESULTS / "edge-figures-tail2m.json"
# The tail pages with pages cut at reuse while memory is laid out (Note [Fine pages at reuse]): on the edge traces,
# and on traces no setting was chosen on, with the default and the tail pages alone beside
EDGE_CUT = RESULTS / "edge-figures-cut25.json"
EDGE_CUT_HELDOUT = RESULTS / "edge-figures-cut25-heldout.json"
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


def _json(relative: str) -> dict | list:
    return json.loads((RESULTS / relative).read_text())


def _env_line(envs: list[dict]) -> str:
    dates = sorted(e.get("date", "?")[:10] for e in envs)
    span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    first = envs[0]
    return (f"{first.get('gpu', '?')} (driver {first.get('nvidia_driver', '?')}), torch {first.get('torch', '?')}, "
            f"{span}.")


def _runs_by_key(files: list[tuple[str, dict[str, str | None] | None]]) -> tuple[dict, list[dict]]:
    runs: dict[tuple[str, str], list[dict]] = {}
    envs = []
    for relative, relabel in files:
        data = _json(relative)
        envs.append(data["environment"])
        for run in data["runs"]:
            if run.get("returncode") != 0:
                continue
            label = run["allocator"] if relabel is None else relabel.get(run["allocator"])
            if label is not None:
                runs.setdefault((run["workload"], label), []).append(run)
    return runs, envs


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
                     "gpu": run["outcome"], "gpu_text": _gpu_outcome(run),
                     "replay": got.failure_kind or "fit"})
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


def sync_price() -> str:
    """The price replay puts on a synchronize: the driver cost table's, with the GPU measurement it came from."""
    from gmlake.sim.replay import driver_costs

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


def graphs_measured() -> str:
    """docs/graphs.md, "Measured": reduce-overhead's graph replays, losses and peaks against native's."""
    runs = _graph_runs()
    mode = "reduce-overhead"
    peak = {a: max(r["max_memory_reserved"] for r in runs[(mode, a)]) for a in ("native", "gmlake")}
    graph_replays = min(r["graph_replays"] for r in runs[(mode, "gmlake")])
    return _fill(
        f"A small transformer under `torch.compile(mode=\"reduce-overhead\")` trains with {graph_replays} graph "
        f"replays and the losses of native's run to {_sci(_loss_gap(mode, runs))} (relative), and reserves "
        f"{peak['gmlake'] / GiB:.3f} GiB against native's {peak['native'] / GiB:.3f} (`bench/results/{GRAPHS}/`; "
        "the table is in [benchmarks.md](benchmarks.md), \"CUDA graphs\").", 115) + "\n"


def graphs_replay() -> str:
    """docs/graphs.md, "Replaying a graph-capturing trace": the reduce-overhead program's trace, replayed."""
    replays = _graph_replays()
    caching = replays["caching"]
    return _fill(
        "The trace of a `reduce-overhead` training program captured under PyTorch's allocator "
        f"({caching['events']:,} events) replays to {caching['peak_reserved'] / GiB:.3f} GiB reserved under the "
        f"caching model and {replays['gmlake']['peak_reserved'] / GiB:.3f} GiB under the default "
        f"(`bench/results/{GRAPHS}/replay-graphs.jsonl`). The record keeps the replays, not the captured run's own "
        "peak: `gmlake replay TRACE --policy caching` prints both, the run's in its `captured` column.", 115) + "\n"


def capture_query() -> str:
    """docs/graphs.md: what one capture question (`cuStreamIsCapturing`) costs, from the micro benchmark."""
    data = _json(MICRO)
    return _fill(
        f"`python -m bench micro` times one: {data['stream_call_us']['capture_query']:.3f} µs on the "
        f"{data['environment']['gpu']} (`bench/results/{MICRO}`), so a cross-stream workload such as FSDP shows "
        "what they cost.", 115) + "\n"


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


# ------------------------------------------------------------------ docs/policies.md: replayed on the CPU

# The worked TLSF example (docs/policies.md): the traces and policies its `gmlake compare` command names.
TLSF_TRACES = [("gpt2l-lora-ckpt-native", "gpt2l-lora-ckpt"), ("opt1.3b-lora-native", "opt1.3b-lora"),
               ("opt350m-full-ckpt-native", "opt350m-full-ckpt"),
               ("tests/data/results/train/stall-2026-11-30/bert-native.gmtrace", "BERT, dynamic padding"),
               ("tests/data/results/train/stall-2026-11-30/cnn-native.gmtrace", "ResNet-50, multi-scale")]
TLSF_POLICIES = ["gmlake", "expandable", "examples/research/tlsf.py:TLSFPlacement",
                 "examples/research/tlsf.py:TLSFPlacement[sl_bits=2]"]
# The tune sample (docs/policies.md section 5): the trace and the fit it is run with, and its figure (`--plot`),
# drawn from the same run as the sample so that the two never disagree.
TUNE_TRACE, TUNE_FIT = "opt1.3b-lora-native", "18.4GiB"
TUNE_PNG = ROOT / "docs" / "tune.png"
_TUNE_RESULTS: list = []


def _in_root(spec: str) -> str:
    return str(ROOT / spec) if "/" in spec else spec


def _tlsf_results() -> list[list]:
    from gmlake.sim import compare
    from gmlake.sim.trace import load

    out = []
    for spec, _ in TLSF_TRACES:
        trace = load(_in_root(spec))
        out.append(compare.run([trace], [_in_root(p) for p in TLSF_POLICIES], progress=False))
    return out


def tlsf() -> str:
    """The TLSF example's table and what it shows, replayed (deterministic: the CPU gives the GPU's figures)."""
    rows = _tlsf_results()
    lines = [("| trace | peak allocated | gmlake (best fit) | expandable model | TLSF, 16 classes per power of two | "
              "TLSF, 4 classes |"), "|---|---|---|---|---|---|"]
    for (_, label), results in zip(TLSF_TRACES, rows):
        cells = [f"{r.peak_reserved / GiB:.3f} ({r.utilization:.3f}), {r.stats['stitches']}" for r in results]
        cells[0] = f"**{cells[0].split(' ')[0]}** " + cells[0].split(" ", 1)[1]
        lines.append(f"| {label} | {results[0].peak_allocated / GiB:.3f} | " + " | ".join(cells) + " |")
    more = [r[2].peak_reserved / r[0].peak_reserved - 1 for r in rows] + \
           [r[3].peak_reserved / r[0].peak_reserved - 1 for r in rows]
    over_expandable = [label for (_, label), r in zip(TLSF_TRACES, rows) if r[2].peak_reserved > r[1].peak_reserved]
    stitches = [r[k].stats["stitches"] for r in rows for k in (2, 3)]
    best_stitches = [r[0].stats["stitches"] for r in rows]
    ratio = [r[k].driver_seconds / r[0].driver_seconds for r in rows for k in (2, 3)]
    tlsf_s = [r[k].driver_seconds for r in rows for k in (2, 3)]
    best_s = [r[0].driver_seconds for r in rows]
    coarse = sum(r[3].peak_reserved <= r[2].peak_reserved for r in rows)
    n = len(rows)
    costs = (f"- **TLSF's guarantee costs memory here.** It reserves {100 * min(more):.1f}-{100 * max(more):.1f} % "
             "more than best fit on the same base.")
    if over_expandable:
        costs += (f" On {len(over_expandable)} of the {n} traces ({'; '.join(over_expandable)}) that is more than "
                  "expandable segments reserve.")
    gap = ("- **It hands the gap to stitching.** TLSF skips free blocks of the request's own class that would fit, "
           f"so more requests find no block and stitch: {min(stitches)}-{max(stitches)} stitches where best fit "
           f"needs {min(best_stitches)}-{max(best_stitches)}, and {min(ratio):.1f}-{max(ratio):.1f}x the driver "
           f"time (priced {min(tlsf_s):.3f}-{max(tlsf_s):.3f} s per trace against "
           f"{min(best_s):.3f}-{max(best_s):.3f} s).")
    coarser = f"- **Coarser classes (4) were no worse than the paper's 16** on {coarse} of the {n} traces."
    lines += ["", "What it shows:", costs, gap, coarser]
    return "\n".join(lines) + "\n"


def _tune_run() -> tuple[str, object]:
    """`gmlake tune TUNE_TRACE --fit TUNE_FIT` at 80 columns, as a terminal shows it (without its last line, the
    time the search took), and the result."""
    from gmlake.sim import tune as gtune

    captured: dict = {}
    original = gtune.tune

    def keep(*args, **kwargs):
        captured["result"] = original(*args, **kwargs)
        return captured["result"]

    gtune.tune = keep
    try:
        _, out, _ = _run_cli(["tune", TUNE_TRACE, "--fit", TUNE_FIT, "--jobs", "2"])
    finally:
        gtune.tune = original
    _TUNE_RESULTS.append(captured["result"])
    return "\n".join(line.rstrip() for line in out.splitlines()[:-1]), captured["result"]


def tune_fit() -> str:
    """The tune sample: the command, its output, and what it shows in words."""
    from gmlake.sim import tune as gtune

    text, result = _tune_run()
    by = {o.spec: o for o in result.outcomes}
    default, fine = by["gmlake"], by["gmlake[capped_page_large=4MiB]"]
    plain, _ = gtune.recommend(result.outcomes, None, result.within, result.trace_seconds)
    fastest = min((o for o in result.outcomes if not o.failed), key=lambda o: o.driver_seconds)
    return (f"```\n$ gmlake tune {TUNE_TRACE} --fit {TUNE_FIT}\n```\n\n```\n{text}\n```\n\n"
            f"Under the cap, the default keeps its 20 MiB pages and, at the limit, stitches in 2 MiB pages "
            f"(`edge_page`; it re-backs nothing: `reback_slot=0`): "
            f"{default.fit_driver_seconds:.3f} s of driver time there, against {fine.fit_driver_seconds:.3f} s for "
            f"4 MiB pages from the moment the cap is set (`capped_page_large=4MiB`). Without `--fit` the same trace "
            f"gets `{plain.policy}`: {plain.peak_reserved / GiB:.3f} GiB at {plain.driver_seconds:.3f} s of driver "
            f"time, against the fastest setting (`{fastest.policy}`, {fastest.peak_reserved / GiB:.3f} GiB at "
            f"{fastest.driver_seconds:.3f} s).\n")


def tune_search() -> str:
    """The settings `gmlake tune` replays, from its search (for a trace on one stream)."""
    import numpy as np

    from gmlake import policies
    from gmlake.sim import tune as gtune
    from gmlake.sim.trace import EVENT_DTYPE, Trace

    settings = gtune.search_space(Trace(np.zeros(1, dtype=EVENT_DTYPE), {"name": "one stream"}))
    builtin = [s.spec for s in settings if not s.knobs]
    assert builtin == policies.names()
    return ("The built-in policies at their defaults (" + ", ".join(f"`{s}`" for s in builtin) + "), then "
            + ", ".join(f"`{s.spec}`" for s in settings if s.knobs) + ".\n")


def _fill(text: str, width: int, indent: str = "") -> str:
    """`text` as a paragraph (or a list item, with `indent`) of `width` columns; names keep their hyphens."""
    return textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


# The policies section 1 of docs/policies.md writes and sections 3-4 run: the doc's own code blocks, so that the
# samples are what a reader who copies them gets.
POLICY_DOC = ROOT / "docs" / "policies.md"
MAXPIECES_TRACES = ["opt1.3b-lora-native", "gpt2l-lora-ckpt-native"]
EXPLAIN_TRACE = "gpt2l-lora-ckpt-native"


def _doc_policies(folder: Path) -> dict[str, str]:
    """Write maxpieces.py and neversplit.py, as docs/policies.md shows them, into `folder`; their paths."""
    blocks = re.findall(r"```python\n(.*?)```", POLICY_DOC.read_text(), flags=re.DOTALL)
    files = {"maxpieces.py": next(b for b in blocks if "class MaxPieces(" in b),
             "neversplit.py": next(b for b in blocks if b.startswith("# neversplit.py\n"))}
    for name, code in files.items():
        (folder / name).write_text(code)
    return {name: str(folder / name) for name in files}


def _markdown(columns: list[str], rows: list[dict], right: set[str]) -> list[str]:
    """A markdown table of `rows`' `columns` (rich Text or str cells), numbers right-aligned."""
    return ["| " + " | ".join(columns) + " |",
            "|" + "|".join("---:" if c in right else "---" for c in columns) + "|",
            *("| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows)]


def _fail_prose(section: str, claim: str) -> None:
    """The prose around a generated section says `claim`; the replay no longer shows it."""
    raise ValueError(f"{section}: the replay no longer shows that {claim}: rewrite the prose and the generator")


def compare_maxpieces() -> str:
    """docs/policies.md section 3: the built-ins and MaxPieces compared on two bundled traces, and what it shows."""
    import tempfile

    from gmlake.sim import compare
    from gmlake.sim.trace import load

    with tempfile.TemporaryDirectory() as tmp:
        files = _doc_policies(Path(tmp))
        specs = ["gmlake", "gmlake-paper", "caching", "expandable",
                 f"{files['maxpieces.py']}:MaxPieces[max_pieces=2]", f"{files['maxpieces.py']}:MaxPieces"]
        results = compare.run([load(t) for t in MAXPIECES_TRACES], specs, progress=False)
    columns = ["trace", "policy", "reserved", "alloc/res", "ext@growth", "stitches", "driver calls", "driver s"]
    cells = [compare._cells(r, {}) for r in results]
    lines = _markdown(columns, cells, set(columns[2:]))
    lines[0] = lines[0].replace("| reserved |", "| reserved GiB |").replace("| ext@growth |", "| ext@growth GiB |")
    by = {(r.trace, r.policy): r for r in results}
    short = {t: t.split("-")[0] for t in MAXPIECES_TRACES}
    default = {t: by[(t, "gmlake")] for t in MAXPIECES_TRACES}
    two = {t: by[(t, "MaxPieces(max_pieces=2)")] for t in MAXPIECES_TRACES}
    sixteen = {t: by[(t, "MaxPieces")] for t in MAXPIECES_TRACES}
    if any((sixteen[t].peak_reserved, sixteen[t].stats["stitches"], sixteen[t].stats["calls"])
           != (default[t].peak_reserved, default[t].stats["stitches"], default[t].stats["calls"])
           for t in MAXPIECES_TRACES):
        _fail_prose("compare-maxpieces", "MaxPieces at its default of 16 changes nothing")
    calls = {t: sum(r.stats["calls"].values()) for t, r in default.items()}
    fewer = [100 * (1 - sum(two[t].stats["calls"].values()) / calls[t]) for t in MAXPIECES_TRACES]
    text = ("The default policy's stitches already take few pieces: `MaxPieces` at its default of 16 changes nothing "
            "on either trace (identical bytes, stitches and calls). At most 2 pieces leaves "
            + " and ".join(f"{two[t].stats['stitches']} of {default[t].stats['stitches']}" for t in MAXPIECES_TRACES)
            + " of the default's stitches, and memory comes close to the expandable model's: "
            + ", ".join(f"{(two[t].peak_reserved - default[t].peak_reserved) / GiB:.2f} GiB more than the default on "
                        f"{short[t]}" for t in MAXPIECES_TRACES)
            + f", for {_pct(fewer)} % fewer driver calls.")
    return "\n".join(lines) + "\n\n" + _fill(text, 117) + "\n"


def replay_neversplit() -> str:
    """docs/policies.md section 3: a policy that never splits a large block, against the default."""
    import tempfile

    from gmlake.sim import compare
    from gmlake.sim.trace import load

    with tempfile.TemporaryDirectory() as tmp:
        files = _doc_policies(Path(tmp))
        results = compare.run([load(MAXPIECES_TRACES[0])], ["gmlake", f"{files['neversplit.py']}:NeverSplit"],
                              progress=False)
    columns = ["policy", "reserved", "allocated", "alloc/res", "req/res", "int frag MiB", "ext@peak"]
    lines = _markdown(columns, [compare._cells(r, {}) for r in results], set(columns[1:]))
    lines[0] = lines[0].replace("| reserved | allocated |", "| reserved GiB | allocated GiB |").replace(
        "| ext@peak |", "| ext@peak GiB |")
    return "\n".join(lines) + "\n"


def peak_growth_example() -> str:
    """docs/policies.md section 3: why the moment of peak growth, shown on gmlake-paper's replay of a trace."""
    from gmlake.sim.replay import replay
    from gmlake.sim.trace import load

    trace = load(EXPLAIN_TRACE)
    r = replay(trace, "gmlake-paper")
    sizes = trace.requests()["size"]
    share = 100 * r.reserved_at_peak_growth / r.peak_reserved
    if r.peak_event == r.peak_growth_event:
        _fail_prose("peak-growth", "the exact peak comes after the moment of peak growth")
    return _fill(
        "Why two moments: the exact peak of reserved memory can come long after the growth that made it. On "
        f"{EXPLAIN_TRACE}, reserved memory reaches {share:.2f} % of its peak at request #{r.peak_growth_event} (a "
        f"{sizes[r.peak_growth_event] / MiB:.0f} MiB tensor) under `gmlake-paper`; the exact peak comes at request "
        f"#{r.peak_event}, a {sizes[r.peak_event] / MiB:.2f} MiB request, when the activations are freed: external "
        f"fragmentation at that moment is {r.external_fragmentation / GiB:.1f} GiB of {r.peak_reserved / GiB:.1f}, "
        "which says nothing about the policy. The moment of peak growth is defined as **the first request after "
        "which reserved memory is within 1 % of its peak** (`gmlake.sim.replay.peak_growth_moment`); growth after it "
        f"adds less than 1 % of the peak together. There, gmlake-paper holds "
        f"{r.external_fragmentation_at_growth / GiB:.3f} GiB it could not use.", 117) + "\n"


def explain_sample() -> str:
    """docs/policies.md section 4: `gmlake explain` on a bundled trace as a terminal of 120 columns shows it, and
    what it says, in words, from the same replay."""
    import tempfile

    from gmlake.sim.explain import explain
    from gmlake.sim.trace import load

    spec = "maxpieces.py:MaxPieces[max_pieces=2]"
    with tempfile.TemporaryDirectory() as tmp:
        files = _doc_policies(Path(tmp))
        _, out, _ = _run_cli(["explain", EXPLAIN_TRACE, "--policy", "caching", "--policy", "gmlake", "--policy", spec],
                             120, Path(tmp))
        trace = load(EXPLAIN_TRACE)
        caching, default, two = (explain(trace, p) for p in ("caching", "gmlake",
                                                              spec.replace("maxpieces.py", files["maxpieces.py"])))
    text = "\n".join(line.rstrip() for line in out.splitlines())
    if tmp in text:
        raise ValueError("explain: the output names the temporary folder the doc's policy was written to")
    if not (default.request_index == two.request_index == caching.request_index
            and default.largest_free_before < default.request_size and two.growth >= two.request_size - two.page):
        _fail_prose("explain", "the three policies explain one request that found no free block large enough, "
                               "and two pieces grew it whole")
    read = (f"Read: the {default.request_size / MiB:.0f} MiB request found {default.free_before / GiB:.1f} GiB free "
            f"in {default.free_pieces_before} pieces, none large enough. The default stitched the free pages and "
            f"mapped {default.growth // default.page} new ones; capped at two pieces, the stitch was refused and all "
            f"{two.growth // two.page} pages were new, leaving {two.free_whole_chunks / GiB:.1f} GiB of whole free "
            f"pages that the request could not use. Caching, with {caching.free_before / GiB:.1f} GiB free in "
            f"{caching.free_pieces_before} pieces, made a new {caching.growth / GiB:.1f} GiB segment.")
    return (f"```\n$ gmlake explain {EXPLAIN_TRACE} --policy caching --policy gmlake --policy '{spec}'\n```\n\n"
            f"```\n{text}\n```\n\n" + _fill(read, 117) + "\n")


# ------------------------------------------------------------------ README.md: the summary of the results above

# The README's table: a few workloads of the training and speed suites, as a newcomer would name them.
README_ROWS = [("gpt2xl-lora-ckpt", "GPT-2 XL size, LoRA + recomputation"),
               ("opt1.3b-lora-ckpt", "OPT-1.3B, LoRA + recomputation"),
               ("gpt2xl-ckpt", "GPT-2 XL size, recomputation"), ("opt1.3b-lora", "OPT-1.3B, LoRA"),
               ("opt1.3b-fsdp-lora-ckpt", "OPT-1.3B, FSDP + LoRA + recomputation, per rank of two GPUs"),
               ("bert", "BERT-base, dynamic padding")]
# Fixed probes that settled caps a bisection left tied (`python -m bench cap probe`).
CAP_PROBES = ["train/cap-probe-2026-12-01/cap-probe.json"]


def _pct(values: list[float]) -> str:
    """Percentages as the README writes them: one figure where the ends agree, tenths below 10 %."""
    lo, hi = min(values), max(values)
    digits = 1 if hi < 10 else 0
    a, b = f"{lo:.{digits}f}", f"{hi:.{digits}f}"
    return a if a == b else f"{a}-{b}"


def _span(values: list[float], digits: int) -> str:
    a, b = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return a if a == b else f"{a}-{b}"


def _less(ours: float, theirs: float) -> float:
    """How much less `ours` is than `theirs`, in % of theirs."""
    return 100 * (1 - ours / theirs)


_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
          10: "ten", 11: "eleven", 12: "twelve", 13: "thirteen"}


def _n(count: int) -> str:
    return _WORDS.get(count, str(count))


def _of(count: int, total: int) -> str:
    """"all eleven" or "ten of the eleven"."""
    return f"all {_n(total)}" if count == total else f"{_n(count)} of the {_n(total)}"


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


def readme_utilization() -> str:
    """The README's opening: what utilization is, and the range each allocator reached in the suites."""
    peaks, _, _ = _peaks()
    util = {a: [p[a][1] for p in peaks.values() if a in p] for a in ALLOCATORS}
    return _fill(
        "PyTorch keeps the GPU memory it gets from the driver (*reserved* memory) and serves tensors (*allocated* "
        "memory) from it. *Utilization* is peak allocated / peak reserved: the share of the memory a job reserved "
        "that it ever used. On the training jobs measured, whose shapes change every step (LLM fine-tuning with variable lengths, "
        f"LoRA, recomputation, FSDP, dynamic batches) PyTorch's native allocator reached {_span(util['native'], 2)}"
        f" and its `expandable_segments` {_span(util['expandable'], 3)}. gmlake reached "
        f"{_span(util['gmlake'], 3)} by *virtual memory stitching*, after GMLake (Guo et al., ASPLOS'24): when no "
        "free block is large enough, it maps the free physical pages of several blocks back to back into one new "
        "virtual range (an *sBlock*, a stitched block) instead of asking the driver for more memory.", 115) + "\n"


def readme_table() -> str:
    """The README's results: how many workloads gmlake reserved less on, and a table of a few of them with the
    smallest cap each fit under."""
    peaks, dynamic, envs = _peaks()
    brackets = _cap_brackets()
    _, _, cap_envs = _cap_search()
    less = sum(p["gmlake"][0] < p["expandable"][0] for p in peaks.values())
    same = sum(p["gmlake"][0] == p["expandable"][0] for p in peaks.values())
    more = len(peaks) - less - same
    llm = len(peaks) - len(dynamic)
    head = (f"On {_n(llm)} LLM fine-tuning workloads and {_n(len(dynamic))} training programs whose shapes change "
            "every step, each run in a fresh process with the same shapes under every allocator, gmlake reserved "
            f"less memory than expandable segments on {_n(less)}"
            + (f", the same on {_n(same)}" if same else "") + (f" and more on {_n(more)}" if more else "") + ":")
    lines = [_fill(head, 115), "",
             ("![utilization, peak reserved memory and step time per workload under native, expandable segments and "
              "gmlake](docs/training.png)"), "",
             ("| workload (one GPU unless said) | peak reserved GiB: native / expandable / gmlake | utilization: "
              "expandable / gmlake | under a memory cap, the smallest that 20 steps fit (GiB): expandable / gmlake |"),
             "|---|---|---|---|"]
    for workload, label in README_ROWS:
        p = peaks[workload]
        least = min(v[0] for v in p.values())
        reserved = " / ".join(f"**{p[a][0] / GiB:.2f}**" if p[a][0] == least else f"{p[a][0] / GiB:.2f}"
                              for a in ALLOCATORS)
        best = max(p["expandable"][1], p["gmlake"][1])
        util = " / ".join(f"**{p[a][1]:.3f}**" if p[a][1] == best else f"{p[a][1]:.3f}"
                          for a in ("expandable", "gmlake"))
        b = brackets[workload]
        fits = f"{b['expandable'][1]:.3f} / {b['gmlake'][1]:.3f}"
        if _cap_won(b):
            fits = f"{b['expandable'][1]:.3f} / **{b['gmlake'][1]:.3f}**"
        elif b["gmlake"][1] < b["expandable"][1]:
            fits = "a tie: " + fits       # gmlake's fit lies above a cap where expandable segments failed
        lines.append(f"| {label} | {reserved} | {util} | {fits} |")
    env = _env_line(envs + cap_envs)
    return "\n".join(lines) + "\n\n" + _fill(
        env + " All workloads, the method, step times and their spread: [docs/benchmarks.md](docs/benchmarks.md).",
        115) + "\n"


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


def readme_findings() -> str:
    """The README's bullets: memory, the device and a cap as the limit, the edge of memory, speed; every figure
    from the records the benchmark tables are made of."""
    peaks, dynamic, _ = _peaks()
    single, wins, by = _cap_wins()
    record = json.loads(EDGE.read_text())
    rows: dict[str, dict[str, dict]] = {}
    for r in record["rows"]:
        rows.setdefault(r["trace"], {})[r["policy"]] = r
    over = [(by_policy["gmlake"]["smallest_cap"] - by_policy["expandable"]["smallest_cap"])
            / by_policy["gmlake"]["peak_allocated"] * 100 for by_policy in rows.values()]
    worse = [o for o in over if o > 0]
    goals = record["goals"]
    met = {k: sum(g[k]["met"] for g in goals) for k in ("smallest_device", "smallest_cap", "unbinding")}
    cap_text = (f"- **Under a memory cap** (`set_per_process_memory_fraction`): gmlake completed training at caps "
                f"where expandable segments ran out of memory on {_of(len(wins), len(single))} single-GPU "
                f"workloads, by {_span(by, 2)} % of the cap, with an earlier default that re-backed live memory at "
                "the limit.")
    edge_text = (f"- **At the edge of memory**, today's default moves no live memory. Replayed on {len(over)} traces, "
                 f"it needs a cap no larger than expandable segments' on {len(over) - len(worse)}, up to "
                 f"{max(worse, default=0):.1f} % of the peak more on {len(worse)}, and fits within 0.2 % of the "
                 "peak of the better of expandable segments and GMLake's paper design on "
                 f"{met['smallest_device']} as the device and {met['smallest_cap']} as a cap (re-backing, "
                 "`reback_slot=2MiB`, fits more: see Limitations); a cap that never binds cost nothing on "
                 f"{met['unbinding']} of {len(goals)} (docs/benchmarks.md, \"At the edge of memory\").")
    runs, _ = _runs_by_key(TRAINING)
    ratios, spreads, outside = [], [], []
    for workload in sorted({w for w, _ in runs}):
        speed = {a: [r["tokens_per_s"] for r in runs.get((workload, a), [])] for a in ALLOCATORS}
        if not speed["gmlake"] or not speed["expandable"]:
            continue
        ratio = statistics.median(speed["gmlake"]) / statistics.median(speed["expandable"])
        own = [max(v) / min(v) - 1 for v in speed.values() if len(v) > 1]
        ratios.append(ratio)
        spreads += own
        if abs(ratio - 1) > max(own, default=0):
            outside.append(f"{workload} ({ratio:.2f}x, its runs' spread {100 * max(own, default=0):.0f} %)")
    speed_text = (f"- **Speed:** gmlake's tokens/s was {_span(ratios, 2)}x expandable segments' (medians); repeats "
                  f"of one allocator on one workload differed by {_pct([100 * s for s in spreads])} %. "
                  + ("Every difference lay inside its workload's own spread, so no speed difference either way is "
                     "claimed." if not outside else
                     f"The difference lay inside the workload's own spread on {len(ratios) - len(outside)} of "
                     f"{len(ratios)}, not on {'; '.join(outside)}, with one or two runs a side.")
                  + " What such runs resolve: docs/benchmarks.md, \"Speed\".")
    return "\n".join(_fill(t, 115, "  ")
                     for t in (_memory_text(peaks, dynamic), lazy_text(), cap_text, edge_text, speed_text)) + "\n"


def lazy_text() -> str:
    """The README's bullet on the device as the limit with the libraries loading lazily (the edge-fit table)."""
    rows = [r for r in edge_fit_rows() if r["policy"] in ("gmlake", "expandable")]
    by = {(r["workload"], r["k"], r["round"], r["policy"]): r["gpu"] for r in rows}
    points = {(w, k, rnd) for w, k, rnd, _ in by if (w, k, rnd, "gmlake") in by and (w, k, rnd, "expandable") in by}
    both = [p for p in points if by[(*p, "expandable")] == "fit"]
    kept = sum(by[(*p, "gmlake")] == "fit" for p in both)
    only = [p for p in points if by[(*p, "gmlake")] == "fit" and by[(*p, "expandable")] != "fit"]
    library = sum(by[(*p, "expandable")] == "library" for p in only)
    gm_library = sum(by[(*p, "gmlake")] == "library" for p in points)
    ks = sorted({p[1] for p in points})
    return (f"- **The device as the limit, the CUDA libraries loading their kernels as the run goes:** on the H200, "
            f"{len(points)} paired runs of {_n(len({p[0] for p in points}))} programs whose shapes change every "
            f"step, at {', '.join(f'{k:g}' for k in ks)}x their peak plus the libraries' share: gmlake trained every "
            f"step in {_of(kept, len(both))} runs where expandable segments did, and in {_n(len(only))} where it did "
            f"not ({_of(library, len(only))} of those failing inside cuDNN); no gmlake run failed inside a library"
            + ("" if not gm_library else f" but {gm_library}")
            + ". Replay, holding the memory the libraries took in a captured run, said what every run did "
            "(docs/benchmarks.md, \"The device as the limit, libraries loading lazily\").")


def readme_limits() -> str:
    """The README's limitations that carry a figure: jobs where expandable segments already do well, T5's stitches
    in replay, recomputation workloads' utilization."""
    peaks, _, _ = _peaks()
    good = {w: p for w, p in peaks.items() if p["expandable"][1] >= 0.98}
    saved = [_less(p["gmlake"][0], p["expandable"][0]) for p in good.values()]
    ckpt = [p["gmlake"][1] for w, p in peaks.items() if "ckpt" in w and "fsdp" not in w]
    record = json.loads(EDGE.read_text())
    t5 = {r["policy"]: r for r in record["rows"] if r["trace"] == "t5"}
    g, e = t5["gmlake"]["uncapped"], t5["expandable"]["uncapped"]
    lines = [
        ("- **If you do not run out of memory, or expandable segments already reach about 0.98 utilization on your "
         f"job**, gmlake saves little ({_pct(saved)} % on the {_n(len(good))} such workloads measured) and cannot "
         "make training faster."),
        ("- **Shapes that never settle cost stitches**: on T5 with recomputation, whose source and target lengths "
         f"change every step, replay has gmlake stitch {g['stitches']} times to reserve "
         f"{_less(g['peak_reserved'], e['peak_reserved']):.1f} % less, at "
         f"{g['driver_seconds'] / e['driver_seconds']:.1f}x expandable segments' driver time: each new shape "
         "stitches, and a size whose stitched ranges were taken apart twice grows instead."),
        (f"- **Recomputation workloads reach {_span(ckpt, 3)} utilization without a limit**: free space inside "
         "20 MiB pages that also hold live tensors cannot be stitched (a page maps only whole); it is taken back "
         "only when a limit binds."),
    ]
    return "\n".join(_fill(t, 115, "  ") for t in lines) + "\n"


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


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + items[-1]


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


def _run_cli(args: list[str], columns: int = 80, cwd: Path | None = None) -> tuple[int, str, str]:
    """`gmlake ARGS` run here as a terminal of `columns` would: its exit status, stdout and stderr."""
    import contextlib
    import io
    import os

    from gmlake.cli import main as gmlake_main

    out, err, before, here = io.StringIO(), io.StringIO(), os.environ.get("COLUMNS"), Path.cwd()
    os.environ["COLUMNS"] = str(columns)
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = gmlake_main(args) or 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return rc, out.getvalue(), err.getvalue()


# docs/policies.md, "Errors": the commands whose one-line errors it shows (run beside the doc's maxpieces.py).
POLICY_ERRORS = [["replay", "opt1.3b-lora-native", "--policy", "maxpieces.py:MaxPiece"],
                 ["replay", "opt1.3b-lora-native", "--policy", "gmlake", "--policy", "maxpieces.py:MaxPieces",
                  "--set", "max_pieces=2"]]


def policy_errors() -> str:
    """docs/policies.md: each bad spec's error as `gmlake` prints it (a long list of names cut at 115 columns)."""
    import tempfile

    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        _doc_policies(Path(tmp))
        for args in POLICY_ERRORS:
            rc, out, err = _run_cli(args, cwd=Path(tmp))
            if rc != 2 or out or len(err.splitlines()) != 1:
                raise ValueError(f"gmlake {' '.join(args)}: exit {rc}, not one line on stderr and status 2")
            line = err.strip()
            lines += [f"$ gmlake {' '.join(args)}", line if len(line) <= 115 else line[:line.rindex(", ", 0, 110)] + ", ..."]
    return "```\n" + "\n".join(lines) + "\n```\n"


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


def oom_message() -> str:
    """docs/guide.md: the out-of-memory message a 1 GiB request meets under a 2 GiB cap on an H200 (that device's
    capacity and free memory), as the torch bridge writes it."""
    from gmlake.core.errors import OutOfMemoryError

    error = OutOfMemoryError(requested=GiB, reserved=1536 * MiB, allocated=1536 * MiB, cached=0, limit=2 * GiB,
                             capacity=143156 * MiB)
    return "```\n" + _fill(error.torch_message(0, device_free=int(137.62 * GiB), stitches=3), 115) + "\n```\n"


TABLES: dict[str, Callable[[], str]] = {"training": training, "dynamic": dynamic, "caps": caps, "micro": micro,
                                        "latency": latency, "replay": replayed, "edge": edge, "edge-fit": edge_fit, "edge-bracket": edge_bracket,
                                        "edge-libraries": edge_libraries,
                                        "fine-pages-speed": fine_pages_speed,
                                        "tail-pages-speed": lambda: fine_pages_speed(TAIL_SPEED),
                                        "tail-pages-edge-fit": lambda: edge_fit(TAIL_EDGE_FIT),
                                        "reuse-cuts": reuse_cuts,
                                        "reuse-cuts-speed": lambda: fine_pages_speed(CUT_SPEED),
                                        "unlimited-speed": lambda: "\n".join(fine_pages_speed(r) for r in UNLIMITED_SPEED),
                                        "edge-page-sizes": edge_page_sizes, "tlsf": tlsf, "tune-fit": tune_fit,
                                        "tune-search": tune_search, "readme-utilization": readme_utilization,
                                        "readme-results": lambda: readme_table() + "\n" + readme_findings(),
                                        "readme-limits": readme_limits, "compare-maxpieces": compare_maxpieces,
                                        "replay-neversplit": replay_neversplit, "peak-growth": peak_growth_example,
                                        "explain": explain_sample, "graphs": graphs,
                                        "graphs-measured": graphs_measured, "graphs-replay": graphs_replay,
                                        "capture-query": capture_query, "edge-missed": edge_missed,
                                        "fidelity": fidelity, "handle-size": handle_size,
                                        "versions": versions, "training-notes": training_notes,
                                        "dynamic-notes": dynamic_notes, "caps-notes": caps_notes, "tune-gpu": tune_gpu,
                                        "micro-notes": micro_notes, "policy-errors": policy_errors, "sync-price": sync_price,
                                        "oom-message": oom_message, "stall": stall}


def render(text: str) -> str:
    """`text` with every generated section rewritten; an unknown NAME raises ValueError."""
    def one(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"no generated table {name!r}; one of: {', '.join(TABLES)}")
        return match.group(1) + TABLES[name]() + match.group(4)

    return MARK.sub(one, text)


# The documents whose generated sections this command rewrites: the benchmark docs, and the manual's sample outputs
# and figures that replay computes.
DOCS = [DOC, ROOT / "docs" / "policies.md", ROOT / "docs" / "guide.md", ROOT / "docs" / "graphs.md",
        ROOT / "README.md"]


def main(argv: list[str] | None = None, prog: str = "bench report docs") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, action="append",
                        help="a document to rewrite (repeatable; default: " + ", ".join(
                            str(d.relative_to(ROOT)) for d in DOCS) + ")")
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    stale = []
    for doc in args.doc or DOCS:
        try:
            text = doc.read_text()
            new = render(text)
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"{doc}: {exc}")
        if args.check:
            if new != text:
                stale.append(doc)
            continue
        if new != text:
            doc.write_text(new)
        print(f"{doc}: {len(MARK.findall(text))} generated sections" + (", rewritten" if new != text else ""))
    if args.check:
        for doc in stale:
            print(f"{doc}: stale: run python -m bench report docs", file=sys.stderr)
        if not stale:
            print("up to date")
        return 1 if stale else 0
    if args.doc is None or DOC in args.doc:
        plot(PNG)
        print(f"drew {PNG}")
    if _TUNE_RESULTS:                    # the tune sample was run: its figure too
        from gmlake.sim import tune as gtune

        gtune.plot(_TUNE_RESULTS[-1], TUNE_PNG)
        print(f"drew {TUNE_PNG}")
    return 0
