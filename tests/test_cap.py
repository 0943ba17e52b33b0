"""gmlake.sim.cap.smallest_cap: replay's answer to "what is the smallest memory cap this run fits under with a
policy?" (issue 10's cap goal, predicted on the CPU before the GPU's bisection), and the two rules that make a cap
differ from a device that size: PyTorch's whole-request check (Note [Releasing before the cap binds]) and gmlake's
re-backing at the edge (Note [Taking slots back at the edge]), and the finer pages a policy may ask for under a cap
(Note [Finer pages under a cap])."""
from __future__ import annotations

import pytest

import gmlake
from gmlake.policies import ExpandablePolicy, GMLakePolicy
from gmlake.sim.cap import smallest_cap
from gmlake.sim.replay import replay, trace_path
from gmlake.sim.trace import load

MiB = 1 << 20


@pytest.fixture(scope="module")
def gpt2l():
    return load(trace_path("gpt2l-lora-ckpt-native"))


@pytest.mark.parametrize("policy", ["expandable", "gmlake"])
def test_the_smallest_cap_fits_and_the_bracket_is_within_the_resolution(gpt2l, policy):
    fit, fail, probed = smallest_cap(gpt2l, policy, resolution=0.002)
    assert replay(gpt2l, policy, cap=fit, samples=0).ooms == 0
    assert replay(gpt2l, policy, cap=fail, samples=0).ooms > 0
    assert fail < fit <= fail * 1.002 + 1
    uncapped = replay(gpt2l, policy, samples=0)
    assert uncapped.peak_allocated <= fit <= uncapped.peak_reserved
    assert fit in probed or fit == uncapped.peak_reserved


def test_gmlake_fits_under_a_smaller_cap_than_expandable_segments(gpt2l):
    """11.88 GiB against 11.92. Under a cap, expandable segments release free pages and map them again, which comes
    within 1 % of the peak allocated (11.80 GiB); uncapped they keep 13.52. Stitching at the edge by its own rule
    (Note [Stitching at the edge]) takes gmlake from 11.90 to 11.88. With re-backing turned on (reback_slot=2MiB, off
    by default: Note [Taking slots back at the edge]) gmlake needs 11.84: the free slots of partly used pages are what
    it takes back at the cap."""
    ours, theirs = smallest_cap(gpt2l, "gmlake")[0], smallest_cap(gpt2l, "expandable")[0]
    assert ours < theirs
    assert ours < smallest_cap(gpt2l, "gmlake[edge_page=0]")[0] * 0.999
    assert smallest_cap(gpt2l, "gmlake[reback_slot=2MiB]")[0] < ours * 0.997


def test_expandable_segments_count_the_whole_request_against_a_cap():
    """PyTorch's alloc_block refuses new memory while reserved + the whole request passes the cap, so it releases
    the free tail and maps the request afresh where counting only the missing pages would grow the range."""
    def run(policy):
        alloc = gmlake.Allocator(gmlake.SimDriver(capacity=1 << 30), policy, limit=100 * MiB)
        first = alloc.malloc(60 * MiB)
        alloc.free(first)                                   # 60 MiB mapped and free at the range's start
        alloc.malloc(70 * MiB)                              # 60 + 70 > 100: over the cap counted whole
        return alloc.stats()

    torch_rule, exact = run(ExpandablePolicy()), run(ExpandablePolicy(cap_counts_request=False))
    assert torch_rule["calls"]["unmap"] > 0 and torch_rule["reserved_bytes"] == 80 * MiB   # released, mapped 4 pages
    assert exact["calls"]["unmap"] == 0 and exact["reserved_bytes"] == 80 * MiB         # grew by one page
    with pytest.raises(MemoryError):                        # over the cap whole, and nothing free to release
        gmlake.Allocator(gmlake.SimDriver(capacity=1 << 30), ExpandablePolicy(), limit=100 * MiB).malloc(101 * MiB)


@pytest.mark.parametrize("limit, page", [(None, 20 * MiB), (512 * MiB, 4 * MiB), (1 << 30, 20 * MiB), (2 << 30, 20 * MiB)])
def test_a_range_made_under_a_cap_maps_finer_pages(limit, page):
    """Note [Finer pages under a cap]: capped_page_large=4MiB maps 4 MiB pages in a large-pool range made while a
    cap below the device's memory is set, 20 MiB otherwise (a cap at or above the device's memory is none)."""
    alloc = gmlake.Allocator(gmlake.SimDriver(capacity=1 << 30), GMLakePolicy(capped_page_large=4 * MiB), limit=limit)
    alloc.malloc(30 * MiB)
    (large,) = [s for s in alloc.segments_info() if s["pool"] == "large"]
    assert large["chunk_size"] == page and alloc.stats()["reserved_bytes"] == -(-30 * MiB // page) * page


def test_a_cap_set_after_the_first_range_still_gets_finer_pages():
    """A range made before the cap keeps what it mapped but grows no more under the cap: growth goes to a range of
    4 MiB pages, as if the cap had been set first (a program that loads its model, then sets the fraction). Lifting
    the cap lets the first range grow again."""
    alloc = gmlake.Allocator(gmlake.SimDriver(capacity=1 << 30), GMLakePolicy(capped_page_large=4 * MiB))
    first = alloc.malloc(30 * MiB)                          # two 20 MiB pages, 10 MiB free at the tail
    alloc.set_limit(512 * MiB)
    # Fits no free block: the old range's 10 MiB tail stitched with 20 MiB of new 4 MiB pages in a new range (an
    # old-range page would have mapped 20 MiB as well, but the next growth would have been in 20 MiB pages too).
    alloc.malloc(30 * MiB)
    pages = sorted(s["chunk_size"] for s in alloc.segments_info() if s["pool"] == "large")
    assert pages == [4 * MiB, 20 * MiB] and alloc.stats()["reserved_bytes"] == 40 * MiB + 20 * MiB
    alloc.check()
    alloc.free(first)
    alloc.malloc(8 * MiB)                                   # a free block of the old range still serves requests
    assert alloc.stats()["reserved_bytes"] == 60 * MiB
    alloc.set_limit(None)
    alloc.malloc(60 * MiB)                                  # uncapped: the 20 MiB range grows again
    assert sorted(s["chunk_size"] for s in alloc.segments_info() if s["pool"] == "large") == [4 * MiB, 20 * MiB]
    alloc.check()


def test_a_policy_that_fails_uncapped_is_refused(gpt2l):
    from gmlake.sim.trace import Trace

    tiny = Trace(gpt2l.events, {**gpt2l.meta, "device_total": 1 << 30})
    with pytest.raises(ValueError, match="even uncapped"):
        smallest_cap(tiny, "gmlake")


def gmlake_cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gmlake", *args], capture_output=True, check=False, text=True)


def test_replay_smallest_cap_from_the_command_line():
    import json

    proc = gmlake_cli("replay", "opt350m-full-ckpt-native", "--smallest-cap", "--json", "--policy", "gmlake")
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert row["policy"] == "gmlake" and row["largest_failing_cap"] < row["smallest_cap"]
    assert row["peak_allocated"] <= row["smallest_cap"] <= row["uncapped_peak_reserved"]
    assert row["smallest_cap"] == smallest_cap(load(trace_path("opt350m-full-ckpt-native")), "gmlake")[0]


def test_replay_smallest_cap_refuses_a_fixed_device_in_one_line():
    proc = gmlake_cli("replay", "opt350m-full-ckpt-native", "--smallest-cap", "--device-memory", "20GiB")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "drop --device-memory" in proc.stderr


def test_replay_under_a_cap_from_the_command_line():
    """`gmlake replay --cap`: the cap is replayed and recorded; expandable segments' model fails under a cap that
    gmlake fits (11.65 GiB on opt350m: 11.64 against 11.66), and a bad cap is one line, exit 2."""
    import json

    proc = gmlake_cli("replay", "opt350m-full-ckpt-native", "--cap", "11.65GiB", "--json",
                      "--policy", "gmlake", "--policy", "expandable")
    assert proc.returncode == 3, proc.stderr                    # a replay that ran out under the cap
    rows = {row["policy"]: row for row in map(json.loads, proc.stdout.splitlines())}
    assert rows["gmlake"]["cap"] == int(11.65 * (1 << 30)) and not rows["gmlake"]["failed"]
    assert rows["expandable"]["failed"]
    for bad in ("0", "-1", "12XB"):
        proc = gmlake_cli("replay", "opt350m-full-ckpt-native", "--cap", bad)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--cap" in proc.stderr
    proc = gmlake_cli("replay", "opt350m-full-ckpt-native", "--smallest-cap", "--cap", "20GiB")
    assert proc.returncode == 2 and "drop --cap" in proc.stderr


@pytest.mark.parametrize("policy", ["expandable", "gmlake"])
def test_the_smallest_device_fits_with_no_cap_and_the_bracket_is_within_the_resolution(gpt2l, policy):
    from gmlake.sim.cap import smallest_device_memory

    fit, fail, probed = smallest_device_memory(gpt2l, policy, resolution=0.002)
    assert replay(gpt2l, policy, device_memory=fit, samples=0).ooms == 0
    assert replay(gpt2l, policy, device_memory=fail, samples=0).ooms > 0
    assert fail < fit <= fail * 1.002 + 1 and fit in probed
    assert replay(gpt2l, policy, samples=0).peak_allocated <= fit


def test_a_cap_and_a_device_of_one_size_are_one_limit_for_gmlake(gpt2l):
    """The default keeps its pages under a cap and re-backs where either limit binds, so a cap and a device of the
    same size fit alike (11.84 GiB on this trace); finer pages under a cap (capped_page_large=4MiB) pack the cap
    closer, 11.82. The expandable model, with one page size, fits both alike too."""
    from gmlake.sim.cap import smallest_device_memory

    assert smallest_cap(gpt2l, "gmlake")[0] == smallest_device_memory(gpt2l, "gmlake")[0]
    assert smallest_cap(gpt2l, "gmlake[capped_page_large=4MiB]")[0] < smallest_cap(gpt2l, "gmlake")[0]
    cap, device = smallest_cap(gpt2l, "expandable")[0], smallest_device_memory(gpt2l, "expandable")[0]
    assert abs(cap - device) <= 0.002 * cap


def test_replay_smallest_cap_shows_the_smallest_device_beside_it():
    import json

    proc = gmlake_cli("replay", "tests/data/tiny-gpt2-native.pickle.gz", "--smallest-cap", "--json",
                      "--policy", "gmlake", "--policy", "expandable")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["policy"] for r in rows] == ["gmlake", "expandable"]
    for r in rows:
        assert r["largest_failing_device_memory"] < r["smallest_device_memory"] <= r["uncapped_peak_reserved"]
        assert r["peak_allocated"] <= r["smallest_device_memory"]
    table = gmlake_cli("replay", "tests/data/tiny-gpt2-native.pickle.gz", "--smallest-cap", "--policy", "gmlake")
    headers = [line for line in table.stdout.splitlines() if line.startswith("┃")]   # on two lines: 80 columns
    assert table.returncode == 0 and len(headers) == 2
    assert "smallest" in headers[0] and "device" in headers[1] and "cap" in headers[1]


def test_a_cap_that_never_binds_costs_the_default_nothing(gpt2l):
    """The edge goal "nothing for a cap that does not bind": at twice the peak allocated, the default's driver
    calls and peak reserved are the uncapped run's (its pages do not change under a cap, and re-backing runs only
    where the limit binds)."""
    uncapped = replay(gpt2l, "gmlake")
    capped = replay(gpt2l, "gmlake", cap=2 * uncapped.peak_allocated)
    assert capped.ooms == uncapped.ooms == 0
    assert capped.peak_reserved == uncapped.peak_reserved
    assert capped.stats["calls"] == uncapped.stats["calls"]


@pytest.mark.parametrize("policy", ["gmlake", "caching", "expandable"])
def test_zero_is_a_limit_like_any_other_and_none_is_no_limit(policy):
    """Note [No limit]: a limit of 0 bytes refuses every request, as PyTorch's allocator does under
    set_per_process_memory_fraction(0), the same at construction and from set_limit; None is no limit."""
    def made() -> gmlake.Allocator:
        return gmlake.Allocator(gmlake.SimDriver(capacity=1 << 30), gmlake.policies.get(policy))

    assert made().limit is None
    set_to_zero = made()
    set_to_zero.set_limit(0)
    made_with_zero = gmlake.Allocator(gmlake.SimDriver(capacity=1 << 30), gmlake.policies.get(policy), limit=0)
    for alloc in (made_with_zero, set_to_zero):
        assert alloc.limit == 0
        with pytest.raises(gmlake.OutOfMemoryError) as info:
            alloc.malloc(512)
        assert info.value.limit == 0 and "cap 0.00 MiB" in str(info.value)
        alloc.set_limit(None)
        assert alloc.limit is None
        alloc.free(alloc.malloc(512))
        with pytest.raises(ValueError):
            alloc.set_limit(-1)
