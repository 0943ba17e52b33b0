"""CUDA tensors handed to other processes under gmlake, around PyTorch's own sharing (Note [Sharing a tensor through
PyTorch's handle] in gmlake/torch/_torch_bridge.pyx): the sender's error before a queue's feeder thread pickles (Note
[The sender's check before the feeder]), and a hold the kernel drops when a receiver dies (Note [A receiver's hold the
kernel drops]). install() puts both in place; gmlake.torch.enable() calls it. The lock files' logic (Holds, take,
release, state_of) imports nothing of torch and runs over plain processes on a CPU (tests/test_sharing_holds.py).

Note [The sender's check before the feeder]: torch.multiprocessing's Queue and JoinableQueue (the standard library's,
whose ForkingPickler torch taught to reduce tensors) pickle in a feeder thread. A tensor gmlake cannot share
(GMLAKE_IPC=0, or a block on pages of two sizes) then raises in that thread: put has already returned, the feeder
prints a traceback and the receiver's get waits forever. So under gmlake their put first looks for CUDA tensors in
what it is given (the object itself, and lists, tuples, sets and dicts inside it, to MAX_DEPTH) and asks the bridge
whether gmlake can share each one's block (share_ipc: no call of torch's reducer, which would bump a counter of its
own; the descriptors it makes are the driver's, kept for the share itself). One it cannot share raises, in put, the
bridge's one line. A CPU object costs a walk of its containers and no more (a list of a million numbers: tens of
ms). A tensor another object hides is met only by the feeder; its hook (_on_feeder_error) then sends the refusal
on, and the receiver's get raises the same line instead of waiting forever. SimpleQueue.put and Connection.send
pickle in the caller, so the reducer raises there: it runs the same check first, so the error is the same line.
Where the allocator shim's sharing could not be built, the check refuses every CUDA tensor, saying so.

Note [A receiver's hold the kernel drops]: PyTorch keeps a shared block allocated while a counter in a shared
memory file (one int64 per share, torch's CudaIPCSentData) is above zero; the receiver decrements it when its storage
dies. A receiver killed first never does, and the sender's block stays in torch's CudaIPCSentDataLimbo until the
sender exits. Under gmlake the sender's reducer makes, for each share of its CUDA tensors, a lock file named after
torch's counter (hold_path: the counter file's name and the share's offset, both in the reduction's arguments, so the
arguments stay torch's own, in torch's order), and names gmlake's rebuild_cuda_tensor as the function to rebuild
with. The receiver's rebuild (whatever allocator it runs, gmlake importable) takes a shared flock on the file, marks it
TAKEN, then rebuilds with torch's own; a finalizer on the storage marks it RELEASED and closes the file when the
storage dies, just before torch's deleter decrements the counter. The kernel drops the lock of a process that dies. The
sender's collect (on each share at most once a second, and in torch.cuda.ipc_collect and empty_cache) takes each file's
lock without waiting: where it gets it and the file says TAKEN, the receiver is gone without releasing, so the
sender decrements torch's counter (torch.UntypedStorage._release_ipc_counter, what the receiver's deleter does) if it
is still above zero, then torch's own ipc_collect frees the block. A share never received (still in a queue) is
unmarked and kept; a live receiver holds the lock. What is left as PyTorch has it: a share rebuilt by two receivers
(reduce_tensor's arguments sent twice) is released by the sender only if none of them released it; a receiver
killed between its finalizer and torch's deleter keeps the block, as under PyTorch; a receiver that forked keeps
the lock open in its child until both are gone.
"""
from __future__ import annotations

import atexit
import fcntl
import os
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing import queues, reduction
from typing import Any

HOLD_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
# torch's counter files are POSIX shared memory (shm_open) behind a RefcountedMapAllocator header of this many bytes.
COUNTER_DIR, COUNTER_HEADER = "/dev/shm", 64
TAKEN, RELEASED = b"T", b"R"        # what a hold file says; empty: sent, not received yet
MAX_DEPTH = 4                       # containers inside containers that put looks into
COLLECT_EVERY_S = 1.0               # the reducer's collect, at most this often
# rebuild_cuda_tensor's arguments: the device, the counter file's name and the share's offset in it.
ARG_DEVICE, ARG_STORAGE, ARG_COUNTER, ARG_OFFSET = 6, 7, 11, 12


# ---------------------------------------------------------------- the sender's check (no torch)

def find_unshareable(obj: Any, is_cuda_tensor: Callable[[Any], bool], check: Callable[[Any], None],
                     depth: int = 0) -> None:
    """Call `check` on each CUDA tensor in `obj` (itself, or inside lists, tuples, sets and dict values to MAX_DEPTH),
    which raises where gmlake cannot share it (Note [The sender's check before the feeder]). A container of numbers
    and strings only is passed over at C speed."""
    if is_cuda_tensor(obj):
        check(obj)
    elif depth < MAX_DEPTH:
        if isinstance(obj, dict):
            obj = obj.values()
        elif not isinstance(obj, (list, tuple, set, frozenset)):
            return
        if all(map(_LEAVES.__contains__, map(type, obj))):
            return
        for item in obj:
            if type(item) not in _LEAVES:
                find_unshareable(item, is_cuda_tensor, check, depth + 1)


_LEAVES = frozenset({int, float, complex, bool, str, bytes, bytearray, type(None)})


_replaced_puts: dict[tuple[Any, str], Callable] = {}     # (class, or "Queue" for the feeder's hook; name)
REFUSED = "gmlake: cannot share"        # how the bridge's refusals begin


def _raise_refused(text: str):
    raise RuntimeError(f"{text} (raised in the sender's queue feeder thread)")


class _Refused:
    """What a feeder sends in place of an object it could not pickle: its get raises the sender's error."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __reduce__(self):
        return _raise_refused, (self.text,)


def _on_feeder_error(self, e, obj) -> None:
    """The feeder could not pickle `obj`: where gmlake refused a tensor the put check did not see (inside an object
    it does not walk), the receiver's get raises the same line instead of waiting forever."""
    _replaced_puts[("Queue", "_on_queue_feeder_error")](e, obj)
    if not str(e).startswith(REFUSED) or not self._sem.acquire(False):
        return
    with self._wlock if self._wlock is not None else _NO_LOCK:
        self._send_bytes(reduction.ForkingPickler.dumps(_Refused(str(e).splitlines()[0])))


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_LOCK = _NoLock()


def install_put_check(is_cuda_tensor: Callable[[Any], bool], check: Callable[[Any], None]) -> None:
    """Make multiprocessing's Queue.put and JoinableQueue.put (torch.multiprocessing's) check what they are given
    before their feeder thread pickles it, and their feeder send a refusal on to the receiver."""
    for cls in (queues.Queue, queues.JoinableQueue):
        original = _replaced_puts.setdefault((cls, "put"), cls.__dict__["put"])

        def put(self, obj, block=True, timeout=None, _original=original):
            find_unshareable(obj, is_cuda_tensor, check)
            return _original(self, obj, block, timeout)

        put.__doc__ = original.__doc__
        cls.put = put
    _replaced_puts.setdefault(("Queue", "_on_queue_feeder_error"), queues.Queue._on_queue_feeder_error)
    queues.Queue._on_queue_feeder_error = _on_feeder_error


def restore_puts() -> None:
    for (cls, name), original in _replaced_puts.items():
        if cls == "Queue":
            queues.Queue._on_queue_feeder_error = staticmethod(original)
        else:
            setattr(cls, name, original)
    _replaced_puts.clear()


# ---------------------------------------------------------------- holds (no torch)

def hold_path(counter: bytes | str, offset: int) -> str:
    """The lock file of the share at `offset` of torch's counter file `counter` (as "/torch_<pid>_<n>")."""
    name = counter.decode() if isinstance(counter, bytes) else str(counter)
    return os.path.join(HOLD_DIR, f"gmlake_hold{name.replace('/', '_')}_{int(offset)}")


def state_of(path: str) -> str:
    """"held" (a receiver holds the lock), "sent" (not received yet), "released" (its receiver released it), "taken"
    (received, and no receiver holds it any more) or "gone" (no file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "gone"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held"
        mark = os.pread(fd, 1, 0)
    finally:
        os.close(fd)        # drops the lock
    return {b"": "sent", RELEASED: "released", TAKEN: "taken"}.get(mark, "sent")


def take(counter: bytes | str, offset: int) -> int | None:
    """The receiver: hold the share (a shared lock, then TAKEN); the descriptor to release, or None where the sender
    made no hold file (not gmlake's, or another machine's)."""
    try:
        fd = os.open(hold_path(counter, offset), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)          # waits only while a sender's collect looks
    os.pwrite(fd, TAKEN, 0)
    return fd


def release(fd: int) -> None:
    """The receiver's storage died: RELEASED, then the lock goes with the descriptor."""
    try:
        os.pwrite(fd, RELEASED, 0)
    finally:
        os.close(fd)


class Holds:
    """The sender's shares with a hold file: make one per share, and collect those whose receiver died holding."""

    def __init__(self) -> None:
        self._shares: dict[str, tuple[bytes, int, Any]] = {}
        self._lock = threading.Lock()
        self._last = 0.0

    def add(self, counter: bytes, offset: int, device: Any) -> str:
        path = hold_path(counter, offset)
        os.close(os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC, 0o600))
        with self._lock:
            self._shares[path] = (counter, offset, device)
        return path

    def __len__(self) -> int:
        return len(self._shares)

    def collect(self, read_counter: Callable[[bytes, int], int | None],
                release_counter: Callable[[bytes, int, Any], None]) -> int:
        """Release torch's counter of each share whose receiver died holding it and whose counter is still above
        zero; forget the shares released or gone. How many counters it released."""
        released = 0
        with self._lock:
            self._last = time.monotonic()
            for path, (counter, offset, device) in list(self._shares.items()):
                state = state_of(path)
                if state in ("held", "sent"):
                    continue
                if state == "taken":
                    value = read_counter(counter, offset)
                    if value is not None and value > 0:
                        release_counter(counter, offset, device)
                        released += 1
                del self._shares[path]
                _unlink(path)
        return released

    def due(self) -> bool:
        return bool(self._shares) and time.monotonic() - self._last >= COLLECT_EVERY_S

    def forget_all(self) -> None:
        with self._lock:
            for path in self._shares:
                _unlink(path)
            self._shares.clear()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read_counter(counter: bytes | str, offset: int) -> int | None:
    """torch's counter of a share (None where its file is gone: its sender released every share in it)."""
    name = counter.decode() if isinstance(counter, bytes) else str(counter)
    try:
        fd = os.open(os.path.join(COUNTER_DIR, name.lstrip("/")), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.pread(fd, 8, COUNTER_HEADER + 8 * int(offset))
    finally:
        os.close(fd)
    return struct.unpack("<q", raw)[0] if len(raw) == 8 else None


HOLDS = Holds()
atexit.register(HOLDS.forget_all)


# ---------------------------------------------------------------- torch's side

def rebuild_cuda_tensor(*args):
    """torch.multiprocessing.reductions.rebuild_cuda_tensor, with the share held while the tensor's storage lives
    (Note [A receiver's hold the kernel drops]); same arguments."""
    from torch.multiprocessing import reductions

    fd = None
    if args[ARG_STORAGE] is not None and args[ARG_COUNTER] is not None:
        fd = take(args[ARG_COUNTER], args[ARG_OFFSET])
    try:
        tensor = reductions.rebuild_cuda_tensor(*args)
    except BaseException:
        if fd is not None:
            os.close(fd)        # TAKEN and free: the sender releases the count this receiver never took
        raise
    if fd is not None:
        weakref.finalize(tensor.untyped_storage(), release, fd).atexit = False
    return tensor


class _Sender:
    """The reducer and collect over torch, once install() has them."""

    def __init__(self, torch, reduce_tensor: Callable, share_check: Callable[[int], Any]) -> None:
        self.torch, self.reduce_tensor, self.share_check = torch, reduce_tensor, share_check
        from torch.multiprocessing import reductions

        self.torch_rebuild = reductions.rebuild_cuda_tensor
        self.ipc_collect = getattr(torch._C, "_cuda_ipc_collect", lambda: None)     # a CUDA build's

    def is_cuda_tensor(self, obj) -> bool:
        return isinstance(obj, self.torch.Tensor) and obj.is_cuda

    def check(self, tensor) -> None:
        """Raise the bridge's one line where gmlake cannot share `tensor`'s block; tensors torch reduces its own way
        (nested, sparse) and empty ones are torch's."""
        if tensor.is_nested or tensor.layout != self.torch.strided:
            return
        storage = tensor.untyped_storage()
        if storage.nbytes() and storage.data_ptr():
            self.share_check(storage.data_ptr())

    def reduce(self, tensor):
        if not self.is_cuda_tensor(tensor):
            return self.reduce_tensor(tensor)
        self.check(tensor)
        if HOLDS.due():
            self.collect()
        rebuild, args = self.reduce_tensor(tensor)
        if rebuild is not self.torch_rebuild or args[ARG_STORAGE] is None or args[ARG_COUNTER] is None:
            return rebuild, args
        HOLDS.add(args[ARG_COUNTER], args[ARG_OFFSET], args[ARG_DEVICE])
        return rebuild_cuda_tensor, args

    def release_counter(self, counter: bytes, offset: int, device) -> None:
        self.torch.UntypedStorage._release_ipc_counter(counter, offset, device=device)

    def collect(self) -> int:
        """Release the holds of receivers gone (Note [A receiver's hold the kernel drops]), then torch's limbo."""
        released = HOLDS.collect(read_counter, self.release_counter)
        if released:
            self.ipc_collect()
        return released


_sender: _Sender | None = None


def collect() -> int:
    """The sender's collect: how many holds of dead receivers it released (0 before install())."""
    return _sender.collect() if _sender is not None else 0


def install(torch, share_check: Callable[[int], Any]) -> None:
    """Under gmlake: the put check (Note [The sender's check before the feeder]) and the holds (Note [A receiver's
    hold the kernel drops]) in torch.multiprocessing, and the holds' collect in torch.cuda.ipc_collect and
    empty_cache. `share_check(ptr)` raises the one line saying why gmlake cannot share the block at `ptr`."""
    global _sender
    if _sender is not None:
        return
    from torch.multiprocessing import reductions

    sender = _Sender(torch, reductions.reduce_tensor, share_check)
    for cls, reducer in list(reduction.ForkingPickler._extra_reducers.items()):
        if reducer is reductions.reduce_tensor:
            reduction.ForkingPickler.register(cls, sender.reduce)
    reductions.reduce_tensor = sender.reduce
    install_put_check(sender.is_cuda_tensor, sender.check)
    torch_ipc_collect, torch_empty_cache = torch._C._cuda_ipc_collect, torch._C._cuda_emptyCache

    def ipc_collect():
        HOLDS.collect(read_counter, sender.release_counter)
        return torch_ipc_collect()

    def empty_cache():
        sender.collect()        # the blocks torch's limbo lets go are free, and go back with the rest
        return torch_empty_cache()

    torch._C._cuda_ipc_collect, torch._C._cuda_emptyCache = ipc_collect, empty_cache
    _sender = sender
