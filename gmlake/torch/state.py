"""What the torch bridge knows of this process: whether gmlake is enabled, with which policy, and the Allocator
serving each device. The other modules of gmlake.torch read it; only install.enable() and snapshots write it."""
from __future__ import annotations

from typing import Any

from gmlake.core._allocator import Allocator
from gmlake.torch import _torch_bridge

_enabled: dict[str, Any] = {}


def policy_info() -> dict[str, object] | None:
    """The installed policy as results record it (label, spec, class, every knob), or None when not enabled."""
    return _enabled["choice"].record() if _enabled else None


def is_enabled() -> bool:
    """Whether gmlake is PyTorch's CUDA allocator in this process."""
    return bool(_enabled)


def _device(device) -> int:
    # torch is optional: loaded on first use, so import gmlake stays light without it
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, torch.device):
        return device.index if device.index is not None else torch.cuda.current_device()
    if isinstance(device, str):
        return _device(torch.device(device))
    return int(device)


def allocator(device=None) -> Allocator:
    """The gmlake Allocator serving `device` (default: the current one)."""
    if not _enabled:
        raise RuntimeError("gmlake: not enabled; call gmlake.torch.enable() first")
    return _torch_bridge.allocator(_device(device))


_history_settings: dict[str, Any] = {}
