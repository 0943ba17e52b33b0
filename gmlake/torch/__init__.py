"""gmlake under stock PyTorch: install the allocator, read its statistics under torch's names, take snapshots.

    import gmlake.torch
    gmlake.torch.enable()                 # before CUDA is initialised
    ...train...
    print(gmlake.torch.memory_summary())

Or with no code change: `gmlake run train.py args...` (see README for the GMLAKE_* variables).

The package by role: install.py (enable(), the GMLAKE_* settings), state.py (what is enabled, each device's
Allocator), stats.py (memory_stats() and the memory_* functions), snapshots.py (history and snapshots in torch's
format), memory_api.py (torch.cuda's memory API answered by gmlake), sharing.py (CUDA tensors sent to other processes: the
sender's check, a dead receiver's hold released), capture.py (`gmlake capture`), and the bridge PyTorch calls,
_torch_bridge.pyx.
"""
from __future__ import annotations

from gmlake.torch.install import enable, enable_from_env, install_oom_error, options_from_env, policy_from_env
from gmlake.torch.memory_api import (
    CheckpointState,
    MemPool,
    _check_pool_live_allocations,  # noqa: F401 - read by the tests, as torch names it
    attach_out_of_memory_observer,
    install_memory_api,
    restore_memory_api,
)
from gmlake.torch.snapshots import (
    _segments,  # noqa: F401 - read by the tests
    dump_snapshot,
    record_memory_history,
    snapshot,
    snapshot_of,
)
from gmlake.torch.state import (
    _enabled,  # noqa: F401 - what is enabled, read by the tests and GPU scripts
    allocator,
    is_enabled,
    policy_info,
)
from gmlake.torch.stats import (
    GMLAKE_STAT_KEYS,
    empty_cache,
    gmlake_stats_of,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    nested_memory_stats,
    reset_peak_memory_stats,
    summary_of,
)

__all__ = [
    "GMLAKE_STAT_KEYS",
    "CheckpointState",
    "MemPool",
    "allocator",
    "attach_out_of_memory_observer",
    "dump_snapshot",
    "empty_cache",
    "enable",
    "enable_from_env",
    "gmlake_stats_of",
    "install_memory_api",
    "install_oom_error",
    "is_enabled",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "nested_memory_stats",
    "options_from_env",
    "policy_from_env",
    "policy_info",
    "record_memory_history",
    "reset_peak_memory_stats",
    "restore_memory_api",
    "snapshot",
    "snapshot_of",
    "summary_of",
]
