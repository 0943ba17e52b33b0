"""README.md's generated sections: the summary of docs/benchmarks.md's results (bench.report_docs.benchmarks)."""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable

from bench import ROOT
from bench.report_docs.benchmarks import (
    ALLOCATORS,
    EDGE,
    TRAINING,
    _cap_brackets,
    _cap_search,
    _cap_wins,
    _cap_won,
    _memory_text,
    _peaks,
    edge_fit_rows,
)
from bench.report_docs.common import GiB, _env_line, _fill, _less, _n, _of, _pct, _runs_by_key, _span

DOC = ROOT / "README.md"


# The README's table: a few workloads of the training and speed suites, as a newcomer would name them.
README_ROWS = [("gpt2xl-lora-ckpt", "GPT-2 XL size, LoRA + recomputation"),
               ("opt1.3b-lora-ckpt", "OPT-1.3B, LoRA + recomputation"),
               ("gpt2xl-ckpt", "GPT-2 XL size, recomputation"), ("opt1.3b-lora", "OPT-1.3B, LoRA"),
               ("opt1.3b-fsdp-lora-ckpt", "OPT-1.3B, FSDP + LoRA + recomputation, per rank of two GPUs"),
               ("bert", "BERT-base, dynamic padding")]


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


TABLES: dict[str, Callable[[], str]] = {
    "readme-utilization": readme_utilization, "readme-results": lambda: readme_table() + "\n" + readme_findings(),
    "readme-limits": readme_limits}
