"""gmlake.sim.workers: a pool that a failing result (or Ctrl-C) ends leaves nothing running behind it."""
from __future__ import annotations

import threading
import time

import pytest

from gmlake.sim.workers import map_in_processes


def _nothing() -> None:
    pass


def _fails_on_three(item: int) -> int:
    if item == 3:
        raise ValueError("three")
    time.sleep(5)                   # the others are still running when the failure arrives
    return item


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if type(t).__name__ == "_ExecutorManagerThread" and t.is_alive()]


def test_a_failed_map_ends_its_pool_before_it_returns():
    """The pool's manager thread has ended by the time the error is raised: left running, it closes its wake-up pipe
    while the interpreter's exit hook writes to it, and a Ctrl-C'd `gmlake tune` printed an ignored OSError after
    its one line (Note [Ctrl-C and the worker processes])."""
    for _ in range(5):
        started = time.monotonic()
        with pytest.raises(ValueError, match="three"):
            map_in_processes(_fails_on_three, [1, 2, 3, 4], jobs=4, initializer=_nothing)
        assert time.monotonic() - started < 4      # did not wait for the sleeping workers
        assert _pool_threads() == []


def test_a_map_returns_results_in_order_and_reports_each():
    seen: list[int] = []
    assert map_in_processes(abs, [-3, 1, -2], jobs=2, initializer=_nothing, on_done=seen.append) == [3, 1, 2]
    assert sorted(seen) == [1, 2, 3]
    assert _pool_threads() == []
