"""torch.cuda's memory API answered by gmlake: the torch._C entry points it replaces, cudagraph trees' checkpoints,
torch.cuda.MemPool, and the out-of-memory observers."""
from __future__ import annotations

import sys
from typing import Any

from gmlake.torch import _torch_bridge
from gmlake.torch.snapshots import _torch_record_history, _torch_record_history_legacy, _torch_snapshot, snapshot
from gmlake.torch.state import _device
from gmlake.torch.stats import _reset_accumulated, _reset_peak, nested_memory_stats

# ---------------------------------------------------------------- torch.cuda's memory API, answered by gmlake
#
# A CUDAPluggableAllocator makes torch's C++ raise on getDeviceStats / resetPeakStats / snapshot / recordHistory /
# attachOutOfMemoryObserver. torch.cuda.memory's Python functions reach those through a few torch._C entry points,
# looked up at call time, so replacing the entry points makes every function built on them (memory_stats,
# memory_allocated, max_memory_*, memory_summary, memory_snapshot, _snapshot, _dump_snapshot, _record_memory_history,
# reset_*) and the out-of-memory observers answer from gmlake, in torch's formats, including in modules that imported
# those functions before gmlake was enabled.

def attach_out_of_memory_observer(observer) -> None:
    """Call observer(device, requested bytes, the cap or else the device's capacity, the device's free bytes) at
    each out-of-memory, before the error is raised: what torch._C._cuda_attach_out_of_memory_observer does, and what
    it does under gmlake (install_memory_api routes it here), e.g. to dump a snapshot at the failure."""
    _torch_bridge.attach_out_of_memory_observer(observer)


_replaced_entry_points: dict[str, Any] = {}         # torch._C name -> the original (None where it did not exist)


class CheckpointState:
    """What torch._C._cuda_getCheckpointState answers under gmlake: the private pool and the blocks it had allocated
    when cudagraph trees recorded a graph (torch's own AllocatorState is opaque to Python too)."""

    def __init__(self, device: int, pool: tuple[int, int]):
        self.device = device
        self.pool = tuple(pool)
        key = (self.pool[0] << 32) | self.pool[1]
        a = _torch_bridge.allocators().get(device)
        info = [p for p in a.pools_info() if p["id"] == key] if a is not None else []
        self.allocated_bytes = info[0]["allocated_bytes"] if info else 0

    def __repr__(self) -> str:
        return f"gmlake CheckpointState(device={self.device}, pool={self.pool}, allocated={self.allocated_bytes})"


def _get_checkpoint_state(device: int, pool) -> CheckpointState:
    """torch._C._cuda_getCheckpointState: cudagraph trees take one after recording each graph."""
    return CheckpointState(device, pool)


def _set_checkpoint_pool_state(device, state, stale_storages=(), live_storages=()) -> None:
    """torch._C._cuda_setCheckpointPoolState: cudagraph trees call it to record a new graph while outputs of graphs
    already replayed are alive (a new input shape, or a new path, after replays began). Restoring the pool to a
    checkpoint makes those outputs own their memory again through torch's C++ storage internals, which a pluggable
    allocator cannot reach from Python: refuse with the way out rather than corrupt the pool."""
    raise RuntimeError(
        "gmlake: torch.compile(mode='reduce-overhead') needed to record a new CUDA graph while outputs of replayed "
        "graphs were still alive (cudagraph trees' checkpoint of the allocator, which PyTorch keeps only for its "
        "own allocator). Keep input shapes static under reduce-overhead, call "
        "torch.compiler.cudagraph_mark_step_begin() each step and let last step's outputs die before the next, or "
        "compile with mode='max-autotune-no-cudagraphs'.")


def _check_pool_live_allocations(device: int, pool, expected_live) -> bool:
    """torch._C._cuda_checkPoolLiveAllocations: are the blocks allocated in the private pool exactly the data
    pointers cudagraph trees expect to be alive? (A block freed but still waiting on other streams is not live, as
    in PyTorch's allocator.)"""
    a = _torch_bridge.allocators().get(_device(device))
    key = (int(pool[0]) << 32) | int(pool[1])
    live = set()
    if a is not None:
        for seg in a.segments_info():
            if seg["private_pool"] == key:
                live.update(seg["va"] + offset for offset, _size, state, *_ in seg["blocks"] if state == "allocated")
    return live == set(expected_live)


def _entry_points() -> dict[str, Any]:
    """torch._C name -> gmlake's replacement. The _accelerator_* ones serve torch.accelerator.memory_*."""
    return {
        "_cuda_memoryStats": nested_memory_stats,
        "_cuda_resetPeakMemoryStats": _reset_peak,
        "_cuda_resetAccumulatedMemoryStats": _reset_accumulated,
        "_cuda_memorySnapshot": _torch_snapshot,
        "_cuda_record_memory_history": _torch_record_history,
        "_cuda_record_memory_history_legacy": _torch_record_history_legacy,
        "_accelerator_getDeviceStats": nested_memory_stats,
        "_accelerator_resetPeakStats": _reset_peak,
        "_accelerator_resetAccumulatedStats": _reset_accumulated,
        # torch.accelerator.memory_stats() answers {} unless the allocator reports itself initialised.
        "_accelerator_isAllocatorInitialized": _allocator_initialized,
        # cudagraph trees (torch.compile(mode="reduce-overhead")) checkpoint the allocator after each recording.
        "_cuda_getCheckpointState": _get_checkpoint_state,
        "_cuda_setCheckpointPoolState": _set_checkpoint_pool_state,
        "_cuda_checkPoolLiveAllocations": _check_pool_live_allocations,
        # The observers PyTorch documents for dumping a snapshot at an out-of-memory; the pluggable allocator refuses
        # them, gmlake's bridge calls them.
        "_cuda_attach_out_of_memory_observer": attach_out_of_memory_observer,
    }


def _allocator_initialized(*_args) -> bool:
    """torch._C._accelerator_isAllocatorInitialized: gmlake serves the device once it is enabled."""
    return True


class MemPool:
    """torch.cuda.MemPool under gmlake: a private pool of gmlake's allocator that `torch.cuda.use_mem_pool` routes the
    calling thread's allocations to (through the pool hooks, Note [Graph pools through the bridge]).

    PyTorch's own MemPool asks the allocator for createOrIncrefPool, which it gives only its caching allocator, so
    under any pluggable allocator it fails on construction. This one takes a pool id from torch's own counter
    (graph_pool_handle, so ids never collide with graphs' pools) and holds one use of the pool, as PyTorch's holds its
    reference, until it is deleted. `allocator=` (another allocator for the pool) and `use_on_oom` / `no_split` are
    PyTorch caching-allocator features gmlake does not have: asking for them raises ValueError."""

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        # torch is optional: loaded on first use, so import gmlake stays light without it
        import torch

        unsupported = [name for name, given in (("allocator", allocator is not None), ("use_on_oom", use_on_oom),
                                                ("no_split", no_split)) if given]
        if unsupported:
            raise ValueError(f"gmlake: torch.cuda.MemPool({', '.join(unsupported)}=...) is a feature of PyTorch's "
                             f"caching allocator, which gmlake replaces; create the pool without it")
        self._device = torch.cuda.current_device()
        first, second = torch.cuda.graph_pool_handle()
        self._id = (int(first), int(second))
        self._key = (self._id[0] << 32) | self._id[1]
        self._allocator = _torch_bridge.allocator(self._device)
        self._allocator.begin_allocate_to_pool(self._key, [])     # the pool exists, with this object's use
        self._allocator.end_allocate_to_pool(self._key)

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, as PyTorch's pair."""
        return self._id

    def use_count(self) -> int:
        """The pool's uses: this object's, plus one per use_mem_pool context (or graph) using it now."""
        return next((p["use_count"] for p in self._allocator.pools_info() if p["id"] == self._key), 0)

    def snapshot(self, include_traces: bool = True) -> dict:
        """The snapshot (torch's format) cut to this pool's segments."""
        taken = snapshot()
        taken["segments"] = [seg for seg in taken["segments"] if tuple(seg["segment_pool_id"]) == self._id]
        if not include_traces:
            taken["device_traces"] = [[] for _ in taken["device_traces"]]
        return taken

    def __del__(self) -> None:
        allocator, self._allocator = getattr(self, "_allocator", None), None
        if allocator is not None:
            try:
                allocator.release_pool(self._key)    # its blocks still allocated stay valid, as in PyTorch
            except Exception:  # noqa: BLE001, S110 - a finalizer must not raise
                pass


_replaced_module_attrs: dict[tuple[str, str], Any] = {}     # (module, name) -> the original


def install_memory_api(torch) -> None:
    """Make torch.cuda's memory statistics, snapshot and history functions answer from gmlake (see above), and
    torch.cuda.MemPool make gmlake pools."""
    for name, replacement in _entry_points().items():
        if name not in _replaced_entry_points:
            _replaced_entry_points[name] = getattr(torch._C, name, None)
        setattr(torch._C, name, replacement)
    for module in (torch.cuda, torch.cuda.memory):
        if hasattr(module, "MemPool"):
            _replaced_module_attrs.setdefault((module.__name__, "MemPool"), module.MemPool)
            module.MemPool = MemPool


def restore_memory_api(torch) -> None:
    """Undo install_memory_api: torch._C's own entry points come back."""
    for name, original in _replaced_entry_points.items():
        if original is None:
            delattr(torch._C, name)
        else:
            setattr(torch._C, name, original)
    _replaced_entry_points.clear()
    for (module_name, name), original in _replaced_module_attrs.items():
        setattr(sys.modules[module_name], name, original)
    _replaced_module_attrs.clear()
