"""A cut at reuse (Note [Fine pages at reuse]) synchronizes the device; CUDA forbids that while any stream captures a
graph, on any thread. The model drivers' synchronize fails then and invalidates the capture, as cuCtxSynchronize
does, so a cut that ignores a capture fails these tests (Note [A cut under another thread's capture]). The GPU test
is tests/test_capture_gpu.py."""
from __future__ import annotations

import queue
import threading
import time

import pytest

import gmlake
from gmlake import Allocator, HostDriver, SimDriver

MiB = 1 << 20
PAGE = 20 * MiB
CAPTURE_STREAM = 7


def make(driver_name: str, percent: int = 1000) -> Allocator:
    driver = HostDriver() if driver_name == "host" else SimDriver()
    alloc = Allocator(driver, gmlake.policies.get("gmlake", tail_page=2 * MiB, cut_at_reuse=percent))
    alloc.debug_checks = True
    return alloc


def _cut_once(alloc: Allocator, keep: list) -> int:
    """Grow memory (a new high: the run lays out its memory), then reuse a free run so that a block ends inside a
    whole page: the request that cuts, where nothing forbids it. Returns that block."""
    a = alloc.malloc(2 * PAGE)
    keep.append(alloc.malloc(PAGE))
    alloc.free(a)
    return alloc.malloc(PAGE + 5 * MiB)


def test_the_model_refuses_a_synchronize_during_a_capture_and_breaks_the_capture():
    """What the tests below rely on: the model synchronizes as cuCtxSynchronize does under a capture."""
    driver = SimDriver()
    alloc = Allocator(driver, gmlake.policies.get("gmlake"))
    driver.begin_raw_capture(3)
    with pytest.raises(gmlake.DriverError, match="capturing"):
        alloc.empty_cache()
    with pytest.raises(RuntimeError, match="invalidated"):
        driver.end_raw_capture(3)
    alloc.empty_cache()                         # no capture: synchronizes
    driver.begin_raw_capture(3)
    driver.end_raw_capture(3)                   # nothing synchronized during it: ends cleanly


def _capture_loop(alloc: Allocator, rounds: int, between, errors: list[str]) -> None:
    """Capture graphs into private pools as torch.cuda.graph does (begin the pool, begin the capture, allocate in
    it, end the capture, end and release the pool), `rounds` times; `between(phase)` is called during each capture
    ("captured") and after it ("between")."""
    driver = alloc.driver
    try:
        for pid in range(101, 101 + rounds):
            alloc.begin_allocate_to_pool(pid, [CAPTURE_STREAM], capturing=True)
            driver.begin_raw_capture(CAPTURE_STREAM)
            blocks = [alloc.malloc(n * MiB, CAPTURE_STREAM) for n in (1, 3, 25)]
            between("captured")
            for p in blocks:
                alloc.free(p)
            driver.end_raw_capture(CAPTURE_STREAM)          # raises where a synchronize broke the capture
            alloc.end_allocate_to_pool(pid)
            alloc.release_pool(pid)
            between("between")
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(f"capture thread: {exc!r}")


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_no_cut_while_another_thread_captures_an_announced_graph(driver_name):
    """One thread captures graphs, over and over; in turn with it, the main thread makes requests that would cut a
    page each, during each capture and between captures. No capture is broken and no request fails; the requests
    between captures cut, those during a capture do not."""
    alloc = make(driver_name)
    turns: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()
    errors: list[str] = []
    rounds = 20

    def between(phase: str) -> None:
        turns.put(phase)
        done.get(timeout=30)

    thread = threading.Thread(target=_capture_loop, args=(alloc, rounds, between, errors))
    thread.start()
    keep: list[int] = []
    cuts = {"captured": 0, "between": 0}
    try:
        for _ in range(2 * rounds):
            phase = turns.get(timeout=30)
            before = alloc.stats()["tails_cut_at_reuse"]
            keep.append(_cut_once(alloc, keep))
            cuts[phase] += alloc.stats()["tails_cut_at_reuse"] - before
            done.put(None)
    finally:
        thread.join(timeout=60)
    assert not thread.is_alive() and errors == [], errors
    assert cuts == {"captured": 0, "between": rounds}, cuts
    alloc.check()
    for p in keep:
        alloc.free(p)
    alloc.close()


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_requests_racing_captures_on_another_thread_break_none(driver_name):
    """The same, free running: requests and captures interleave as the threads' scheduling makes them. No capture
    is broken, no request fails, and the invariants hold."""
    alloc = make(driver_name)
    errors: list[str] = []
    stop = threading.Event()

    def between(phase: str) -> None:
        time.sleep(0.001)
        if stop.is_set() and phase == "between":          # the loop's way out, between captures
            raise StopIteration

    thread = threading.Thread(target=_capture_loop, args=(alloc, 10_000, between, errors))
    thread.start()
    keep: list[int] = []
    try:
        for _ in range(120 if driver_name == "sim" else 25):
            keep.append(_cut_once(alloc, keep))
            if errors:
                break
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert all("StopIteration" in e for e in errors), errors
    alloc.check()
    for p in keep:
        alloc.free(p)
    alloc.close()


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_a_capture_begun_while_a_cut_synchronizes_waits_for_the_request(driver_name):
    """The race: another thread announces and starts a capture right as the cut is about to synchronize (after its
    check). The announcement waits for the allocator's lock, which the request holds through the synchronize, so
    the capture starts only after the request is served: the cut completes and the capture is not broken."""
    alloc = make(driver_name)
    driver = alloc.driver
    begun = threading.Event()
    errors: list[str] = []
    order: list[str] = []

    def announce_and_capture() -> None:
        try:
            alloc.begin_allocate_to_pool(1, [CAPTURE_STREAM], capturing=True)
            driver.begin_raw_capture(CAPTURE_STREAM)
            order.append("capture")
            begun.set()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(repr(exc))
            begun.set()

    thread = threading.Thread(target=announce_and_capture)

    def at_synchronize() -> None:
        driver.sync_hook = None
        thread.start()
        begun.wait(0.3)             # long enough for the capture to begin, were nothing holding it back
        order.append("synchronize")

    keep: list[int] = []
    a = alloc.malloc(2 * PAGE)
    keep.append(alloc.malloc(PAGE))
    alloc.free(a)
    driver.sync_hook = at_synchronize
    b = alloc.malloc(PAGE + 5 * MiB)
    thread.join(timeout=10)
    assert errors == [] and order == ["synchronize", "capture"], (errors, order)
    assert alloc.stats()["tails_cut_at_reuse"] == 1
    driver.end_raw_capture(CAPTURE_STREAM)      # not invalidated
    alloc.end_allocate_to_pool(1)
    alloc.release_pool(1)
    for p in (b, *keep):
        alloc.free(p)
    alloc.close()


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_a_cut_under_an_unannounced_capture(driver_name):
    """A capture nobody announced: on the request's own stream the cut is not tried (no synchronize, the capture
    stays valid); on another thread's stream it cannot be seen, its synchronize fails, and the request is served
    uncut, with no error (that capture is broken, as by any synchronize during it: the Note's limit)."""
    alloc = make(driver_name)
    driver = alloc.driver
    keep: list[int] = []
    a = alloc.malloc(2 * PAGE)
    keep.append(alloc.malloc(PAGE))
    alloc.free(a)
    driver.begin_raw_capture(0)                 # the request's own stream
    syncs = alloc.stats()["calls"]["synchronize"]
    b = alloc.malloc(PAGE + 5 * MiB)
    s = alloc.stats()
    assert b == a and s["tails_cut_at_reuse"] == 0 and s["calls"]["synchronize"] == syncs
    driver.end_raw_capture(0)
    alloc.free(b)
    driver.begin_raw_capture(CAPTURE_STREAM)    # another stream's
    b = alloc.malloc(PAGE + 5 * MiB)
    s = alloc.stats()
    assert b == a and s["tails_cut_at_reuse"] == 0 and s["calls"]["synchronize"] == syncs + 1
    with pytest.raises(RuntimeError, match="invalidated"):
        driver.end_raw_capture(CAPTURE_STREAM)
    alloc.check()
    for p in (b, *keep):
        alloc.free(p)
    alloc.close()
