"""A cut at reuse (Note [Fine pages at reuse]) synchronizes the device; CUDA forbids that while any stream captures a
graph, on any thread. The model drivers' synchronize fails then and invalidates the capture, as cuCtxSynchronize
does, so a cut that ignores a capture fails these tests (Note [A cut under another thread's capture]). The GPU test
is tests/test_capture_gpu.py."""
from __future__ import annotations

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


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_no_cut_while_another_thread_captures_an_announced_graph(driver_name):
    """One thread captures graphs into a private pool, over and over (begun, captured, ended, released, as
    torch.cuda.graph does); the main thread's requests would cut a page each. No capture is broken, no request
    fails, and cuts happen between captures."""
    alloc = make(driver_name)
    driver = alloc.driver
    stop = threading.Event()
    capturing = threading.Event()
    errors: list[str] = []
    captures = [0]

    def capture_graphs() -> None:
        pid = 100
        try:
            while not stop.is_set():
                pid += 1
                alloc.begin_allocate_to_pool(pid, [CAPTURE_STREAM], capturing=True)
                driver.begin_raw_capture(CAPTURE_STREAM)
                capturing.set()
                blocks = [alloc.malloc(n * MiB, CAPTURE_STREAM) for n in (1, 3, 25)]
                time.sleep(0.001)
                for p in blocks:
                    alloc.free(p)
                capturing.clear()
                driver.end_raw_capture(CAPTURE_STREAM)          # raises where a synchronize broke the capture
                alloc.end_allocate_to_pool(pid)
                alloc.release_pool(pid)
                captures[0] += 1
                time.sleep(0.002)                               # a window between captures, where cuts are made
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(f"capture thread: {exc!r}")
            capturing.clear()

    thread = threading.Thread(target=capture_graphs)
    thread.start()
    keep: list[int] = []
    during = 0
    try:
        for _ in range(150 if driver_name == "sim" else 25):
            was = capturing.is_set()
            keep.append(_cut_once(alloc, keep))
            during += was and capturing.is_set()
            if errors:
                break
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive() and errors == [], errors
    s = alloc.stats()
    assert captures[0] > 0 and s["tails_cut_at_reuse"] > 0, (captures, s["tails_cut_at_reuse"], during)
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
