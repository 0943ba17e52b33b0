"""`gmlake tune` recommends more memory than the default policy only for driver time a step would show (Note [What
tune may trade for memory], gmlake/sim/tune.py): at least 1 % of the time the trace spans; never where the trace
records no time, which holds of every bundled trace."""
from __future__ import annotations

from pathlib import Path

import pytest

from gmlake.sim import tune
from gmlake.sim.trace import load

GiB = 1 << 30
# The bundled traces' requests: each workload's -expandable trace replays as its -native one.
WORKLOADS = ["opt350m-full-ckpt-native", "gpt2l-lora-ckpt-native", "opt1.3b-lora-native"]


def default_of(result: tune.TuneResult) -> tune.Outcome:
    return next(o for o in result.outcomes if o.base == "gmlake" and not o.knobs)


@pytest.mark.parametrize("name", WORKLOADS)
def test_no_recommendation_reserves_more_than_the_default_on_the_bundled_traces(name):
    trace = load(name)
    assert "seconds" not in trace.meta
    result = tune.tune(trace, jobs=2)
    assert result.recommended is not None
    assert result.recommended.peak_reserved <= default_of(result).peak_reserved, result.reason
    assert "the trace records no run time" in result.reason


def test_under_a_fit_too():
    result = tune.tune(load("opt350m-full-ckpt-native"), fit=int(11.7 * GiB), jobs=2)
    default = default_of(result)
    assert default.fits and result.recommended.fit_peak_reserved <= default.fit_peak_reserved


def outcome(name: str, reserved_gib: float, driver_s: float, **knobs) -> tune.Outcome:
    return tune.Outcome(policy=name, spec=name, base=name.split("(")[0], knobs=knobs, failed=False,
                        peak_reserved=int(reserved_gib * GiB), peak_allocated=GiB, driver_seconds=driver_s,
                        step_time_lost=0.0, stitches=0, driver_calls=0, smallest_cap=int(reserved_gib * GiB))


def test_the_margin_is_one_percent_of_the_time_the_trace_spans():
    default = outcome("gmlake", 10.0, 2.0)
    hungry = outcome("caching", 14.0, 0.5)           # saves 1.5 s of driver time for 4 GiB more
    assert not tune.worth_its_memory(hungry, default, None)
    assert tune.worth_its_memory(hungry, default, 150.0)      # 1.5 s of a 150 s trace: 1 % of each step
    assert not tune.worth_its_memory(hungry, default, 151.0)
    lean = outcome("gmlake(min_saved_chunks=1)", 9.5, 3.0, min_saved_chunks=1)
    assert tune.worth_its_memory(lean, default, None)         # less memory needs no margin
    best, reason = tune.recommend([default, hungry], None, within=1.05, trace_seconds=100.0)
    assert best is hungry and "1% of the 100.0 s the trace spans" in reason
    best, reason = tune.recommend([default, hungry], None, within=1.05, trace_seconds=1000.0)
    assert best is default


def test_a_snapshot_records_the_time_it_spans(tmp_path):
    from gmlake.sim.trace import save_compact

    trace = load(Path(__file__).resolve().parent / "data" / "tiny-gpt2-native.pickle.gz")
    assert trace.meta["seconds"] == pytest.approx(0.763019)
    save_compact(trace, tmp_path / "t.gmtrace")
    assert load(tmp_path / "t.gmtrace").meta["seconds"] == trace.meta["seconds"]
