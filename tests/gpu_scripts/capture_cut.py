"""Cuts at reuse on the main thread while another thread captures CUDA graphs in global mode (Note [A cut under
another thread's capture]). Run under gmlake with GMLAKE_KNOBS=tail_page=2MiB,cut_at_reuse=1000
(tests/test_capture_gpu.py does): the main thread grows memory and reuses it so that requests cut pages (each cut
synchronizes the device); a second thread captures a graph with torch.cuda.graph on its own stream, in global mode,
over and over, allocating inside each capture, and replays each graph, checking its output. Both threads finish,
every replay gives the right values, no error; the main thread's tensors keep theirs. Prints one JSON line."""
import json
import sys
import threading
import time

import torch

import gmlake.torch as gt

MiB = 1 << 20
SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
ROUNDS = 150                                # the main thread's rounds: 60 MiB of new memory each, 9 GiB in all
errors: list[str] = []
stop = threading.Event()
counts = {"graphs": 0, "replays_checked": 0}


def capture_graphs() -> None:
    try:
        side = torch.cuda.Stream()
        x = torch.full((MiB // 4,), 1.0, device="cuda")
        torch.cuda.synchronize()
        i = 0
        while not stop.is_set():
            i += 1
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=side, capture_error_mode="global"):
                y = x * 2 + float(i)
                z = torch.empty(25 * MiB // 4, device="cuda")      # grows the graph's pool inside the capture
                z.fill_(float(i))
                w = y.sum() + z[:16].sum()
            for scale in (1.0, 3.0):                       # the second replay reads an input changed since capture
                x.fill_(scale)
                g.replay()
                torch.cuda.current_stream().synchronize()
                want = (2.0 * scale + i) * (MiB // 4) + 16.0 * i
                if abs(float(w) - want) > 1e-3 * want:
                    errors.append(f"graph {i}: replay gave {float(w)}, expected {want}")
                    return
                counts["replays_checked"] += 1
            counts["graphs"] += 1
            del g, y, z, w
    except Exception as exc:  # noqa: BLE001 - reported in the JSON line
        errors.append(f"capture thread: {exc!r}")


def main() -> None:
    stream = torch.cuda.Stream()            # the main thread's work on a stream of its own: no sync with the capture
    keep: list[tuple[torch.Tensor, float]] = []
    thread = threading.Thread(target=capture_graphs)
    thread.start()
    deadline = time.monotonic() + SECONDS
    rounds = 0
    try:
        with torch.cuda.stream(stream):
            while time.monotonic() < deadline and not errors and rounds < ROUNDS:
                rounds += 1
                a = torch.empty(40 * MiB // 4, device="cuda")         # new memory: a new high, the run lays out
                k = torch.empty(20 * MiB // 4, device="cuda")
                k.fill_(float(rounds))
                keep.append((k, float(rounds)))
                del a
                b = torch.empty(25 * MiB // 4, device="cuda")         # reuses a's run, ends inside its 2nd page: a cut
                b.fill_(-float(rounds))
                keep.append((b, -float(rounds)))
                time.sleep(SECONDS / ROUNDS)                          # rounds spread over the run's seconds
    finally:
        stop.set()
        thread.join(timeout=120)
    torch.cuda.synchronize()
    bad = [v for t, v in keep if not bool(torch.all(t == v))]
    s = gt.allocator().stats()
    result = {"rounds": rounds, **counts, "cuts": s["tails_cut_at_reuse"], "synchronizes": s["calls"]["synchronize"],
              "errors": errors, "tensors_changed": len(bad), "thread_alive": thread.is_alive()}
    print(json.dumps(result), flush=True)
    assert not thread.is_alive() and not errors and not bad, result
    assert counts["graphs"] >= 5 and s["tails_cut_at_reuse"] >= 5, result
    print("ok")


main()
