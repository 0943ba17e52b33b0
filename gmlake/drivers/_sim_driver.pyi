"""Type stubs for gmlake.drivers._sim_driver (a Cython module)."""

from gmlake.core._driver import ModelDriver

class SimDriver(ModelDriver):
    """A simulated device of `capacity` bytes (0: unbounded) and allocation `granularity`: bookkeeping only."""

    @property
    def exportable(self) -> bool: ...   # its chunks priced as exportable ones (replay)
    def __init__(self, capacity: int = 0, granularity: int = 2097152, exportable: bool | None = None) -> None: ...
