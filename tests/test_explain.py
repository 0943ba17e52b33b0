"""gmlake.sim.explain: accounting for every reserved byte at a policy's peak, and the min_saved_chunks knob it motivated."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gmlake.cli import main as cli_main
from gmlake.policies import get
from gmlake.sim.explain import explain
from gmlake.sim.replay import bundled_traces, replay, run_requests
from gmlake.sim.trace import ALLOC, EVENT_DTYPE, FREE, Trace, load

MiB = 1 << 20
TINY = "tests/data/tiny-gpt2-native.pickle.gz"


def tails_trace(count: int = 4, size: int = 5 * MiB + MiB // 2) -> Trace:
    """`count` live tensors of 2.75 chunks each, then their frees: each new segment of 3 chunks keeps a 0.5 MiB
    tail that the next tensor cannot use without new chunks (as gpt2-xl's 19.53 MiB weights and Adam states)."""
    rows = [(ALLOC, 0, size, i) for i in range(count)] + [(FREE, 0, size, i) for i in range(count)]
    return Trace(np.array(rows, dtype=EVENT_DTYPE), {"name": "tails"})


def test_chunk_tails_are_found_at_the_peak():
    b = explain(tails_trace(), get("gmlake-paper"))
    assert b.reserved == 4 * 6 * MiB
    assert b.requested == 4 * (5 * MiB + MiB // 2)
    assert b.free_in_shared_chunks == 4 * (MiB // 2)       # one tail per tensor, in a chunk it shares
    assert b.free_whole_chunks == 0 and b.free_small == 0
    assert b.fragments["< 2 MiB"] == (4, 4 * (MiB // 2))
    # each tail shares its chunk with the tensor before it, 2.75 chunks long
    assert b.pinning == {"smaller than a chunk": (0, 0), "a chunk or more": (4, 4 * (5 * MiB + MiB // 2))}
    assert b.request_index == 3                            # the last tensor grew reserved to its peak
    assert sum(v for _, v in b.rows()) == b.reserved


def test_live_blocks_beside_shared_free_pieces_are_counted_once_by_size_against_the_chunk():
    from gmlake.sim.explain import _free_bytes

    chunk = 20 * MiB
    large = {"pool": "large", "chunk_size": chunk, "blocks": [
        (0, 4 * MiB, "allocated", 0, 4 * MiB),                 # small, shares chunk 0 with the hole
        (4 * MiB, 6 * MiB, "free", 0, 0),                       # hole inside chunk 0
        (10 * MiB, 35 * MiB, "allocated", 0, 35 * MiB),         # large, chunks 0-2: pins both pieces, counted once
        (45 * MiB, 15 * MiB, "free", 0, 0),                     # the rest of chunk 2, shared with the large one
        (60 * MiB, 20 * MiB, "free", 0, 0),                     # chunk 3, whole
        (80 * MiB, 20 * MiB, "allocated", 0, 20 * MiB),         # chunk 4: no free piece in it
        (100 * MiB, 10 * MiB, "free", 0, 0),                    # chunk 5's head, beside the range's unmapped tail
        (110 * MiB, 4 << 30, "unmapped", 0, 0),                 # no live bytes: pins nothing
    ]}
    small = {"pool": "small", "chunk_size": 2 * MiB, "blocks": [(0, MiB, "free", 0, 0), (MiB, MiB, "allocated", 0, 1)]}
    free_small, whole, shared, _, pinning = _free_bytes([large, small])
    assert free_small == MiB
    assert whole == 20 * MiB and shared == 6 * MiB + 15 * MiB + 10 * MiB
    assert pinning == {"smaller than a chunk": (1, 4 * MiB), "a chunk or more": (1, 35 * MiB)}


def test_explain_shows_the_live_blocks_beside_the_free_pieces(capsys):
    assert cli_main(["explain", TINY, "--policy", "gmlake"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "live blocks in the chunks that hold free pieces:" in line)
    assert "  smaller than a chunk" in lines[header + 1] and "  a chunk or more" in lines[header + 2]
    b = explain(load(TINY), "gmlake")
    for label, line in zip(b.pinning, lines[header + 1:header + 3]):
        count, size = b.pinning[label]
        assert f"{size / 2**30:.3f} in {count} block" in line, line


def test_explain_says_why_in_words_first():
    """What was asked, what was free (pieces, the largest) just before, what the policy grew, and what stitching
    and expandable segments grew for the same request: each checked against a replay of its own."""
    trace = load(bundled_traces()[1])                  # gpt2l-lora-ckpt-native
    b = explain(trace, "caching")
    stream = int(trace.requests()[b.request_index]["stream"])
    before, _ = run_requests(trace, "caching", upto=b.request_index, samples=1)
    free = [size for seg in before.segments_info() if seg["pool"] == "large"
            for _, size, state, owner, _ in seg["blocks"] if state == "free" and owner in (stream, -1)]
    assert (b.free_before, b.free_pieces_before, b.largest_free_before) == (sum(free), len(free), max(free))
    for name in ("gmlake-paper", "expandable"):
        _, out = run_requests(trace, name, upto=b.request_index + 1, samples=b.request_index + 1)
        reserved = out["timeline"]["reserved"]
        assert b.elsewhere[name][1] == reserved[b.request_index] - reserved[b.request_index - 1]
    words = b.words
    assert words.startswith(f"2.9 GiB asked (request #{b.request_index}); 6.3 GiB free in {len(free)} pieces, "
                            f"the largest 1.7 GiB (too small); caching grew reserved by 2.9 GiB")
    assert "stitching (gmlake-paper) would have grown 1.4 GiB (714 new pages of 2 MiB" in words
    assert "expandable segments (expandable) would have grown 2.9 GiB" in words
    assert "stitching" not in explain(trace, "gmlake-paper").words.split("; gmlake-paper grew")[1]


def test_cli_explain_prints_the_words_before_the_table(capsys):
    assert cli_main(["explain", TINY, "--policy", "gmlake", "--policy", "caching"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gmlake: ") and " asked (request #" in out.splitlines()[0]
    assert out.index("caching: ") < out.index("reserved memory at each policy's peak growth")


def test_min_saved_chunks_0_packs_new_chunks_after_tails():
    # Tails 0.5, 1.0, 1.5 MiB are each stitched in front of the next tensor's new chunks; the 4th needs 2 chunks.
    tight = explain(tails_trace(), get("gmlake-paper", min_saved_chunks=0))
    assert tight.reserved == (6 + 6 + 6 + 4) * MiB
    assert tight.reserved == tight.requested               # no byte lost
    result = replay(tails_trace(), get("gmlake-paper", min_saved_chunks=0))
    assert result.stats["stitches"] == 3
    assert replay(tails_trace(), get("gmlake-paper")).stats["stitches"] == 0


def test_min_saved_chunks_2_stitches_less_than_1():
    trace = load(TINY)
    one, two = (replay(trace, get("gmlake-paper", min_saved_chunks=n)).stats["stitches"] for n in (1, 2))
    assert two <= one


@pytest.mark.parametrize("policy", ["gmlake", "caching", "expandable"])
def test_rows_sum_to_reserved_on_a_real_trace(policy):
    trace = load(str(bundled_traces()[0]))
    b = explain(trace, policy)
    assert sum(v for _, v in b.rows()) == b.reserved
    assert b.peak_reserved == replay(trace, policy).peak_reserved
    assert b.peak_reserved * 0.99 <= b.reserved <= b.peak_reserved
    assert b.requested <= b.reserved and b.rounding >= 0


def test_peak_event_is_the_request_that_grew_reserved_to_the_peak():
    trace = load(TINY)
    full = replay(trace, "gmlake-paper")
    before, _ = run_requests(trace, "gmlake-paper", upto=full.peak_event)
    at, _ = run_requests(trace, "gmlake-paper", upto=full.peak_event + 1)
    assert before.stats()["reserved_bytes"] < full.peak_reserved == at.stats()["reserved_bytes"]


def test_negative_min_saved_chunks_is_refused():
    with pytest.raises(ValueError, match="min_saved_chunks"):
        replay(tails_trace(), get("gmlake-paper", min_saved_chunks=-1))


def test_cli_explain_table_json_and_knobs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")        # the labels whole; the widths are tests/test_table_widths.py's
    assert cli_main(["explain", TINY]) == 0
    out = capsys.readouterr().out
    assert "free in chunks shared with live blocks" in out and "expandable" in out
    assert cli_main(["explain", TINY, "--policy", "gmlake", "--set", "min_saved_chunks=0", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 1 and rows[0]["policy"] == "gmlake(min_saved_chunks=0)" and rows[0]["reserved"] > 0


@pytest.mark.parametrize("args, message", [
    (["--set", "no_such_knob=1"], "no_such_knob"),
    (["--set", "chunk_size=big"], "chunk_size"),
    (["--set", "chunk_size"], "knob=value"),
])
def test_cli_bad_knobs_get_a_clear_error(capsys, args, message):
    assert cli_main(["explain", TINY, "--policy", "gmlake", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
