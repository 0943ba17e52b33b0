"""Behaviour identity of the allocator core (tests/identity.py): every replay of the recorded set decides as it did
when tests/data/identity-before.json was written, before the core was restructured: peak reserved and allocated,
stitches, driver calls by kind, out-of-memory counts. The whole set (134 replays) takes seconds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import identity


def test_every_policy_decides_as_before_on_every_recorded_replay():
    before = json.loads(identity.BEFORE.read_text())
    assert len(before["replays"]) >= 134
    found = identity.differences(before, identity.run(before))
    assert not found, "\n".join(found[:40])


def test_the_check_sees_a_changed_decision():
    """The comparison is not vacuous: a policy with one knob changed differs from the record."""
    before = json.loads(identity.BEFORE.read_text())
    key = "tiny-gpt2-native.pickle.gz|gmlake-paper"
    from gmlake.sim.trace import load

    changed = identity._record(load(identity._traces()["tiny-gpt2-native.pickle.gz"]),
                               "gmlake-paper[min_saved_chunks=0]")
    assert identity.differences({"replays": {key: before["replays"][key]}}, {"replays": {key: changed}})
