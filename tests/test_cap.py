"""gmlake.cap.smallest_device: replay's answer to "what is the smallest device this run fits on under a policy?"
(issue 10's cap goal, predicted on the CPU before the GPU's bisection)."""
from __future__ import annotations

import pytest

from gmlake.cap import smallest_device
from gmlake.replay import replay, trace_path
from gmlake.trace import load


@pytest.fixture(scope="module")
def gpt2l():
    return load(trace_path("gpt2l-lora-ckpt-native"))


@pytest.mark.parametrize("policy", ["expandable", "gmlake"])
def test_the_smallest_device_fits_and_the_bracket_is_within_the_resolution(gpt2l, policy):
    fit, fail, probed = smallest_device(gpt2l, policy, resolution=0.002)
    assert replay(gpt2l, policy, device_memory=fit, samples=0).ooms == 0
    assert replay(gpt2l, policy, device_memory=fail, samples=0).ooms > 0
    assert fail < fit <= fail * 1.002 + 1
    uncapped = replay(gpt2l, policy, samples=0)
    assert uncapped.peak_allocated <= fit <= uncapped.peak_reserved
    assert fit in probed or fit == uncapped.peak_reserved


def test_gmlake_fits_on_a_device_no_larger_than_expandable_segments_needs(gpt2l):
    """Measured 2026-11-30: 11.90 GiB for both (gmlake 0.03 % less): under a cap, expandable segments release free
    pages and map them again, which comes within 1 % of the peak allocated (11.80 GiB); uncapped they keep 13.52."""
    ours, theirs = smallest_device(gpt2l, "gmlake")[0], smallest_device(gpt2l, "expandable")[0]
    assert ours <= theirs * 1.002


def test_a_policy_that_fails_uncapped_is_refused(gpt2l):
    from gmlake.trace import Trace

    tiny = Trace(gpt2l.events, {**gpt2l.meta, "device_total": 1 << 30})
    with pytest.raises(ValueError, match="even uncapped"):
        smallest_device(tiny, "gmlake")


def gmlake_cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gmlake", *args], capture_output=True, text=True)


def test_replay_smallest_device_from_the_command_line():
    import json

    proc = gmlake_cli("replay", "opt350m-full-ckpt-native", "--smallest-device", "--json", "--policy", "gmlake")
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert row["policy"] == "gmlake" and row["largest_failing_device"] < row["smallest_device"]
    assert row["peak_allocated"] <= row["smallest_device"] <= row["uncapped_peak_reserved"]


def test_replay_smallest_device_refuses_a_fixed_device_in_one_line():
    proc = gmlake_cli("replay", "opt350m-full-ckpt-native", "--smallest-device", "--device-memory", "20GiB")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "drop --device-memory" in proc.stderr
