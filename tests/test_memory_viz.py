"""A gmlake snapshot in PyTorch's memory visualizer: every allocation, stitched ones included, at its true size.

The data checks need only torch (its _memory_viz writes the HTML; it needs no CUDA). The browser checks render the
HTML in headless Chromium and skip where no Chromium, no MemoryViz.js ($GMLAKE_MEMORY_VIZ_JS) or no d3 is present;
see tests/memory_viz_render.py.
"""
from __future__ import annotations

import base64
import json
import pickle
import re

import pytest

pytest.importorskip("torch")
from memory_viz_render import (
    STATE_HISTORY,
    TIMELINE,
    chromium,
    offline_html,
    render,
    torch_html,
    training_like_snapshot,
    viewer_sources,
)


@pytest.fixture(scope="module")
def taken():
    snapshot, alloc = training_like_snapshot()
    assert alloc.stats()["stitches"] > 0, "the workload must stitch, or it tests nothing"
    return snapshot, alloc


def _embedded_snapshot(html: str) -> dict:
    """The snapshot torch's HTML carries (base64 of a pickle, as MemoryViz.js decodes it)."""
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def _stitched_addresses(snapshot: dict) -> set[int]:
    return {b["address"] for s in snapshot["segments"] if s.get("gmlake_stitched") for b in s["blocks"]
            if b["state"] == "active_allocated"}


def test_html_carries_every_allocation_at_its_requested_size(taken):
    snapshot, alloc = taken
    shown = _embedded_snapshot(torch_html(snapshot, TIMELINE))
    events = shown["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    assert len(allocs) == alloc.stats()["allocs"]
    live: dict[int, int] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            live.pop(e["addr"])
    assert sum(live.values()) == alloc.stats()["requested_bytes"]
    stitched = _stitched_addresses(shown)
    assert stitched and stitched <= set(live)
    for seg in shown["segments"]:
        for b in seg["blocks"]:
            if b["address"] in stitched:
                assert b["size"] == b["requested_size"] == live[b["address"]]


def test_requested_bytes_are_counted_once_across_segments(taken):
    snapshot, alloc = taken
    blocks = [b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sum(b["requested_size"] for b in blocks) == alloc.stats()["requested_bytes"]
    physical = sum(s["total_size"] for s in snapshot["segments"] if not s.get("gmlake_stitched"))
    assert physical == alloc.stats()["reserved_bytes"]


needs_browser = pytest.mark.skipif(chromium() is None or viewer_sources() is None,
                                   reason="needs Chromium, MemoryViz.js ($GMLAKE_MEMORY_VIZ_JS) and d3 (node-d3)")


@needs_browser
def test_timeline_renders_one_shape_per_allocation(taken):
    snapshot, _ = taken
    dom, log = render(offline_html(torch_html(snapshot, TIMELINE), *viewer_sources()))
    assert "Uncaught" not in log, log[-2000:]
    elements = sum(e["action"] == "alloc" for e in snapshot["device_traces"][0])
    elements += sum(b["state"] == "active_allocated" and b.get("gmlake_stitched_piece", False)
                    for s in snapshot["segments"] for b in s["blocks"])   # live pieces: drawn with no height
    # one polygon per allocation, one for the small ones summarized, one for the mini map
    assert dom.count("<polygon") == elements + 2


@needs_browser
def test_state_history_places_stitched_allocations_in_their_segments(taken):
    snapshot, alloc = taken
    dom, log = render(offline_html(torch_html(snapshot, STATE_HISTORY), *viewer_sources()))
    assert "Uncaught" not in log, log[-2000:]
    segments = len(snapshot["segments"])
    live_blocks = sum(b["state"] == "active_allocated" for s in snapshot["segments"] for b in s["blocks"])
    # a rect per segment, and per live block one for the allocation and one for its rounding
    assert dom.count("<rect") == segments + 2 * live_blocks
    # the viewer's own sum of live requests, at the last event: stitched allocations count at their true sizes
    assert f"({alloc.stats()['requested_bytes']} bytes) allocated" in dom
