"""The worker of `python -m bench replay-speed --against OLD`: run by path, with one checkout's root first on
PYTHONPATH, so that it times that checkout's gmlake. It imports nothing of bench (an old checkout may lay bench out
otherwise). Line protocol on stdin/stdout: 'names' -> the bundled traces and built-in policies; 'micro' -> the
core's cache hits on the sim driver; 'TRACE POLICY' -> one replay's events, seconds and stats."""
from __future__ import annotations

import json
import sys

STATS_COMPARED = ("allocs", "frees", "ooms", "stitches", "sblock_reuses", "sblock_evictions", "segments_created",
                  "peak_reserved_bytes", "calls")
MiB = 1 << 20


def _time_cache_hits():
    try:
        from bench.native import load  # this checkout's bench, built against the checkout's gmlake
        return load().time_cache_hits
    except ImportError:
        pass
    try:
        from gmlake._bench import time_cache_hits  # a checkout from before bench left the package
    except ImportError:
        from gmlake import bench_cache_hits as time_cache_hits  # from before the timing loop left its API
    return time_cache_hits


def micro(iterations: int = 200_000) -> dict:
    """The core's cache hits on the sim driver, as `bench micro` times them: ns per malloc+free, best of 3."""
    import gmlake
    from gmlake import Allocator, SimDriver

    timed = _time_cache_hits()
    out = {}
    alloc = Allocator(SimDriver())
    for label, size in (("exact_4KiB", 4096), ("exact_64MiB", 64 * MiB)):
        left, middle, right = (alloc.malloc(size) for _ in range(3))
        alloc.free(middle)
        out[label] = min(timed(alloc, size, iterations) for _ in range(3))
        for p in (left, right):
            alloc.free(p)
    alloc.empty_cache()
    out["split_4KiB"] = min(timed(alloc, 4096, iterations) for _ in range(3))
    alloc.close()
    alloc = Allocator(SimDriver(), gmlake.policies.get("gmlake-paper"))
    parts = [alloc.malloc(32 * MiB) for _ in range(4)]
    for p in parts:
        alloc.free(p)
    alloc.free(alloc.malloc(128 * MiB))
    out["stitched_128MiB"] = min(timed(alloc, 128 * MiB, iterations) for _ in range(3))
    alloc.close()
    return out


def serve() -> None:
    from gmlake import policies
    from gmlake.sim.replay import bundled_traces, run_requests
    from gmlake.sim.trace import load

    traces = {}
    for path in bundled_traces():
        trace = load(path)
        traces[trace.name] = trace
    for line in sys.stdin:
        words = line.split()
        if words == ["names"]:
            reply = {"traces": list(traces), "policies": policies.names()}
        elif words == ["micro"]:
            reply = micro()
        else:
            name, policy = words
            alloc, out = run_requests(traces[name], policy, samples=2000)
            stats = alloc.stats()
            reply = {"events": out["events"], "seconds": out["seconds"],
                     "stats": {k: stats.get(k) for k in STATS_COMPARED}}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
