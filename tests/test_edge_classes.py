"""Tests written for classes of bugs in the code at the edge of memory, not for one line each: the knob checks
(granularity, sizes of a GiB and more), the trace readers' limits in every format they accept. The allocator's
classes (re-backing, pressure relief, tail pages, cuts at reuse) are in tests/test_edge_classes_core.py."""
from __future__ import annotations

import gzip
import json
import lzma
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlake import policies
from gmlake.cli import EXIT_BAD_INPUT, main
from gmlake.policies.knobs import format_knob, knob_specs
from gmlake.policies.settings import parse_size
from gmlake.sim import MAX_DEVICE_MEMORY
from gmlake.sim import trace as trace_module
from gmlake.sim.trace import EVENT_DTYPE, MAGIC, VERSION, Trace, TraceError, load, save_compact

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
UNITS = (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))


# ------------------------------------------------------------------ format_knob: every size, GiB and up included


@given(mantissa=st.integers(1, 5000), unit=st.sampled_from([1, KiB, MiB, GiB, TiB]), extra=st.integers(0, 3))
@settings(max_examples=300, deadline=None)
def test_format_knob_writes_any_size_in_its_largest_whole_unit_and_reads_back(mantissa, unit, extra):
    value = mantissa * unit + extra
    text = format_knob(value, "bytes")
    assert parse_size(text) == value
    expected = next((f"{value // scale}{name}" for name, scale in UNITS if value % scale == 0), str(value))
    assert text == expected


@pytest.mark.parametrize("value, text", [(GiB, "1GiB"), (3 * GiB, "3GiB"), (1536 * MiB, "1536MiB"),
                                         (GiB + 2 * MiB, "1026MiB"), (TiB, "1TiB"), (80 * GiB, "80GiB"),
                                         (GiB + 1, str(GiB + 1))])
def test_format_knob_at_a_gib_and_more(value, text):
    assert format_knob(value, "bytes") == text


def test_a_knob_message_writes_a_gib_size_as_set(capsys):
    """The messages that quote a size knob write it as the user set it: a large page of 1 GiB that a tail page of
    6 MiB does not divide."""
    with pytest.raises(ValueError) as got:
        policies.resolve("gmlake[expandable_page_large=1GiB,tail_page=6MiB]")
    assert "tail_page 6MiB" in str(got.value) and "expandable_page_large 1GiB" in str(got.value)


# ------------------------------------------------------------------ size knobs and the driver's granularity

GRANULAR = sorted(name for name, spec in knob_specs().items() if spec["granular"])


def _expandable_knobs(name: str, value: int) -> dict:
    """Settings under which `name`=`value` is read and passes every check but the granularity's."""
    knobs = {name: value, "expandable_page_large": 20 * MiB}
    if name in ("reback_slot", "tail_page"):
        return knobs
    if name == "expandable_page_large":
        return {name: 20 * value}
    return knobs


@pytest.mark.parametrize("granularity", [2 * MiB, 64 * KiB])
@pytest.mark.parametrize("name", ["reback_slot", "tail_page", "edge_page", "capped_page_large",
                                  "expandable_page_small", "large_segment_size", "round_large"])
def test_a_size_that_divides_the_page_but_not_the_granularity_is_refused_in_one_line(name, granularity):
    """A re-back slot of 5 MiB divides a 20 MiB page but not a 2 MiB granularity: refused, naming the knob as set
    and the granularity; a multiple of the granularity that divides the page is taken."""
    tried = 0
    for value in (granularity // 2, 5 * MiB, 160 * KiB, 1 * MiB, 3 * granularity // 2, 2 * granularity + 4 * KiB):
        if value % granularity == 0 or (name in ("reback_slot", "tail_page") and (20 * MiB) % value):
            continue
        tried += 1
        spec = "gmlake[" + ",".join(f"{k}={format_knob(v, 'bytes')}" for k, v in _expandable_knobs(name, value).items()) + "]"
        with pytest.raises(ValueError) as got:
            policies.resolve(spec, granularity=granularity)
        text = str(got.value)
        assert "\n" not in text and f"{name} {format_knob(value, 'bytes')}" in text and "granularity" in text, text
        assert format_knob(granularity, "bytes") in text
    assert tried >= 2
    fine = "gmlake[" + ",".join(f"{k}={format_knob(v, 'bytes')}" for k, v in
                                _expandable_knobs(name, 2 * granularity if name != "expandable_page_large"
                                                  else granularity).items()) + "]"
    if name in ("reback_slot", "tail_page"):
        fine = f"gmlake[{name}={format_knob(2 * MiB, 'bytes')}]"
    policies.resolve(fine, granularity=granularity)


def test_every_granular_knob_is_checked_against_the_granularity():
    """Each knob declared granular is refused off the granularity by validate, whatever its name."""
    from gmlake.policies.caching import CachingPolicy
    from gmlake.policies.gmlake import GMLakePolicy, PaperPolicy

    checked = set()
    for cls in (GMLakePolicy, PaperPolicy, CachingPolicy):
        for name in GRANULAR:
            try:
                cls(**{name: 10 * MiB}).validate(2 * MiB)       # read by this policy's growth
            except ValueError:
                continue
            value = 5 * MiB                                     # divides a 20 MiB page, not a 2 MiB granularity
            with pytest.raises(ValueError, match=f"{name} 5MiB is not a multiple of the driver's granularity 2MiB"):
                cls(**{name: value}).validate(2 * MiB)
            checked.add(name)
    assert checked == set(GRANULAR)


def test_on_the_host_driver_and_in_replay_the_granularity_is_the_drivers(capsys):
    from gmlake import Allocator, HostDriver

    driver = HostDriver()
    granularity = driver.granularity
    value = 5 * granularity // 2 if (5 * granularity // 2) % granularity else granularity + 1
    with pytest.raises(ValueError, match="granularity"):
        Allocator(driver, policies.get("gmlake", reback_slot=value, expandable_page_large=10 * granularity))
    assert main(["replay", "tests/data/tiny-gpt2-native.pickle.gz", "--policy", "gmlake",
                 "--set", "reback_slot=5MiB"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reback_slot 5MiB" in err and "granularity 2MiB" in err, err


# ------------------------------------------------------------------ trace limits, in every format load accepts


def _snapshot(size: int) -> bytes:
    return pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 4096, "size": size, "stream": 0},
                                            {"action": "free_completed", "addr": 4096, "size": size, "stream": 0}]]})


def _gmtrace_bytes(sizes: list[int], meta: dict | None = None) -> bytes:
    events = np.zeros(len(sizes), dtype=EVENT_DTYPE)
    events["size"] = sizes
    events["id"] = np.arange(len(sizes))
    header = json.dumps({"events": len(sizes), "name": "crafted", **(meta or {})}).encode()
    return lzma.compress(MAGIC + struct.pack("<II", VERSION, len(header)) + header + events.tobytes())


FORMATS = {
    "pickle": lambda size: ("t.pickle", _snapshot(size)),
    "pickle.gz": lambda size: ("t.pickle.gz", gzip.compress(_snapshot(size))),
    "pickle, no suffix": lambda size: ("t", _snapshot(size)),
    "gzip, no suffix": lambda size: ("t.bin", gzip.compress(_snapshot(size))),
    "gmtrace": lambda size: ("t.gmtrace", _gmtrace_bytes([4096, size])),
    "gmtrace, no suffix": lambda size: ("t.trace", _gmtrace_bytes([size])),
}


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("size", [MAX_DEVICE_MEMORY + 1, 1 << 62, (1 << 64) - 1])
def test_an_event_larger_than_any_device_is_refused_in_every_format(tmp_path, capsys, form, size):
    if size >= 1 << 63 and form.startswith(("pickle", "gzip")):
        size = (1 << 63) - 1                  # a snapshot's sizes are signed
    name, data = FORMATS[form](size)
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(TraceError, match="more than any device holds|out-of-range"):
        load(path)
    assert main(["replay", str(path), "--policy", "gmlake"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("form", FORMATS)
def test_an_event_of_exactly_the_largest_device_is_read_in_every_format(tmp_path, form):
    name, data = FORMATS[form](MAX_DEVICE_MEMORY)
    path = tmp_path / name
    path.write_bytes(data)
    assert int(load(path).events["size"].max()) == MAX_DEVICE_MEMORY


@pytest.mark.parametrize("form", ["pickle.gz", "gmtrace"])
def test_a_compressed_trace_that_unpacks_past_the_limit_is_one_line_not_an_allocation(tmp_path, monkeypatch, form):
    """A small file that claims gigabytes (a run of zeros compresses a thousandfold) is read only as far as the
    limit: here a limit of 1 MiB and 4 MiB of content."""
    monkeypatch.setattr(trace_module, "MAX_TRACE_BYTES", MiB)
    if form == "pickle.gz":
        path = tmp_path / "bomb.pickle.gz"
        path.write_bytes(gzip.compress(pickle.dumps({"device_traces": [[]], "pad": bytes(4 * MiB)})))
    else:
        path = tmp_path / "bomb.gmtrace"
        path.write_bytes(_gmtrace_bytes([0] * (4 * MiB // EVENT_DTYPE.itemsize)))
    assert path.stat().st_size < MiB // 4
    with pytest.raises(TraceError, match="unpacks to more than 1 MiB"):
        load(path)
    small = tmp_path / f"small.{form}"
    if form == "gmtrace":
        save_compact(Trace(np.zeros(0, dtype=EVENT_DTYPE), {"name": "s"}), small)
        assert len(load(small).events) == 0


@pytest.mark.parametrize("form", ["gmtrace", "pickle"])
def test_a_device_size_larger_than_any_device_is_refused_in_every_format(tmp_path, form):
    path = tmp_path / f"t.{form}"
    meta = {"device_total": MAX_DEVICE_MEMORY + 1}
    if form == "gmtrace":
        path.write_bytes(_gmtrace_bytes([4096], meta))
    else:
        path.write_bytes(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 0, "size": 4096}]],
                                       "gmlake": meta}))
    with pytest.raises(TraceError, match="more than any device holds"):
        load(path)


# ------------------------------------------------------------------ the outside-memory sampler after its exit hook


@pytest.mark.parametrize("read", ["samples", "stop"])
@pytest.mark.parametrize("held", [[0, 5 * MiB, 5 * MiB, 9 * MiB, 9 * MiB], [3 * MiB, 3 * MiB], []])
def test_the_sampler_keeps_its_samples_after_its_exit_hook(monkeypatch, read, held):
    """The exit hook stops the sampling thread (Note [The sampler stops before the interpreter does]); what a
    capture's dump then reads (samples() while a snapshot is taken, stop() at the end) is every change kept before,
    and no sample comes after."""
    import threading

    from gmlake.torch import outside

    values = iter(held)
    done = threading.Event()

    def sample(self):
        try:
            self.offer(len(self.samples) + 1, next(values))
        except StopIteration:
            done.set()

    monkeypatch.setattr(outside.OutsideSampler, "sample", sample)
    monkeypatch.setattr(outside, "_active", None)
    sampler = outside.start(lambda: 0, interval=0.001)
    assert done.wait(10)
    kept = [list(s) for s in sampler.samples]
    outside._halt_at_exit()
    assert not sampler._thread.is_alive()
    outside._halt_at_exit()                       # twice: harmless
    got = outside.samples() if read == "samples" else outside.stop()
    assert got == kept and [value for _, value in got] == sorted(set(held))
    assert outside.samples() == (kept if read == "samples" else [])
