"""The memory CUDA's libraries hold outside the allocator: sampled by a capture (Note [Sampling the libraries'
memory]), carried by the trace, and held by the replay's device (Note [The libraries' memory in replay]), so that a
replay with a device limit fails where the libraries would have, and the smallest device leaves them their share."""
from __future__ import annotations

import gzip
import pickle
import subprocess
import sys
import textwrap

import pytest

from gmlake import Allocator, SimDriver
from gmlake.policies import ExpandablePolicy
from gmlake.sim.cap import limits, smallest_device_memory
from gmlake.sim.replay import replay
from gmlake.sim.trace import TraceError, load, load_compact, save_compact
from gmlake.torch.outside import TOLERANCE, OutsideSampler

MiB = 1 << 20
T0 = 1_700_000_000_000_000          # time_us as torch writes it: microseconds since the epoch


def _snapshot(tmp_path, outside: list | None, name: str = "libs") -> object:
    """One step: a 200 MiB activation, freed; then, after the libraries took 300 MiB more (a kernel loaded for a new
    shape, 10 ms in), a 400 MiB activation. The samples are what a capture keeps: the first when CUDA started."""
    base = 0x1000_0000
    trace = [
        {"action": "alloc", "addr": base, "size": 200 * MiB, "stream": 0, "time_us": T0 + 1_000},
        {"action": "free_completed", "addr": base, "size": 200 * MiB, "stream": 0, "time_us": T0 + 5_000},
        {"action": "alloc", "addr": base, "size": 400 * MiB, "stream": 0, "time_us": T0 + 20_000},
        {"action": "free_completed", "addr": base, "size": 400 * MiB, "stream": 0, "time_us": T0 + 30_000},
    ]
    meta = {"name": name, "device_total": 80 << 30}
    if outside is not None:
        meta["outside_allocator"] = outside
    path = tmp_path / f"{name}.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": [], "device_traces": [trace], "gmlake": meta})))
    return path


SAMPLES = [[T0, 500 * MiB], [T0 + 10_000, 800 * MiB]]      # 500 MiB at start (the context), 300 MiB more later


def test_a_trace_places_the_libraries_growth_at_the_first_request_after_its_sample(tmp_path):
    trace = load(_snapshot(tmp_path, SAMPLES))
    assert trace.meta["outside"] == [[0, 0], [2, 300 * MiB]]        # growth from the first sample, at event 2
    at, held = trace.outside_of_requests()
    assert at.tolist() == [0, 2] and held.tolist() == [0, 300 * MiB]
    assert trace.outside_peak == 300 * MiB
    compact = load_compact(save_compact(trace, tmp_path / "libs.gmtrace"))
    assert compact.meta["outside"] == trace.meta["outside"]


def test_a_device_the_allocator_alone_fits_fails_in_the_libraries_and_says_so(tmp_path):
    """420 MiB of device: the allocator's 400 MiB fit, but not beside the libraries' 300 MiB. Without the samples
    the same device fits; with them the replay fails as a library's failure, not as an allocator out-of-memory."""
    with_libs, without = load(_snapshot(tmp_path, SAMPLES)), load(_snapshot(tmp_path, None, "plain"))
    assert not replay(without, "expandable", device_memory=420 * MiB).failed
    got = replay(with_libs, "expandable", device_memory=420 * MiB)
    assert got.failed and got.library_failures == 1 and got.ooms == 0
    assert got.summary()["library_failures"] == 1
    fits = replay(with_libs, "expandable", device_memory=720 * MiB)
    assert not fits.failed and fits.peak_outside == 300 * MiB


def test_the_smallest_device_leaves_the_libraries_their_share(tmp_path):
    with_libs, without = load(_snapshot(tmp_path, SAMPLES)), load(_snapshot(tmp_path, None, "plain"))
    alone = smallest_device_memory(without, "expandable")[0]
    shared = smallest_device_memory(with_libs, "expandable")[0]
    assert shared >= alone + 300 * MiB - 0.01 * shared
    # The device's multiple of the peak counts the allocator's share alone, as a device-limit run leaves
    # k x peak + the libraries' share (docs/benchmarks.md, "The device as the limit, libraries loading lazily").
    row = limits(with_libs, "expandable")
    assert row["libraries_peak"] == 300 * MiB
    assert row["smallest_device_memory_x_peak"] == pytest.approx((shared - 300 * MiB) / row["peak_allocated"])


def test_a_model_driver_never_maps_what_the_libraries_hold():
    driver = SimDriver(capacity=100 * MiB)
    assert driver.set_outside_bytes(60 * MiB)
    alloc = Allocator(driver, ExpandablePolicy())
    with pytest.raises(MemoryError):
        alloc.malloc(60 * MiB)
    ptr = alloc.malloc(30 * MiB)
    assert not driver.set_outside_bytes(90 * MiB)         # no room beside the allocator's chunks: unchanged
    assert driver.outside_bytes == 60 * MiB
    assert driver.set_outside_bytes(10 * MiB)             # the libraries give memory back
    alloc.free(ptr)
    with pytest.raises(ValueError):
        driver.set_outside_bytes(-1)


def test_malformed_outside_metadata_is_refused_or_ignored(tmp_path):
    # Samples are untrusted: malformed ones are dropped and the trace still loads.
    assert "outside" not in load(_snapshot(tmp_path, [["x", 1], [T0, -5]], "junk")).meta
    trace = load(_snapshot(tmp_path, SAMPLES))
    trace.meta["outside"] = [[2, 5], [1, 7]]              # not ascending
    with pytest.raises(TraceError, match="outside-memory"):
        load_compact(save_compact(trace, tmp_path / "bad.gmtrace"))


def test_the_sampler_keeps_changes_two_samples_agree_on():
    sampler = OutsideSampler(lambda: 0)
    for when, held in [(0, 500 * MiB), (1, 500 * MiB + TOLERANCE // 2), (2, 900 * MiB), (3, 500 * MiB),
                       (4, 700 * MiB), (5, 700 * MiB + 1), (6, 700 * MiB)]:
        sampler.offer(when, held)
    # 900 MiB once (a segment caught between its mapping and its count) is not kept; 700 MiB twice is.
    assert sampler.samples == [[0, 500 * MiB], [5, 700 * MiB + 1]]
    with pytest.raises(ValueError):
        OutsideSampler(lambda: 0, interval=0)


def test_the_sampler_thread_is_stopped_before_the_interpreter_finalizes():
    """Note [The sampler stops before the interpreter does]: a daemon thread caught inside torch's mem_get_info at
    finalization aborts the process. An atexit hook registered before gmlake's runs after it, and must find the
    sampling thread ended and its samples still there."""
    program = textwrap.dedent("""
        import atexit, time
        seen = {}
        atexit.register(lambda: print("alive" if seen["s"]._thread.is_alive() else "stopped", len(seen["s"].samples)))
        from gmlake.torch import outside
        outside.OutsideSampler.sample = lambda self: (time.sleep(0.001), self.samples.append([0, 1]))
        seen["s"] = outside.start(lambda: 0, interval=0.001)
        time.sleep(0.05)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    word, kept = done.stdout.split()
    assert word == "stopped" and int(kept) > 0, done.stdout


def test_the_replay_table_counts_a_library_failure_and_says_so(tmp_path, capsys):
    from gmlake.cli import main

    path = _snapshot(tmp_path, SAMPLES)
    assert main(["replay", str(path), "--policy", "expandable", "--device-memory", str(420 * MiB)]) == 3      # EXIT_OUT_OF_MEMORY: a replay failed
    out = " ".join(capsys.readouterr().out.split())
    assert "FAILED: 1 of 1 replays" in out and "1 of them the libraries' memory growing" in out
