"""Replay analysis, not part of the bench tool: at the default policy's first out-of-memory on a device of
gmlake-paper's smallest size, what re-backing the live parts of partly used 20 MiB pages with 2 MiB handles would
free, and what it would cost at the H200's prices (gmlake/sim/data/driver_costs_h200.json).

    python bench/results/sim-2026-12-02-reback/first_oom.py TRACE      (from the repository root)

first_oom.txt is its output on the ten traces where the default needs a larger device than the paper."""
import sys

sys.path.insert(0, ".")

from gmlake.sim.cap import smallest_device_memory
from gmlake.sim.replay import driver_costs, run_requests
from gmlake.sim.trace import load

SLOT = 2 << 20
MiB = 1 << 20


def main(path: str) -> None:
    trace = load(path)
    req = trace.requests()
    device = smallest_device_memory(trace, "gmlake-paper", 2e-4)[0]
    if run_requests(trace, "gmlake", device_memory=device, samples=1)[1]["ooms"] == 0:
        print(f"{trace.name}: fits at the paper's size")
        return
    lo, hi = 0, len(req)           # the first request that fails: every prefix up to lo fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run_requests(trace, "gmlake", device_memory=device, upto=mid, samples=1)[1]["ooms"]:
            hi = mid
        else:
            lo = mid
    alloc, _ = run_requests(trace, "gmlake", device_memory=device, upto=lo, samples=1)
    size = int(req["size"][lo])
    mapped = whole_free = slots = pages = handles = 0
    for seg in alloc.segments_info():
        chunk = seg["chunk_size"]
        mapped += seg["mapped_chunks"] * chunk
        if seg["pool"] != "large":
            continue
        live = [False] * (seg["size"] // SLOT)
        used = [False] * (seg["size"] // chunk)
        for off, sz, state, *_ in seg["blocks"]:
            if state == "unmapped":
                continue
            for c in range(off // chunk, (off + sz - 1) // chunk + 1):
                used[c] = True
            if state in ("allocated", "claimed"):
                for g in range(off // SLOT, (off + sz - 1) // SLOT + 1):
                    live[g] = True
        per = chunk // SLOT
        for c in (c for c in range(len(used)) if used[c]):
            n_live = sum(live[c * per:(c + 1) * per])
            if n_live == 0:
                whole_free += chunk
            elif n_live < per:
                slots += (per - n_live) * SLOT
                pages += 1
                handles += n_live
    prices = driver_costs()["per_handle"]
    ms = (handles * (prices["create_chunk"] + prices["map"] + prices["set_access"])
          + pages * (prices["unmap"] + prices["release_chunk"])) / 1000
    room = device - mapped + whole_free + slots
    print(f"{trace.name}: request {size / MiB:.1f} MiB; device free {(device - mapped) / MiB:.0f} + whole free pages "
          f"{whole_free / MiB:.0f} + slots re-backing frees {slots / MiB:.0f} = {room / MiB:.0f} MiB -> "
          f"{'enough' if room >= size else 'short'}; {pages} pages, {handles} handles, "
          f"{handles * SLOT / MiB:.0f} MiB copied, ~{ms:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
