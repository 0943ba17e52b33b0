"""A second Python thread keeps writing live tensors on its own stream while the main thread allocates at the cap
(docs/design.md, "Safety"): no write may be lost and the process must stay healthy.

The layout is reback.py's: under a 600 MiB cap, twenty 20 MiB pages each hold a live 6 MiB tensor and a freed 14 MiB
gap, and a 300 MiB tensor fits only if the gaps go back. Each round builds the layout, starts the writer (one
`add_(1)` per live tensor in turn, each launch counted per tensor), asks for the 300 MiB tensor while the writer runs,
lets the writer go on a while, then stops it and checks every element of every tensor against its start value plus
its count. The 300 MiB request may fail with an out-of-memory error or succeed; either is fine. Any other error, a
lost write, or a CUDA call failing afterwards fails the run.

The policy is the one GMLAKE_POLICY / GMLAKE_KNOBS choose (`gmlake run` reads them), so runs can be compared, e.g.
`GMLAKE_KNOBS=reback_slot=0`. One line starting "summary:" gives rounds, launches, lost writes and each round's
outcome of the big request; the last line is "ok" only if everything held.
"""
import os
import sys
import threading
import time

import torch

import gmlake.torch as gt

MiB = 1 << 20
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WRITE_AFTER_S = 0.5                 # the writer keeps going this long after the big request returns
PAGES, LIVE, GAP, BIG, CAP = 20, 6 * MiB, 14 * MiB, 300 * MiB, 600 * MiB


def is_oom(exc: BaseException) -> bool:
    """The big request's refusal: torch's OutOfMemoryError, or the bridge's RuntimeError saying so."""
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


class Writer(threading.Thread):
    """Adds 1 to each tensor in turn on its own stream, counting its launches per tensor, until stopped."""

    def __init__(self, tensors: list) -> None:
        super().__init__(daemon=True)
        self.tensors = tensors
        self.counts = [0] * len(tensors)
        self.stop = threading.Event()
        self.started_pass = threading.Event()   # set once every tensor has been written at least once
        self.error: BaseException | None = None

    def run(self) -> None:
        stream = torch.cuda.Stream()
        try:
            stream.wait_stream(torch.cuda.default_stream())    # the tensors' fills come first
            with torch.cuda.stream(stream):
                while not self.stop.is_set():
                    for i, t in enumerate(self.tensors):
                        t.add_(1)
                        self.counts[i] += 1
                    self.started_pass.set()
            stream.synchronize()
        except BaseException as exc:  # noqa: BLE001 - the main thread reports it
            self.error = exc
            self.started_pass.set()


def one_round(r: int, outcomes: list) -> tuple[int, int, str | None]:
    """One round; returns (launches, lost writes, the writer's error if any)."""
    keep, gaps = [], []
    for i in range(PAGES):
        keep.append(torch.full((LIVE // 4,), 1000 * r + i, dtype=torch.int32, device="cuda"))
        gaps.append(torch.empty(GAP // 4, dtype=torch.int32, device="cuda"))
    del gaps
    torch.cuda.synchronize()
    starts = [1000 * r + i for i in range(PAGES)]
    rebacked = gt.allocator().stats()["rebacked_chunks"]
    writer = Writer(keep)
    writer.start()
    writer.started_pass.wait(timeout=60)
    big = None
    try:
        big = torch.ones(BIG // 4, dtype=torch.int32, device="cuda")
        outcome = "fit"
    except Exception as exc:     # an out-of-memory error is an allowed outcome, anything else is not
        if not is_oom(exc):
            writer.stop.set()
            writer.join(timeout=60)
            raise
        outcome = "oom"
    time.sleep(WRITE_AFTER_S)
    writer.stop.set()
    writer.join(timeout=120)
    if writer.is_alive():
        raise RuntimeError(f"round {r}: the writer did not stop")
    if writer.error is not None:
        outcomes.append(outcome)
        return sum(writer.counts), 0, f"round {r}: the writer failed: {writer.error!r}"
    torch.cuda.synchronize()
    lost = 0
    for i, t in enumerate(keep):
        want = starts[i] + writer.counts[i]
        wrong = int((t != want).sum())
        if wrong:
            lost += 1
            print(f"round {r}: tensor {i} lost writes: {wrong} elements differ from {want} "
                  f"(min {int(t.min())}, max {int(t.max())})", flush=True)
    # compared, not summed: a sum accumulates in int64, through a copy twice the tensor's size that the cap refuses
    if big is not None and bool((big != 1).any()):
        raise RuntimeError(f"round {r}: the big tensor lost its values")
    rebacked = gt.allocator().stats()["rebacked_chunks"] - rebacked
    outcomes.append(f"{outcome}(rebacked {rebacked})")
    print(f"round {r}: big request {outcome}, {sum(writer.counts)} launches, {lost} tensors lost writes, "
          f"{rebacked} chunks re-backed", flush=True)
    del keep, big
    torch.cuda.empty_cache()
    return sum(writer.counts), lost, None


def main() -> int:
    policy = gt.allocator().policy
    print(f"policy {policy.name}: reback_slot={policy.reback_slot} device_reserve={policy.device_reserve}",
          flush=True)
    torch.cuda.set_per_process_memory_fraction(CAP / torch.cuda.get_device_properties(0).total_memory)
    launches = lost = rounds = 0
    outcomes: list[str] = []
    failure = None
    try:
        for r in range(ROUNDS):
            n, bad, failure = one_round(r, outcomes)
            launches += n
            lost += bad
            rounds += 1
            if failure:
                break
        if failure is None:
            # the process is healthy: a later kernel runs and its result comes back
            torch.cuda.synchronize()
            if float(torch.arange(1000, device="cuda", dtype=torch.float32).sum()) != 499500.0:
                failure = "a CUDA op after the rounds gave a wrong result"
    except BaseException as exc:  # noqa: BLE001 - reported on the summary line
        failure = f"{type(exc).__name__}: {exc}"
    print(f"summary: rounds={rounds} launches={launches} lost_writes={lost} big_request={outcomes} "
          f"failure={failure}", flush=True)
    if failure or lost or rounds < ROUNDS:
        return 1
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
