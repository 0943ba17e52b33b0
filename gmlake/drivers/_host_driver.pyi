"""Type stubs for gmlake.drivers._host_driver (a Cython module)."""

from gmlake.core._driver import ModelDriver

class HostDriver(ModelDriver):
    """Real bytes on the CPU: chunks are memfd regions mapped with mmap(MAP_FIXED|MAP_SHARED)."""

    def __init__(self, capacity: int = 0, granularity: int = 2097152, unmap_pause: float = 0.0) -> None: ...
