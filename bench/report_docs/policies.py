"""docs/policies.md's generated sections: the manual's sample outputs and replayed figures, made by running the
commands the document shows (on its own code blocks where it writes a policy), and docs/tune.png from the tune
sample's run."""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench import ROOT
from bench.report_docs.common import GiB, MiB, _fill, _pct, _run_cli, _terminal

if TYPE_CHECKING:
    from gmlake.sim.tune import TuneResult

DOC = ROOT / "docs" / "policies.md"


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


@functools.cache
def tune_sample() -> tuple[str, TuneResult]:
    """`gmlake tune TUNE_TRACE --fit TUNE_FIT` at 80 columns, as a terminal shows it (without its last line, the
    time the search took), and its result: the command's own two halves, the search and its printing. Run once, for
    the sample and the figure both."""
    from gmlake.cli import build_parser
    from gmlake.cli.analysis import show_tune, tune_result

    args = build_parser().parse_args(["tune", TUNE_TRACE, "--fit", TUNE_FIT, "--jobs", "2"])
    result = tune_result(args)
    _, out, _ = _terminal(lambda: show_tune(args, result))
    return "\n".join(line.rstrip() for line in out.splitlines()[:-1]), result


def tune_fit() -> str:
    """The tune sample: the command, its output, and what it shows in words."""
    from gmlake.sim import tune as gtune

    text, result = tune_sample()
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


# The policies section 1 of docs/policies.md writes and sections 3-4 run: the doc's own code blocks, so that the
# samples are what a reader who copies them gets.
MAXPIECES_TRACES = ["opt1.3b-lora-native", "gpt2l-lora-ckpt-native"]
EXPLAIN_TRACE = "gpt2l-lora-ckpt-native"


def _doc_policies(folder: Path) -> dict[str, str]:
    """Write maxpieces.py and neversplit.py, as docs/policies.md shows them, into `folder`; their paths."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
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


TABLES: dict[str, Callable[[], str]] = {
    "compare-maxpieces": compare_maxpieces, "replay-neversplit": replay_neversplit, "peak-growth": peak_growth_example,
    "explain": explain_sample, "tune-fit": tune_fit, "tune-search": tune_search, "policy-errors": policy_errors,
    "tlsf": tlsf}


def draw() -> list[Path]:
    """The tune sample's figure (`gmlake tune --plot`), from the run the sample shows, so that the two never disagree."""
    from gmlake.sim import tune as gtune

    gtune.plot(tune_sample()[1], TUNE_PNG)
    return [TUNE_PNG]
