"""A research policy that answers every seam as the built-in would and counts the calls: loaded by file path
through `gmlake run --policy tests/gpu_scripts/counting_policy.py:CountingSeams` (tests/gpu_scripts/policy_seams.py)."""
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from gmlake.policies import PaperPolicy

CALLS: Counter = Counter()      # per seam; the policy is a frozen dataclass, so the count lives beside it


@dataclass(frozen=True)
class CountingSeams(PaperPolicy):
    name: ClassVar[str] = "counting-seams"
    calls: ClassVar[Counter] = CALLS

    def choose_block(self, size, stream, pool, candidates, default, state):
        CALLS["choose_block"] += 1
        return default

    def should_split(self, block_size, size, pool, default):
        CALLS["should_split"] += 1
        return default

    def choose_stitch(self, size, stream, blocks, default, state):
        CALLS["choose_stitch"] += 1
        return default

    def segment_layout(self, size, stream, pool, default, state):
        CALLS["segment_layout"] += 1
        return default
