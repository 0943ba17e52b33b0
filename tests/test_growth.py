"""Growth as one interface (gmlake.core._allocator.Growth), chosen once when the allocator is made: the built-in
strategies the policies name, and a research policy's own growth in Cython."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

import gmlake
from gmlake import Allocator, SimDriver
from gmlake.core._allocator import ChunkGrowth, ExpandableGrowth, Growth, PyTorchGrowth
from gmlake.policies import PaperPolicy, get
from gmlake.policies.examples import StitchOnlyFreeMemory

MiB = 1 << 20
TINY = Path(__file__).parent / "data" / "tiny-gpt2-native.pickle.gz"


@pytest.mark.parametrize(("spec", "kind"), [("gmlake", ExpandableGrowth), ("gmlake-paper", ChunkGrowth),
                                            ("caching", PyTorchGrowth), ("expandable", ExpandableGrowth)])
def test_each_policy_grows_by_the_strategy_its_segment_rule_names(spec, kind):
    growth = Allocator(SimDriver(), get(spec)).growth
    assert type(growth) is kind
    assert growth.fit_counts_unmapped == (kind is ExpandableGrowth)
    assert growth.stitches == (kind is not PyTorchGrowth)


@dataclass(frozen=True)
class NoShortfallInPython(PaperPolicy):
    """StitchOnlyFreeMemory's rule as a Python veto: a stitch that needs new memory is not allowed."""

    name: ClassVar[str] = "no-shortfall-python"

    def allow_stitch(self, size: int, stream: int, pieces: list[int], new_bytes: int) -> bool:
        return new_bytes == 0


def test_a_research_growth_in_cython_decides_what_a_shortfall_costs():
    """A policy's cython_growth() replaces the built-in growth: the example stitches only where free pieces cover
    the request, making the same choices as that rule written as a Python allow_stitch veto, and fewer stitches
    than the paper's chunks."""
    from gmlake.sim.replay import run_requests
    from gmlake.sim.trace import load

    alloc = Allocator(SimDriver(), StitchOnlyFreeMemory())
    assert type(alloc.growth).__name__ == "StitchOnlyFreeMemory" and isinstance(alloc.growth, ChunkGrowth)
    trace = load(TINY)
    keys = ("peak_reserved_bytes", "stitches", "segments_created", "calls")
    cython, _ = run_requests(trace, StitchOnlyFreeMemory(), samples=1)
    python, _ = run_requests(trace, NoShortfallInPython(), samples=1)
    paper, _ = run_requests(trace, "gmlake-paper", samples=1)
    assert {k: cython.stats()[k] for k in keys} == {k: python.stats()[k] for k in keys}
    assert cython.stats()["stitches"] < paper.stats()["stitches"]


def test_a_stitch_with_no_shortfall_goes_ahead_under_the_research_growth():
    alloc = Allocator(SimDriver(), StitchOnlyFreeMemory())
    parts = [alloc.malloc(32 * MiB) for _ in range(4)]
    keep = alloc.malloc(2 * MiB)                       # keeps the four apart from the segments' free tails
    for p in parts:
        alloc.free(p)
    big = alloc.malloc(96 * MiB)                       # covered by free pieces: stitched, no new memory
    assert alloc.stats()["stitches"] == 1
    alloc.free(big)
    alloc.free(keep)
    alloc.close()


def test_a_growth_that_is_not_one_is_refused():
    @dataclass(frozen=True)
    class Wrong(PaperPolicy):
        def cython_growth(self) -> object:
            return object()

    with pytest.raises(TypeError, match="cython_growth"):
        Allocator(SimDriver(), Wrong())


def test_the_base_growth_grows_nothing():
    """Growth itself lays out nothing: a policy that returns the bare base runs out of memory at its first miss,
    cleanly."""
    @dataclass(frozen=True)
    class Bare(PaperPolicy):
        def cython_growth(self) -> object:
            return Growth()

    alloc = Allocator(SimDriver(), Bare())
    with pytest.raises(gmlake.OutOfMemoryError):
        alloc.malloc(4 * MiB)
    alloc.close()
