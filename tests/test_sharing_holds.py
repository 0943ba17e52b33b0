"""gmlake/torch/sharing.py on a CPU: the sender's check before a queue's feeder thread pickles (Note [The sender's
check before the feeder]) with a stand-in tensor, and the holds that let a sender release what a killed receiver held
(Note [A receiver's hold the kernel drops]) over real processes, with a counter file laid out as torch's. The GPU run
through torch.multiprocessing: tests/test_torch_ipc_gpu.py (refused-put, receiver-killed)."""
from __future__ import annotations

import json
import multiprocessing
import os
import queue
import signal
import struct
import subprocess
import sys
import types
from multiprocessing import queues

import pytest

from gmlake.torch import sharing

COUNTER = b"/torch_4242_77_0"
SLOTS = 8


class FakeTensor:
    """What the put check asks of a tensor: is_cuda, and whether gmlake can share its block."""

    def __init__(self, cuda: bool = True, shareable: bool = True) -> None:
        self.is_cuda, self.shareable = cuda, shareable


def is_cuda(obj) -> bool:
    return isinstance(obj, FakeTensor) and obj.is_cuda


def refuse(tensor) -> None:
    if not tensor.shareable:
        raise RuntimeError("gmlake: cannot share the CUDA tensor at 0x1000 with another process: a reason")


def seen_by_the_walk(obj) -> list:
    seen: list = []
    sharing.find_unshareable(obj, is_cuda, seen.append)
    return seen


def test_the_walk_finds_cuda_tensors_in_containers_and_nowhere_else():
    a, b, c, cpu = FakeTensor(), FakeTensor(), FakeTensor(), FakeTensor(cuda=False)
    assert seen_by_the_walk(a) == [a]
    assert seen_by_the_walk([1, "x", (a, {"k": b}), {c}, cpu]) == [a, b, c]
    hidden = types.SimpleNamespace(t=a)             # an object's attributes are not walked
    assert seen_by_the_walk([hidden, b"bytes", 3.0]) == []
    deep = a
    for _ in range(sharing.MAX_DEPTH):
        deep = [deep]
    assert seen_by_the_walk(deep) == [a] and seen_by_the_walk([deep]) == []


@pytest.fixture
def put_check():
    sharing.install_put_check(is_cuda, refuse)
    yield
    sharing.restore_puts()


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue"])
def test_put_raises_in_the_sender_and_queues_nothing(put_check, kind):
    q = getattr(multiprocessing.get_context("spawn"), kind)()
    with pytest.raises(RuntimeError, match=r"^gmlake: cannot share the CUDA tensor at 0x1000") as info:
        q.put(("weights", [FakeTensor(shareable=False)]))
    assert "\n" not in str(info.value)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.3)
    q.put({"ok": FakeTensor(), "cpu": FakeTensor(cuda=False, shareable=False)})
    got = q.get(timeout=10)
    assert got["ok"].is_cuda and not got["cpu"].is_cuda
    q.close()
    q.join_thread()


class Hides:
    """An object the put check does not walk, whose pickling meets a tensor gmlake refuses (as torch's reducer
    would raise in the feeder thread)."""

    def __reduce__(self):
        raise RuntimeError("gmlake: cannot share the CUDA tensor at 0x2000 with another process: hidden\nmore")


class Broken:
    def __reduce__(self):
        raise TypeError("not gmlake's")


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue"])
def test_a_refusal_the_check_missed_reaches_the_receivers_get(put_check, kind, capsys):
    """The feeder thread's refusal goes on to the receiver, whose get raises it instead of waiting forever; any other
    pickling error is left as the standard library has it (printed, nothing sent); the queue stays usable."""
    q = getattr(multiprocessing.get_context("spawn"), kind)(maxsize=2)
    q.put(Hides())
    with pytest.raises(RuntimeError, match=r"^gmlake: cannot share the CUDA tensor at 0x2000 .*: hidden \(raised in "
                                           r"the sender's queue feeder thread\)$"):
        q.get(timeout=10)
    q.put(Broken())
    with pytest.raises(queue.Empty):
        q.get(timeout=0.5)
    assert "not gmlake's" in capsys.readouterr().err
    for n in range(2):          # the bounded semaphore counts right: two fit, and come back
        q.put(n)
    assert [q.get(timeout=10), q.get(timeout=10)] == [0, 1]
    q.close()
    q.join_thread()


def test_restored_puts_are_the_standard_librarys():
    names = ("put", "_on_queue_feeder_error")
    before = [queues.Queue.__dict__[n] for n in names] + [queues.JoinableQueue.__dict__["put"]]
    sharing.install_put_check(is_cuda, refuse)
    assert queues.Queue.__dict__["put"] is not before[0]
    sharing.restore_puts()
    after = [queues.Queue.__dict__[n] for n in names] + [queues.JoinableQueue.__dict__["put"]]
    assert after[0] is before[0] and after[2] is before[2]
    assert isinstance(after[1], staticmethod) and after[1].__func__ is before[1].__func__


# ---------------------------------------------------------------- holds over real processes

RECEIVER = """
import os, sys, time
from gmlake.torch import sharing
sharing.HOLD_DIR, counter_path, offset, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def torch_deleter():                  # what torch's receiver does when its storage dies: decrement the counter
    with open(counter_path, "r+b") as f:
        f.seek(64 + 8 * offset)
        value = int.from_bytes(f.read(8), "little", signed=True)
        f.seek(64 + 8 * offset)
        f.write((value - 1).to_bytes(8, "little", signed=True))
fd = sharing.take(COUNTER, offset)
print("taken" if fd is not None else "none", flush=True)
if mode == "release":                 # the storage dies: the finalizer, then torch's deleter
    sharing.release(fd)
    torch_deleter()
elif mode == "exit-after-deleter":    # at exit torch's deleter ran, the finalizer did not
    torch_deleter()
elif mode == "hold":                  # killed here
    time.sleep(3600)
# "exit-holding": the storage leaked at exit, neither ran
""".replace("COUNTER", repr(COUNTER))


@pytest.fixture
def counters(tmp_path, monkeypatch):
    """A counter file laid out as torch's (a 64-byte header, then one int64 per share, each 1 when sent), the hold
    files beside it, and the sender's release: decrement, as torch's _release_ipc_counter does."""
    monkeypatch.setattr(sharing, "HOLD_DIR", str(tmp_path))
    monkeypatch.setattr(sharing, "COUNTER_DIR", str(tmp_path))
    path = tmp_path / COUNTER.decode().lstrip("/")
    path.write_bytes(bytes(64) + struct.pack(f"<{SLOTS}q", *([1] * SLOTS)))
    released: list = []

    def release_counter(counter, offset, device):
        assert counter == COUNTER
        released.append((offset, device))
        values = list(struct.unpack(f"<{SLOTS}q", path.read_bytes()[64:]))
        values[offset] -= 1
        path.write_bytes(bytes(64) + struct.pack(f"<{SLOTS}q", *values))

    def values():
        return [sharing.read_counter(COUNTER, i) for i in range(SLOTS)]

    return types.SimpleNamespace(dir=tmp_path, path=path, release=release_counter, released=released, values=values)


def receiver(counters, offset: int, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, str(counters.dir), str(counters.path), str(offset), mode],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "taken"
    return proc


def test_the_sender_releases_only_what_a_dead_receiver_held(counters):
    holds = sharing.Holds()
    for offset in range(6):
        holds.add(COUNTER, offset, 0)
    killed = receiver(counters, 0, "hold")
    normal = receiver(counters, 1, "release")
    holding = receiver(counters, 2, "hold")
    leaked_at_exit = receiver(counters, 4, "exit-holding")
    deleter_ran = receiver(counters, 5, "exit-after-deleter")
    # offset 3: sent, never received (a message still in a queue)
    for proc in (normal, leaked_at_exit, deleter_ran):
        assert proc.wait(30) == 0
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(30) == -signal.SIGKILL
    states = [sharing.state_of(sharing.hold_path(COUNTER, i)) for i in range(6)]
    assert states == ["taken", "released", "held", "sent", "taken", "taken"]

    assert holds.collect(sharing.read_counter, counters.release) == 2
    assert sorted(counters.released) == [(0, 0), (4, 0)]
    assert counters.values()[:6] == [0, 0, 1, 1, 0, 0]       # nothing released twice, nothing held released
    assert len(holds) == 2                                    # the held share and the one never received
    assert sorted(p.name for p in counters.dir.iterdir() if p.name.startswith("gmlake_hold")) == \
        [os.path.basename(sharing.hold_path(COUNTER, i)) for i in (2, 3)]

    holding.kill()
    holding.wait(30)
    assert holds.collect(sharing.read_counter, counters.release) == 1
    assert counters.values()[:6] == [0, 0, 0, 1, 0, 0] and len(holds) == 1
    holds.forget_all()
    assert not [p for p in counters.dir.iterdir() if p.name.startswith("gmlake_hold")]


def test_a_receiver_of_no_hold_file_takes_nothing(counters):
    assert sharing.take(COUNTER, 7) is None
    assert sharing.state_of(sharing.hold_path(COUNTER, 7)) == "gone"


def test_the_counter_is_read_where_torch_writes_it(counters):
    assert counters.values() == [1] * SLOTS
    assert sharing.read_counter(b"/torch_no_such_file", 0) is None


def test_a_hold_file_names_the_counter_file_and_the_share(counters):
    assert sharing.hold_path(COUNTER, 3) == str(counters.dir / "gmlake_hold_torch_4242_77_0_3")
    assert sharing.hold_path(COUNTER.decode(), 3) == sharing.hold_path(COUNTER, 3)


# ---------------------------------------------------------------- the reducer and the rebuild, torch's stand-ins

def torch_args(offset: int) -> tuple:
    """rebuild_cuda_tensor's arguments, as torch's reduce_tensor returns them."""
    args = [None] * 15
    args[sharing.ARG_DEVICE], args[sharing.ARG_STORAGE] = 0, b"handle"
    args[sharing.ARG_COUNTER], args[sharing.ARG_OFFSET] = COUNTER, offset
    return tuple(args)


def test_the_receivers_rebuild_holds_until_its_storage_dies(counters, monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.multiprocessing import reductions

    monkeypatch.setattr(reductions, "rebuild_cuda_tensor", lambda *args: torch.zeros(4))
    sharing.Holds().add(COUNTER, 0, 0)
    path = sharing.hold_path(COUNTER, 0)
    t = sharing.rebuild_cuda_tensor(*torch_args(0))
    view = t[1:]
    del t
    assert sharing.state_of(path) == "held"
    del view
    assert sharing.state_of(path) == "released"

    def fails(*args):
        raise RuntimeError("no such handle")

    monkeypatch.setattr(reductions, "rebuild_cuda_tensor", fails)
    sharing.Holds().add(COUNTER, 1, 0)
    with pytest.raises(RuntimeError, match="no such handle"):
        sharing.rebuild_cuda_tensor(*torch_args(1))
    assert sharing.state_of(sharing.hold_path(COUNTER, 1)) == "taken"     # the sender releases its count


def test_the_senders_reducer_checks_first_and_names_gmlakes_rebuild(counters, monkeypatch):
    pytest.importorskip("torch")
    from torch.multiprocessing import reductions

    reduced: list = []

    def torch_reduce(tensor):
        reduced.append(tensor)
        return reductions.rebuild_cuda_tensor, torch_args(len(reduced) - 1)

    fake_torch = types.SimpleNamespace(Tensor=FakeTensor, strided="strided", _C=types.SimpleNamespace())
    sender = sharing._Sender(fake_torch, torch_reduce, lambda ptr: None)
    monkeypatch.setattr(sender, "check", refuse)
    monkeypatch.setattr(sharing, "HOLDS", sharing.Holds())
    rebuild, args = sender.reduce(FakeTensor())
    assert rebuild is sharing.rebuild_cuda_tensor and args == torch_args(0)
    assert sharing.state_of(sharing.hold_path(COUNTER, 0)) == "sent" and len(sharing.HOLDS) == 1
    with pytest.raises(RuntimeError, match="^gmlake: cannot share"):
        sender.reduce(FakeTensor(shareable=False))
    assert len(reduced) == 1                    # torch's reducer (and its counter) never reached
    assert sender.reduce(FakeTensor(cuda=False))[0] is reductions.rebuild_cuda_tensor
    sharing.HOLDS.forget_all()


def test_sharing_imports_nothing_of_torch():
    code = "import sys, gmlake.torch.sharing; print(json.dumps('torch' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) is False


def test_without_the_shims_sharing_the_sender_refuses_in_one_line(monkeypatch):
    """Where the allocator shim with shareIpcHandle could not be built, torch's own error would come from the feeder
    thread: the put check refuses first, saying why."""
    from gmlake.torch import _torch_allocator, _torch_bridge, install

    fake_torch = types.SimpleNamespace(__version__="9.9")
    monkeypatch.setattr(_torch_allocator, "no_sharing", None)
    assert install._share_check(fake_torch) is _torch_bridge.share_ipc
    monkeypatch.setattr(_torch_allocator, "no_sharing", "no compiler found\ndetails")
    with pytest.raises(RuntimeError) as info:
        install._share_check(fake_torch)(0x1000)
    assert str(info.value) == ("gmlake: cannot share the CUDA tensor at 0x1000 with another process: the allocator "
                               "shim's sharing could not be built against torch 9.9 (no compiler found)")


INSTALL = """
import json, torch
from multiprocessing.reduction import ForkingPickler
from torch.multiprocessing import reductions
from gmlake.torch import sharing
calls = []
torch._C._cuda_ipc_collect = lambda: calls.append("ipc_collect")        # a CPU build has neither
torch._C._cuda_emptyCache = lambda: calls.append("empty_cache")
original = reductions.reduce_tensor
sharing.install(torch, lambda ptr: None)
sharing.install(torch, lambda ptr: None)                                # once only
registered = {cls.__name__: r == sharing._sender.reduce for cls, r in ForkingPickler._extra_reducers.items()
              if cls in (torch.Tensor, torch.nn.Parameter)}
t = torch.arange(6.0)
back = ForkingPickler.loads(ForkingPickler.dumps(t))                    # a CPU tensor: torch's own path
torch._C._cuda_ipc_collect()                                           # what torch.cuda.ipc_collect calls
torch._C._cuda_emptyCache()
print(json.dumps({"registered": registered, "replaced": reductions.reduce_tensor == sharing._sender.reduce,
                  "original_kept": sharing._sender.reduce_tensor is original, "cpu": back.tolist(), "calls": calls,
                  "no_original_left": original not in ForkingPickler._extra_reducers.values()}))
"""


def test_install_routes_torchs_reductions_and_collects_through_gmlake():
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-c", INSTALL], capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["registered"] == {"Tensor": True, "Parameter": True} and got["no_original_left"]
    assert got["replaced"] and got["original_kept"]
    assert got["cpu"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert got["calls"] == ["ipc_collect", "empty_cache"]
