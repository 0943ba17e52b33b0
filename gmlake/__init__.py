"""gmlake: a GPU memory allocator that defragments by virtual memory stitching (after GMLake, ASPLOS'24).

    from gmlake import Allocator, SimDriver
    alloc = Allocator(SimDriver(capacity=80 << 30))
    ptr = alloc.malloc(300 << 20)
    alloc.free(ptr)

The package by layer (imports go one way: each layer uses only the ones below it, never one above):

    gmlake.cli        the `gmlake` command                              uses everything below
    gmlake.torch      install into PyTorch: enable(), `gmlake run`,     uses policies, drivers, core
                      the memory API, capture
    gmlake.sim        traces, replay, compare, tune, explain            uses policies, drivers, core
                      (pip install 'gmlake[sim]': numpy, matplotlib)
    gmlake.policies   Policy (hooks), its knobs, the built-ins,         uses core
                      examples a researcher copies
    gmlake.drivers    SimDriver, HostDriver, cuda_driver()              uses core
    gmlake.core       the Allocator and its rooms, the Driver           uses nothing of gmlake
                      interface, errors

This module gathers the names most code needs; a training job needs only `import gmlake.torch` (or GMLAKE=1).
"""
from __future__ import annotations

from gmlake.core import (
    CALL_NAMES,
    Allocator,
    CaptureOutOfMemoryError,
    Driver,
    DriverError,
    GmlakeError,
    GraphCaptureError,
    InvalidPointerError,
    OutOfMemoryError,
    PolicyError,
)
from gmlake.drivers import HostDriver, SimDriver, cuda_available, cuda_driver
from gmlake.policies import CachingPolicy, ExpandablePolicy, GMLakePolicy, PaperPolicy, Policy

__version__ = "0.1.0"

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
