"""Type stubs for gmlake.drivers._sim_driver (a Cython module)."""

from gmlake.core._driver import ModelDriver

class SimDriver(ModelDriver):
    """A simulated device of `capacity` bytes (0: unbounded) and allocation `granularity`: bookkeeping only."""

    def __init__(self, capacity: int = 0, granularity: int = 2097152) -> None: ...
