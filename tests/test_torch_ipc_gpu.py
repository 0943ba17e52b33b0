"""CUDA tensors shared between processes under gmlake through PyTorch's own paths (Note [Sharing a tensor through
PyTorch's handle] in gmlake/torch/_torch_bridge.pyx), on a GPU: each scenario of tests/gpu_scripts/torch_ipc.py in
its own process, with a timeout, the receivers spawned by it. All are expected to pass on one H100/H200 with torch
2.11 (driver 580); the sender's handle is PyTorch's expandable-segment format, which its receiver opens with
pidfd_getfd, so the machine must let a child take its parent's descriptors (as PyTorch's expandable segments need).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SCRIPT = Path(__file__).parent / "gpu_scripts" / "torch_ipc.py"


def run(scenario: str, timeout: int = 420, **env: str) -> dict:
    """The scenario's report; it must print ok. GMLAKE is left out so each side runs what IPC_SENDER and
    IPC_RECEIVER say."""
    base = {k: v for k, v in os.environ.items() if k not in ("GMLAKE", "GMLAKE_POLICY", "GMLAKE_KNOBS")}
    proc = subprocess.run([sys.executable, str(SCRIPT), scenario], capture_output=True, text=True, timeout=timeout,
                          env={**base, "PYTHONUNBUFFERED": "1", **env}, check=False)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-2:-1] == ["ok"], \
        f"{scenario} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not _cuda():
        pytest.skip("needs a CUDA device and torch")


@pytest.mark.parametrize("receiver", ["gmlake", "native"])
def test_a_queue_carries_a_256_mib_tensor_and_the_childs_write_comes_back(receiver):
    """torch.multiprocessing Queue put/get to a spawned child, which checks every element and adds one; the parent
    sees the write. A native receiver opens gmlake's handle with PyTorch's own code."""
    assert run("queue", IPC_RECEIVER=receiver)["sender"] == "gmlake"


def test_native_to_gmlake():
    """A native sender's handle (PyTorch's caching allocator) opened by a gmlake receiver."""
    assert run("queue", IPC_SENDER="native")["receiver"] == "gmlake"


def test_reduce_tensor_and_rebuild_cuda_tensor_in_a_spawned_child():
    run("reduce")


def test_a_stitched_block_is_shared_as_one_tensor():
    """A block stitched from three freed segments (gmlake-paper: a segment per request): the stats show the stitch,
    and the receiver maps its chunks back to back."""
    report = run("stitch", GMLAKE_POLICY="gmlake-paper")
    assert report["stitches"] == 1 and report["pages"] == 12


def test_the_sender_freeing_its_tensor_while_the_receiver_reads_reuses_nothing():
    """PyTorch's Note [Sharing CUDA tensors] keeps the sender's block while the receiver holds it: the sender's
    new tensors of the same size land elsewhere, and the receiver's bytes stay."""
    assert run("sender-frees")["reused"] is False


def test_a_receiver_killed_mid_hold_has_its_hold_released_by_the_senders_collect():
    """The child rebuilds the tensor and is SIGKILLed holding it; the sender frees its tensor, and its
    torch.cuda.ipc_collect() finds the hold file unlocked and releases torch's counter (Note [A receiver's hold the
    kernel drops] in gmlake/torch/sharing.py): the 64 MiB block is no longer allocated, and the sender goes on
    allocating and sharing."""
    report = run("receiver-killed")
    assert report["killed"] != 0
    assert report["held_mib"] - report["after_mib"] >= 64 and report["freed"], report
    assert report["holds_left"] == 0, report


@pytest.mark.parametrize("sender", ["gmlake", "native"])
def test_a_sender_exiting_while_its_block_is_held_exits_cleanly(sender):
    """The receiver is killed holding the block and nothing collects it: torch's limbo frees it from a static
    destructor after Python has finished, through gmlake's free (Note [Frees after the interpreter]). The sender exits
    0 (`run` checks the exit status), as under PyTorch's allocator."""
    assert run("sender-exits-held", IPC_SENDER=sender)["killed"] != 0


def test_an_unshareable_tensor_raises_in_the_sender_and_the_receiver_does_not_hang():
    """GMLAKE_IPC=0: Queue and JoinableQueue put (whose feeder thread pickles), SimpleQueue put, Pipe send and
    reduce_tensor each raise one line in the sender naming GMLAKE_IPC=1; the child's get times out, empty. A tensor
    inside an object reaches the feeder, and the get raises the same line."""
    report = run("refused-put", GMLAKE_IPC="0")
    assert len(report["errors"]) == 6, report


def test_a_block_on_pages_of_two_sizes_is_refused_in_the_sender_in_one_line():
    report = run("mixed-pages", GMLAKE_KNOBS="tail_page=2MiB")
    assert report["error"].startswith("gmlake: cannot share the CUDA tensor at 0x")
