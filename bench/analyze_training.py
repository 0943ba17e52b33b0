"""The evidence behind docs/training.md's analysis, from the traces captured on the GPU (bench/results/traces).

    python bench/analyze_training.py [TRACE ...]

For each trace: where gmlake's reserved bytes are at its peak (gmlake.explain), when its driver time is spent
(per quarter of the run's requests, at the H200's measured per-call costs), and what policy variants would do
(utilization and driver time on replay). Markdown on stdout.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from gmlake.explain import explain
from gmlake.policies import get
from gmlake.replay import driver_seconds, replay, run_requests
from gmlake.trace import load

HERE = Path(__file__).parent
VARIANTS = {
    "gmlake (default)": {},
    "min_saved_chunks=0": {"min_saved_chunks": 0},
    "sblock_search_depth=64": {"sblock_search_depth": 64},
    "both": {"min_saved_chunks": 0, "sblock_search_depth": 64},
    "both + 4 MiB handles": {"min_saved_chunks": 0, "sblock_search_depth": 64, "chunk_size": 4 << 20},
    "8 MiB handles": {"chunk_size": 8 << 20},
}
GiB = 1 << 30


def quarters(trace, policy) -> list[tuple[int, float]]:
    """(stitches, driver seconds) in each quarter of the trace's requests."""
    n = len(trace.requests())
    out, before = [], (0, 0.0)
    for q in range(1, 5):
        alloc, _ = run_requests(trace, policy, upto=n * q // 4, samples=1)
        stats = alloc.stats()
        now = (stats["stitches"], driver_seconds(stats))
        out.append((now[0] - before[0], now[1] - before[1]))
        before = now
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path,
                        default=sorted((HERE / "results" / "traces").glob("*.gmtrace")))
    args = parser.parse_args()
    traces = [load(str(p)) for p in args.traces]

    print("### Where gmlake's reserved memory is at its peak\n")
    print("| trace | request that set the peak | reserved GiB | requested | free in shared chunks "
          "(fragments < 2 MiB) | free whole chunks | small pool free |")
    print("|---|---|---|---|---|---|---|")
    for t in traces:
        b = explain(t, get("gmlake"))
        count, _ = b.fragments["< 2 MiB"]
        print(f"| {t.name} | #{b.request_index} ({b.request_size / 2**20:.2f} MiB) | {b.reserved / GiB:.3f} | "
              f"{b.requested / b.reserved:.1%} | {b.free_in_shared_chunks / GiB:.3f} GiB ({count}) | "
              f"{b.free_whole_chunks / GiB:.3f} | {b.free_small / GiB:.3f} |")

    print("\n### When gmlake's driver time is spent (stitches / driver s per quarter of the requests)\n")
    print("| trace | Q1 | Q2 | Q3 | Q4 |")
    print("|---|---|---|---|---|")
    for t in traces:
        cells = [f"{s} / {d:.2f}" for s, d in quarters(t, get("gmlake"))]
        print(f"| {t.name} | " + " | ".join(cells) + " |")

    print("\n### Policy variants on replay (utilization / driver s over the run)\n")
    print("| variant | " + " | ".join(t.name for t in traces) + " |")
    print("|---|" + "---|" * len(traces))
    for label, knobs in VARIANTS.items():
        cells = []
        for t in traces:
            r = replay(t, get("gmlake", **knobs), samples=1)
            cells.append(f"{r.utilization:.3f} / {r.driver_seconds:.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for t in traces:
        r = replay(t, "expandable", samples=1)
        cells.append(f"{r.utilization:.3f} / {r.driver_seconds:.2f}")
    print("| expandable segments | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
