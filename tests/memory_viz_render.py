"""Render a gmlake snapshot in PyTorch's memory visualizer (torch.cuda._memory_viz) with headless Chromium.

torch's HTML loads the viewer, MemoryViz.js, from a CDN, and the viewer loads d3 5 from another. To render without a
network, the HTML is rewritten to carry both inline: MemoryViz.js from a PyTorch source checkout
($GMLAKE_MEMORY_VIZ_JS, torch/utils/viz/MemoryViz.js; the wheels do not ship it; scripts/memory-viz-deps.sh puts
Debian's copy in .cache/memory_viz/, the default) and d3 from Debian's node-d3 (/usr/share/nodejs/d3/dist/d3.min.js,
or $GMLAKE_D3_JS). The viewer itself runs unchanged.

    GMLAKE_MEMORY_VIZ_JS=.../MemoryViz.js python tests/memory_viz_render.py docs/memory_viz.png
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import gmlake
from gmlake.torch import snapshot_of

MiB = 1 << 20
TIMELINE = "Active Memory Timeline"
STATE_HISTORY = "Allocator State History"
_D3_DEFAULT = "/usr/share/nodejs/d3/dist/d3.min.js"
_VIZ_DEFAULT = Path(__file__).resolve().parents[1] / ".cache" / "memory_viz" / "MemoryViz.js"  # memory-viz-deps.sh


def training_like_snapshot() -> tuple[dict, gmlake.Allocator]:
    """A snapshot of a sim-driver allocator through six steps of a training-like loop whose activation sizes change
    every step (so free blocks no longer fit and gmlake stitches), ending inside a step, stitched blocks live."""
    alloc = gmlake.Allocator(gmlake.SimDriver(capacity=16 << 30), gmlake.policies.get("gmlake-paper"))   # stitches at once
    alloc.record_history(True)
    weights = [alloc.malloc(s * MiB) for s in (96, 96, 48, 160)]
    for step in range(6):
        seq = (3, 5, 2, 7, 4, 6)[step]
        activations = [alloc.malloc(seq * (8 + 3 * layer) * MiB + 4096 * layer) for layer in range(8)]
        scratch = alloc.malloc((30 + 17 * step) * MiB)
        alloc.free(scratch)
        if step == 5:
            break                       # the snapshot is taken here, with this step's activations live
        for p in reversed(activations):
            alloc.free(p)
    del weights
    return snapshot_of({0: alloc}, "gmlake"), alloc


def viewer_sources() -> tuple[str, str] | None:
    """(MemoryViz.js, d3.min.js) sources, or None where either is missing."""
    viz = os.environ.get("GMLAKE_MEMORY_VIZ_JS") or str(_VIZ_DEFAULT)
    d3 = os.environ.get("GMLAKE_D3_JS", _D3_DEFAULT)
    if not viz or not Path(viz).is_file() or not Path(d3).is_file():
        return None
    return Path(viz).read_text(), Path(d3).read_text()


def chromium() -> str | None:
    """The headless browser's command, where one is installed."""
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def torch_html(snapshot: dict, kind: str) -> str:
    """torch's own HTML for the snapshot: trace_plot for the timeline, segment_plot for the state history."""
    from torch.cuda import _memory_viz

    return _memory_viz.trace_plot(snapshot) if kind == TIMELINE else _memory_viz.segment_plot(snapshot)


def offline_html(html: str, memory_viz_js: str, d3_js: str) -> str:
    """torch's HTML with the viewer and d3 inline instead of imported from CDNs."""
    viewer = re.sub(r"^import .* from \"https://cdn\.skypack\.dev/[^\"]+\";\n", "", memory_viz_js, flags=re.MULTILINE)
    viewer = viewer.replace("'use strict';", "'use strict';\nconst d3 = window.d3;\n"
                            "const {axisLeft, scaleLinear, zoom, zoomIdentity, brushX} = window.d3;", 1)
    page, n = re.subn(r"import \{add_local_files\} from \"[^\"]+MemoryViz\.js\"", lambda _: viewer, html)
    if n != 1:
        raise ValueError("torch's memory_viz HTML no longer imports MemoryViz.js the way this expects")
    return page.replace("<head>", "<head>\n<script>" + d3_js.replace("</script>", "<\\/script>") + "</script>", 1)


def render(html: str, *, screenshot: Path | None = None, size: tuple[int, int] = (1400, 900)) -> tuple[str, str]:
    """Load the page in headless Chromium: (the DOM after the scripts ran, the browser's console log)."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("no Chromium here")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp, "viz.html")
        page.write_text(html)
        common = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp}/profile",
                  "--virtual-time-budget=10000", f"--window-size={size[0]},{size[1]}", "--enable-logging=stderr",
                  "--v=0"]
        dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, check=False, text=True,
                             timeout=120)
        if screenshot is not None:
            subprocess.run([*common, f"--screenshot={Path(screenshot).resolve()}", page.as_uri()],
                           capture_output=True, text=True, timeout=120, check=True)
    return dom.stdout, dom.stderr


def main(out: str) -> int:
    sources = viewer_sources()
    if sources is None:
        print("set GMLAKE_MEMORY_VIZ_JS to PyTorch's torch/utils/viz/MemoryViz.js (and install node-d3)")
        return 2
    snapshot, alloc = training_like_snapshot()
    print(f"stitches {alloc.stats()['stitches']}, events {len(snapshot['device_traces'][0])}")
    out_path = Path(out)
    render(offline_html(torch_html(snapshot, TIMELINE), *sources), screenshot=out_path)
    state = out_path.with_name(out_path.stem + "_segments" + out_path.suffix)
    render(offline_html(torch_html(snapshot, STATE_HISTORY), *sources), screenshot=state)
    print(f"wrote {out_path} and {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs/memory_viz.png"))
