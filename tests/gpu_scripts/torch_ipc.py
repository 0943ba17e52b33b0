"""CUDA tensors between processes through torch.multiprocessing, the sender and the receiver each running gmlake or
PyTorch's native allocator (Note [Sharing a tensor through PyTorch's handle] in gmlake/torch/_torch_bridge.pyx).

Usage: torch_ipc.py SCENARIO, SCENARIO one of queue, reduce, stitch, sender-frees, receiver-killed,
sender-exits-held, mixed-pages, refused-put.
IPC_SENDER and IPC_RECEIVER (gmlake, the default, or native) say which allocator each side runs; gmlake is enabled
with the GMLAKE_* settings (GMLAKE_POLICY, GMLAKE_KNOBS). Children are spawned; every wait has a timeout, so a
failure ends the script instead of hanging it. Prints "ok" and a JSON line of what it saw; exits 1 otherwise.
"""
from __future__ import annotations

import json
import os
import queue
import sys
import traceback

ROLE = os.environ.get("IPC_ROLE", "sender")
SIDE = os.environ.get("IPC_RECEIVER" if ROLE == "receiver" else "IPC_SENDER", "gmlake")
if SIDE == "gmlake":
    from gmlake.torch.install import enable_from_env

    enable_from_env()

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import reduce_tensor

MiB = 1 << 20
WAIT = 120                      # seconds any one wait may take


def _gmlake_stats() -> dict:
    from gmlake.torch import _torch_bridge

    return _torch_bridge.allocator(0).stats() if SIDE == "gmlake" else {}


def child(inbox, outbox, mode: str) -> None:
    """The receiver: take the tensor (from the queue, or rebuild it from reduce_tensor's args), check it holds
    `expect` everywhere, add one and report; in hold mode, then wait for the parent's word and check again."""
    try:
        if mode == "wait":                  # refused-put: nothing may come, and the get must not hang
            try:
                item = inbox.get(timeout=5)
            except queue.Empty:
                outbox.put(("empty", {}))
                return
            outbox.put(("error", f"the receiver got {item!r}"))
            return
        item = inbox.get(timeout=WAIT)
        if mode == "reduce":
            rebuild, args, expect = item
            x = rebuild(*args)
        else:
            x, expect = item
        seen = {"first": float(x[0]), "all": bool(torch.all(x == expect)), "numel": x.numel()}
        if mode == "hold":
            outbox.put(("holding", seen))
            word = inbox.get(timeout=WAIT)
            if word == "sleep":
                import time

                time.sleep(3600)            # the parent kills this process here
            seen["after"] = bool(torch.all(x == expect))
        else:
            x.add_(1)
        torch.cuda.synchronize()
        del x
        outbox.put(("ok", seen))
    except BaseException:               # noqa: BLE001 - reported to the parent, which fails
        outbox.put(("error", traceback.format_exc()))


def _spawn(mode: str):
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    os.environ["IPC_ROLE"] = "receiver"            # read by the child at import, before torch
    proc = ctx.Process(target=child, args=(inbox, outbox, mode), daemon=True)
    proc.start()
    os.environ["IPC_ROLE"] = "sender"
    return proc, inbox, outbox


def _answer(outbox, proc, want: str = "ok") -> dict:
    tag, what = outbox.get(timeout=WAIT)
    if tag != want:
        proc.kill()
        raise AssertionError(f"the receiver said {tag}: {what}")
    return what


def _finish(proc) -> None:
    proc.join(WAIT)
    if proc.is_alive():
        proc.kill()
        raise AssertionError("the receiver did not exit")
    assert proc.exitcode == 0, f"the receiver exited {proc.exitcode}"


def round_trip(t: torch.Tensor, value: float, mode: str = "queue") -> dict:
    """Send `t` (all `value`) to a new receiver, which adds one; check the parent sees it."""
    proc, inbox, outbox = _spawn(mode)
    if mode == "reduce":
        rebuild, args = reduce_tensor(t)
        inbox.put((rebuild, args, value))
    else:
        inbox.put((t, value))
    seen = _answer(outbox, proc)
    _finish(proc)
    assert seen["all"] and seen["numel"] == t.numel(), seen
    torch.cuda.synchronize()
    assert bool(torch.all(t == value + 1)), "the receiver's write must land in the sender's tensor"
    return seen


class Holder:
    """A tensor inside an object: pickled whole by the feeder thread, not looked into by put."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def full(nbytes: int, value: float) -> torch.Tensor:
    return torch.full((nbytes // 4,), value, device="cuda", dtype=torch.float32)


def main(scenario: str) -> dict:
    torch.cuda.init()
    report: dict = {"scenario": scenario, "sender": SIDE, "receiver": os.environ.get("IPC_RECEIVER", "gmlake")}
    if scenario in ("queue", "reduce"):
        t = full(256 * MiB, 1.0)
        round_trip(t, 1.0, scenario)
    elif scenario == "stitch":
        # Three blocks freed apart, a guard after them; a request of their sum only a stitch serves
        # (the gmlake-paper policy: a segment per request, 2 MiB chunks).
        parts = [torch.empty(8 * MiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
        guard = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        before = _gmlake_stats()["stitches"]
        del parts
        t = full(24 * MiB, 7.0)
        report["stitches"] = _gmlake_stats()["stitches"] - before
        assert report["stitches"] == 1, report
        from gmlake.torch import _torch_bridge

        report["pages"] = len(_torch_bridge.share_ipc(t.data_ptr())[2])
        round_trip(t, 7.0)
        del guard
    elif scenario == "sender-frees":
        t = full(256 * MiB, 3.0)
        old = t.data_ptr()
        proc, inbox, outbox = _spawn("hold")
        inbox.put((t, 3.0))
        _answer(outbox, proc, "holding")
        del t                                       # PyTorch keeps the block while the receiver holds it
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()                    # the receiver's hold is live: nothing released
        again = [full(256 * MiB, 5.0) for _ in range(3)]
        torch.cuda.synchronize()
        report["reused"] = any(u.data_ptr() == old for u in again)
        inbox.put("check")
        seen = _answer(outbox, proc)
        _finish(proc)
        assert seen["after"], "the receiver's bytes changed after the sender freed its tensor"
        assert not report["reused"], "the sender reused a block a receiver held"
        assert all(bool(torch.all(u == 5.0)) for u in again)
        del again
        torch.cuda.ipc_collect()
    elif scenario == "receiver-killed":
        # Note [A receiver's hold the kernel drops] (gmlake/torch/sharing.py): the killed receiver never decrements
        # torch's counter; the sender's collect finds its hold file taken and unlocked, and releases it.
        t = full(64 * MiB, 4.0)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        proc, inbox, outbox = _spawn("hold")
        inbox.put((t, 4.0))
        _answer(outbox, proc, "holding")
        torch.cuda.ipc_collect()                    # a live receiver's hold stays
        inbox.put("sleep")
        proc.kill()
        proc.join(WAIT)
        report["killed"] = proc.exitcode
        del t
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()        # the block is in torch's limbo
        torch.cuda.ipc_collect()
        after = torch.cuda.memory_allocated()
        report.update(before_mib=before / MiB, held_mib=held / MiB, after_mib=after / MiB,
                      freed=before - after >= 64 * MiB)
        if SIDE == "gmlake":
            from gmlake.torch import sharing

            report["holds_left"] = len(sharing.HOLDS)
        u = full(64 * MiB, 6.0)                     # the sender goes on: allocates, and shares again
        round_trip(u, 6.0)
    elif scenario == "sender-exits-held":
        # Note [Frees after the interpreter] (gmlake/torch/_torch_bridge.pyx): the receiver dies holding the block
        # and nothing collects, so torch's limbo still holds it when the sender exits; its static destructor frees
        # it after Python has finished. The sender must exit 0, as under PyTorch's allocator (which warns).
        t = full(16 * MiB, 3.0)
        proc, inbox, outbox = _spawn("hold")
        inbox.put((t, 3.0))
        _answer(outbox, proc, "holding")
        proc.kill()
        proc.join(WAIT)
        report["killed"] = proc.exitcode
        del t
    elif scenario == "refused-put":
        # Note [The sender's check before the feeder] (gmlake/torch/sharing.py): under GMLAKE_IPC=0 every way of
        # sending raises in the sender, in one line, and the receiver's get does not wait forever.
        t = full(8 * MiB, 2.0)
        proc, inbox, outbox = _spawn("wait")
        ctx = mp.get_context("spawn")
        joinable, simple, (_, pipe_end) = ctx.JoinableQueue(), ctx.SimpleQueue(), ctx.Pipe()
        errors = {}
        for name, send in (("Queue", inbox.put), ("JoinableQueue", joinable.put), ("SimpleQueue", simple.put),
                           ("Pipe", pipe_end.send), ("reduce_tensor", reduce_tensor)):
            try:
                send([(t, 2.0)] if name != "reduce_tensor" else t)
            except RuntimeError as exc:
                errors[name] = str(exc).splitlines()[0]
        hidden = ctx.Queue()                        # a tensor inside an object put does not walk: the feeder meets
        hidden.put(Holder(t))                       # it, and the get raises the sender's line
        try:
            hidden.get(timeout=WAIT)
        except RuntimeError as exc:
            errors["hidden (get)"] = str(exc).splitlines()[0]
        report["errors"] = errors
        _answer(outbox, proc, "empty")
        _finish(proc)
        assert sorted(errors) == ["JoinableQueue", "Pipe", "Queue", "SimpleQueue", "hidden (get)", "reduce_tensor"], \
            errors
        for line in errors.values():
            assert line.startswith("gmlake: cannot share the CUDA tensor at 0x") and "GMLAKE_IPC=1" in line, line
    elif scenario == "mixed-pages":
        # tail_page maps the last page of a large block in smaller pages: PyTorch's handle cannot hold both sizes,
        # and the sender's reduce_tensor says so itself.
        t = full(21 * MiB, 1.0)
        try:
            reduce_tensor(t)
        except RuntimeError as exc:
            report["error"] = str(exc).splitlines()[0]
        assert "error" in report, "sharing a block on pages of two sizes must fail in the sender"
        assert "pages of 2 sizes" in report["error"] and "tail_page" in report["error"], report["error"]
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    return report


if __name__ == "__main__":
    result = main(sys.argv[1] if len(sys.argv) > 1 else "queue")
    print("ok")
    print(json.dumps(result))
