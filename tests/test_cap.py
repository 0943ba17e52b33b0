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
