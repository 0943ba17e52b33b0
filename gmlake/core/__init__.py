"""The allocator core: GMLake's virtual memory stitching over any Driver.

What lives here, and nothing above it is imported: the Allocator (`_allocator.pyx` and its rooms, the `.pxi` files),
the Driver interface every driver implements (`_driver.pyx`), the views a policy's hooks read (`view.py`) and the
errors (`errors.py`). Drivers (gmlake.drivers), policies (gmlake.policies), the torch bridge (gmlake.torch) and replay
(gmlake.sim) import the core; the core imports none of them. A policy is handed to the Allocator when it is made.

A research policy's own `.pyx` builds against the `.pxd` files here: `cimport gmlake.core._allocator`, with
`get_include()` on the compiler's include path (docs/policies.md, "The Cython path").
"""
from __future__ import annotations

from pathlib import Path

from gmlake.core._allocator import CALL_NAMES, Allocator
from gmlake.core._driver import Driver
from gmlake.core.errors import (
    CaptureOutOfMemoryError,
    DriverError,
    GmlakeError,
    GraphCaptureError,
    HazardError,
    InvalidPointerError,
    OutOfMemoryError,
    PolicyError,
)


def get_include() -> str:
    """The folder holding the core's C++ headers (`_structs.h`), for a module built against its `.pxd` files."""
    return str(Path(__file__).parent)


__all__ = ["CALL_NAMES", "Allocator", "CaptureOutOfMemoryError", "Driver", "DriverError", "GmlakeError",
           "GraphCaptureError", "HazardError", "InvalidPointerError", "OutOfMemoryError", "PolicyError", "get_include"]
