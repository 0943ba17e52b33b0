"""A cut at reuse while another thread captures CUDA graphs in global mode, on the GPU (Note [A cut under another
thread's capture]; the CPU tests are tests/test_capture_guard.py). Skipped where no CUDA device exists."""
from __future__ import annotations

import json

import pytest
from test_torch_gpu import run

pytestmark = pytest.mark.gpu


def test_cuts_on_one_thread_while_another_captures_graphs_in_global_mode():
    """tests/gpu_scripts/capture_cut.py: both threads finish, every replay checks, the main thread's tensors keep
    their values, cuts were made, no error (about 20 s)."""
    out = run("capture_cut.py", "20", env={"GMLAKE_KNOBS": "tail_page=2MiB,cut_at_reuse=1000"}, timeout=240)
    result = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert result["errors"] == [] and result["tensors_changed"] == 0 and not result["thread_alive"], result
    assert result["graphs"] >= 5 and result["replays_checked"] == 2 * result["graphs"] and result["cuts"] >= 5, result
    assert out.rstrip().endswith("ok")
