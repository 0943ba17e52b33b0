"""The behaviour-identity check of the allocator core: what every policy decides on a fixed set of replays.

    python tests/identity.py --write     # record tests/data/identity-before.json from this tree
    python tests/identity.py             # replay the same and compare (exit 1 naming each difference)

A restructuring of the core must not change a decision: every built-in policy, on every bundled trace and the traces
in tests/data, plus caps that bring memory pressure (and out-of-memory), FSDP's streams with the GPU trailing, knob
variants and the Python / Cython seams of gmlake.policies.examples, replays to the same peak reserved, peak
allocated, stitches, driver calls by kind and out-of-memory count as the recorded file says. The whole set replays
in seconds on a CPU, so tests/test_identity.py runs all of it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEFORE = HERE / "data" / "identity-before.json"
FSDP_TRACE = HERE / "data" / "fsdp-pattern.pickle.gz"
POLICIES = ("gmlake", "gmlake-paper", "caching", "expandable")
MiB = 1 << 20
# Knob variants the built-ins' paths branch on (stitch thresholds, split rules, sBlock order, streams).
VARIANTS = ("gmlake-paper[min_saved_chunks=3]", "gmlake-paper[min_saved_chunks=0]", "gmlake-paper[chunk_size=8MiB]",
            "gmlake-paper[min_stitch_size=32MiB]", "gmlake-paper[sblock_first=false,max_cached_sblocks=2]",
            "gmlake[stitch=false]", "gmlake[sblock_first=true]", "gmlake[min_saved_chunks=0]",
            "expandable[stitch=true]", "caching[max_split_size=64MiB]", "caching[cross_stream=true]")
EXAMPLES = ("worst-fit", "worst-fit-cython", "keep-large-blocks-whole", "smallest-pieces-first",
            "no-small-stitches", "large-segments", "evict-only-what-frees", "sync-before-releasing")
KEPT_STATS = ("peak_reserved_bytes", "peak_allocated_bytes", "reserved_bytes", "allocated_bytes", "stitches",
              "stitched_handles", "sblock_reuses", "sblock_evictions", "segments_created", "chunks_released", "ooms",
              "stream_migrations", "stream_waits", "capture_queries", "cached_sblocks", "pending_frees")


def _traces() -> dict[str, Path]:
    from gmlake.sim.replay import bundled_traces

    paths = {p.name: p for p in bundled_traces()}
    for p in sorted((HERE / "data").glob("*.pickle.gz")):
        paths[p.name] = p
    return paths


def _example(name: str):
    from gmlake.policies import examples

    for value in vars(examples).values():
        if isinstance(value, type) and getattr(value, "__dict__", {}).get("name") == name:
            return value()
    raise KeyError(name)


def _record(trace, spec: str, cap: int = 0, event_lag: int = 0) -> dict:
    from gmlake.policies import resolve
    from gmlake.sim.replay import run_requests

    policy = _example(spec) if spec in EXAMPLES else resolve(spec).policy
    alloc, out = run_requests(trace, policy, samples=1, cap=cap, event_lag=event_lag)
    stats = alloc.stats()
    row = {key: stats[key] for key in KEPT_STATS}
    row["replay_ooms"] = out["ooms"]
    row["driver_calls"] = sum(stats["calls"].values())
    row["calls"] = {k: v for k, v in stats["calls"].items() if v}
    row["handles"] = {k: v for k, v in stats["handles"].items() if v}
    return row


def scenarios(before: dict | None = None) -> list[tuple[str, str, str, int, int]]:
    """(key, trace file, policy spec, cap, event lag) of every replay. Caps are data: the file records them (a cap
    3 % over the trace's peak allocated under gmlake, which brings pressure, and one 2 % under, which runs out)."""
    from gmlake.sim.trace import load

    out = []
    traces = _traces()
    for name in traces:
        for spec in POLICIES:
            out.append((f"{name}|{spec}", name, spec, 0, 0))
    for name in traces:
        if name == FSDP_TRACE.name:
            continue
        for tag, factor in (("cap-over", 1.03), ("cap-under", 0.98)):
            key = f"{name}|cap|{tag}"
            if before is not None:
                cap = before["caps"][key]
            else:
                from gmlake.sim.replay import run_requests

                _, free_run = run_requests(load(traces[name]), "gmlake", samples=1)
                cap = int(free_run["peak_allocated"] * factor) // MiB * MiB
            for spec in POLICIES:
                out.append((f"{key}|{spec}", name, spec, cap, 0))
    for lag in (3, 1000):
        for spec in POLICIES:
            out.append((f"{FSDP_TRACE.name}|lag{lag}|{spec}", FSDP_TRACE.name, spec, 0, lag))
    for name in ("tiny-gpt2-native.pickle.gz", "opt350m-full-ckpt-native.gmtrace"):
        for spec in VARIANTS:
            out.append((f"{name}|{spec}", name, spec, 0, 0))
    for spec in EXAMPLES:
        out.append((f"tiny-gpt2-native.pickle.gz|{spec}", "tiny-gpt2-native.pickle.gz", spec, 0, 0))
        out.append((f"tiny-gpt2-native.pickle.gz|cap|{spec}", "tiny-gpt2-native.pickle.gz", spec, 1900 * MiB, 0))
    return out


def run(before: dict | None = None) -> dict:
    from gmlake.sim.trace import load

    traces = _traces()
    loaded = {}
    result: dict = {"caps": {}, "replays": {}}
    for key, name, spec, cap, lag in scenarios(before):
        if name not in loaded:
            loaded[name] = load(traces[name])
        if "|cap|cap-" in key:
            result["caps"][key.rsplit("|", 1)[0]] = cap
        result["replays"][key] = _record(loaded[name], spec, cap, lag)
    return result


def differences(before: dict, after: dict) -> list[str]:
    out = []
    for key, row in before["replays"].items():
        got = after["replays"].get(key)
        if got is None:
            out.append(f"{key}: not replayed")
            continue
        for field, value in row.items():
            if got.get(field) != value:
                out.append(f"{key}: {field} {value} before, {got.get(field)} now")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"record {BEFORE.relative_to(HERE.parent)} from this tree")
    args = p.parse_args(argv)
    if args.write:
        BEFORE.write_text(json.dumps(run(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {BEFORE}")
        return 0
    before = json.loads(BEFORE.read_text())
    found = differences(before, run(before))
    for line in found:
        print(line)
    print(f"{len(before['replays'])} replays, {len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
