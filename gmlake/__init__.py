"""gmlake: a GPU memory allocator that defragments by virtual memory stitching (after GMLake, ASPLOS'24).

    from gmlake import Allocator, SimDriver
    alloc = Allocator(SimDriver(capacity=80 << 30))
    ptr = alloc.malloc(300 << 20)
    alloc.free(ptr)

Drivers: SimDriver (bookkeeping, any size), HostDriver (real bytes on the CPU), cuda_driver() (CUDA VMM; needs a GPU).
Policies: GMLakePolicy (the default), PaperPolicy, CachingPolicy and ExpandablePolicy, all subclasses of Policy; subclass
one to try a variant (docs/policies.md). Traces: gmlake.trace.load(path or bundled name); replay: gmlake.replay;
which setting suits a trace: gmlake.tune.
"""
from __future__ import annotations

from gmlake._allocator import CALL_NAMES, Allocator
from gmlake._driver import Driver
from gmlake._host_driver import HostDriver
from gmlake._sim_driver import SimDriver
from gmlake.errors import (
    CaptureOutOfMemoryError,
    DriverError,
    GmlakeError,
    GraphCaptureError,
    InvalidPointerError,
    OutOfMemoryError,
    PolicyError,
)
from gmlake.policies import CachingPolicy, ExpandablePolicy, GMLakePolicy, PaperPolicy, Policy

__version__ = "0.1.0"


def cuda_driver(device: int = 0) -> Driver:
    """The CUDA VMM driver for `device`. Raises CudaDriverError where no CUDA driver or device exists."""
    from gmlake._cuda_driver import CudaDriver

    return CudaDriver(device)


def cuda_available() -> bool:
    """Whether a CUDA driver with at least one device can be used here."""
    try:
        cuda_driver(0)
    except Exception:  # noqa: BLE001 - any failure to start the driver means "not usable here"
        return False
    return True


__all__ = [
    "CALL_NAMES",
    "Allocator",
    "CachingPolicy",
    "CaptureOutOfMemoryError",
    "Driver",
    "DriverError",
    "ExpandablePolicy",
    "GMLakePolicy",
    "GmlakeError",
    "GraphCaptureError",
    "HostDriver",
    "InvalidPointerError",
    "OutOfMemoryError",
    "PaperPolicy",
    "Policy",
    "PolicyError",
    "SimDriver",
    "cuda_available",
    "cuda_driver",
]
