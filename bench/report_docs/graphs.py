"""docs/graphs.md's generated sections: the CUDA graph runs and replays docs/benchmarks.md records, in words."""
from __future__ import annotations

from collections.abc import Callable

from bench import ROOT
from bench.report_docs.benchmarks import GRAPHS, MICRO, _graph_replays, _graph_runs, _loss_gap, _sci
from bench.report_docs.common import GiB, _fill, _json

DOC = ROOT / "docs" / "graphs.md"


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


TABLES: dict[str, Callable[[], str]] = {"graphs-replay": graphs_replay, "capture-query": capture_query,
                                        "graphs-measured": graphs_measured}
