"""Note [Stitching a size again]: restitch_limit spares a request of at least `restitch_share` percent of reserved.
Held on the GNN-like program's GPU snapshot (sage, the speed suite's settings), where the limit grew a 2.3 GiB
request that free pieces could serve."""
import json
from pathlib import Path

import pytest

from gmlake.sim.replay import replay
from gmlake.sim.trace import load

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "bench" / "results" / "h100-2026-12-07" / "fidelity-sage.json"
SNAPSHOT = RECORD.with_name("fidelity-sage-gmlake.pickle.gz")


@pytest.fixture(scope="module")
def sage():
    return load(str(SNAPSHOT))


def test_without_the_share_replay_gives_the_gpu_run_it_was_captured_under(sage):
    gpu = json.loads(RECORD.read_text())["gpu"]
    assert replay(sage, "gmlake[restitch_share=0]").peak_reserved == gpu["gmlake"]["max_memory_reserved"]
    assert replay(sage, "expandable").peak_reserved == gpu["expandable"]["max_memory_reserved"]


def test_the_default_stitches_a_request_of_a_fifth_of_memory_again_instead_of_growing_it(sage):
    default, expandable = replay(sage, "gmlake"), replay(sage, "expandable")
    limited = replay(sage, "gmlake[restitch_share=0]")
    assert default.peak_reserved < expandable.peak_reserved < limited.peak_reserved
    assert default.stats["stitches"] > limited.stats["stitches"]
