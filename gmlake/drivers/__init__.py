"""The drivers the core runs over, each implementing gmlake.core's Driver interface, so that the same allocator code
decides the same way everywhere and a replayed trace predicts the GPU run:

- SimDriver: bookkeeping only, any size, priced driver time (replay);
- HostDriver: real host memory through memfd + mmap, so tests check bytes;
- CudaDriver: CUDA's virtual memory management (cuMemCreate/cuMemMap), resolved from libcuda at run time, so one
  build serves CUDA 12 and 13 (`cuda_driver()` makes one; it needs a GPU).
"""
from __future__ import annotations

from gmlake.core._driver import Driver
from gmlake.drivers._host_driver import HostDriver
from gmlake.drivers._sim_driver import SimDriver


def cuda_driver(device: int = 0, exportable: bool | None = None) -> Driver:
    """The CUDA VMM driver for `device`, its chunks exportable to other processes as `exportable` says (None:
    GMLAKE_IPC, Note [Exporting a chunk]). Raises CudaDriverError where no CUDA driver or device exists."""
    # the CUDA driver needs libcuda: loaded only when a CUDA driver is asked for
    from gmlake.drivers._cuda_driver import CudaDriver

    return CudaDriver(device, exportable)


def cuda_available() -> bool:
    """Whether a CUDA driver with at least one device can be used here."""
    try:
        cuda_driver(0)
    except Exception:  # noqa: BLE001 - any failure to start the driver means "not usable here"
        return False
    return True


__all__ = ["Driver", "HostDriver", "SimDriver", "cuda_available", "cuda_driver"]
