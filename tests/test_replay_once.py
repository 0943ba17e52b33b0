"""A replay runs its trace once (the moments of peak and peak growth come from the same pass) and shows a progress
bar once it has run a few seconds, as a Python hook can make it; Ctrl-C stops it."""
from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import ClassVar

import pytest
from rich.console import Console

import gmlake.sim.replay as replay_module
from gmlake.policies import PaperPolicy
from gmlake.sim.replay import replay, run_requests
from gmlake.sim.trace import load

TINY = "tests/data/tiny-gpt2-native.pickle.gz"


@dataclass(frozen=True)
class Counted(PaperPolicy):
    calls: ClassVar[list] = [0]
    delay: float = 0.0

    def choose_block(self, size, stream, pool, candidates, default, state):
        self.calls[0] += 1
        if self.delay:
            time.sleep(self.delay)
        return default


def test_a_replay_runs_its_trace_once_and_reads_its_moments_from_that_pass():
    trace = load(TINY)
    Counted.calls[0] = 0
    run_requests(trace, Counted(), samples=1)
    once = Counted.calls[0]
    Counted.calls[0] = 0
    result = replay(trace, Counted())
    assert Counted.calls[0] == once                      # not again up to the peak, nor up to the growth moment
    # the moments' figures are the state right after those requests, as a replay cut there leaves it
    for moment, (reserved, allocated, requested) in {
            result.peak_event: (result.peak_reserved, result.allocated_at_peak_reserved,
                                result.requested_at_peak_reserved),
            result.peak_growth_event: (result.reserved_at_peak_growth, result.allocated_at_peak_growth,
                                       result.requested_at_peak_growth)}.items():
        alloc, _ = run_requests(trace, PaperPolicy(), upto=moment + 1, samples=1)
        stats = alloc.stats()
        assert (stats["reserved_bytes"], stats["allocated_bytes"], stats["requested_bytes"]) == \
            (reserved, allocated, requested)


@pytest.fixture
def console(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(replay_module, "PROGRESS_AFTER", 0.05)
    monkeypatch.setattr(replay_module, "_progress_console", lambda: Console(file=out, force_terminal=True, width=100))
    return out


def test_a_long_replay_shows_its_progress(console):
    trace = load(TINY)
    quiet = replay(trace, PaperPolicy(), progress=True)
    assert console.getvalue() == ""                      # done before PROGRESS_AFTER: nothing shown
    slow = replay(trace, Counted(delay=0.0002), progress=True)
    shown = console.getvalue()
    assert f"replaying {trace.name}: Counted(delay=0.0002)" in shown and f"/{len(trace.requests())}" in shown
    assert slow.peak_reserved == quiet.peak_reserved and slow.stats == quiet.stats


def test_ctrl_c_stops_a_replay_with_progress(console, monkeypatch):
    """The worker's loop stops at once (the stop flag), and KeyboardInterrupt reaches the caller."""
    import _thread
    import threading

    trace = load(TINY)
    threading.Timer(0.3, _thread.interrupt_main).start()
    started = time.perf_counter()
    Counted.calls[0] = 0
    with pytest.raises(KeyboardInterrupt):
        replay(trace, Counted(delay=0.01), progress=True)     # would take minutes
    assert time.perf_counter() - started < 5
    calls = Counted.calls[0]
    time.sleep(0.1)
    assert Counted.calls[0] == calls                     # the worker is done
