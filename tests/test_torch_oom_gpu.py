"""Out-of-memory under gmlake behaves as under PyTorch's allocator for the tools that rely on it (skipped where no
CUDA device exists): its type, its count, the out-of-memory observer and the snapshot it dumps, a loop that skips
the batch, and the batch-size finders of accelerate, the HF Trainer and Lightning. Each script runs under PyTorch's
allocator (and, for the finders, with expandable segments) and under `gmlake run`, in its own process; the outcomes
must agree. Note [Torch's out-of-memory type] in gmlake/torch/_torch_oom.py.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SCRIPTS = Path(__file__).parent / "gpu_scripts"
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@pytest.fixture(autouse=True)
def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def run(script: str, *args: str, allocator: str, timeout: int = 600) -> dict:
    """The script's last line (JSON), run under `allocator`: native, expandable or gmlake."""
    cmd = [sys.executable, *(["-m", "gmlake", "run"] if allocator == "gmlake" else []), str(SCRIPTS / script), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("GMLAKE", "PYTORCH_CUDA_ALLOC_CONF")}
    env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               **(EXPANDABLE if allocator == "expandable" else {}))
    proc = subprocess.run(cmd, capture_output=True, check=False, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{script} ({allocator}) failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(allocator, json.dumps(got))          # the figures for the closing note (pytest -s)
    assert got["allocator"] == allocator, got
    return got


def test_oom_type_text_and_count_as_under_pytorch():
    native, ours = (run("oom_type.py", allocator=a) for a in ("native", "gmlake"))
    for case in ("plain", "autograd", "device"):
        assert ours[case]["oom"] and ours[case]["torch_oom"] and ours[case]["words"] and ours[case]["accelerate"], \
            (case, ours[case])
        drop = ("head",)
        assert {k: v for k, v in ours[case].items() if k not in drop} == \
            {k: v for k, v in native[case].items() if k not in drop}, (case, native[case], ours[case])
    assert ours["num_ooms"] == native["num_ooms"] == 3, (native["num_ooms"], ours["num_ooms"])
    assert ours["usable_after"] and native["usable_after"]


def test_oom_loop_skips_the_batch_and_goes_on():
    native, ours = (run("oom_skip_batch.py", allocator=a) for a in ("native", "gmlake"))
    assert ours["trained"] == native["trained"] == [0, 1, 3, 5], (native, ours)
    assert ours["skipped"] == native["skipped"] == [2, 4], (native, ours)
    assert ours["num_ooms"] == native["num_ooms"] == 2, (native, ours)


def test_oom_observer_dumps_a_snapshot_memory_viz_renders(tmp_path):
    got = {a: run("oom_snapshot.py", str(tmp_path / f"{a}.pickle"), allocator=a) for a in ("native", "gmlake")}
    for a, out in got.items():
        assert out["raised"] and out["observer_calls"] == 1 and out["free_is_number"], (a, out)
        assert out["segments"] >= 1 and out["oom_entries"] == 1 and out["oom_sizes"] == [1 << 30], (a, out)
        assert out["trace_plot"] > 1000 and out["segment_plot"] > 1000 and out["text_trace_has_oom"], (a, out)
    # (device, bytes asked, the cap in force): the same call under both allocators
    assert got["gmlake"]["observer_args"] == got["native"]["observer_args"], got


def test_a_process_recording_history_exits_cleanly_every_time(tmp_path):
    """Note [The sampler stops before the interpreter does] in gmlake/torch/outside.py: recording history starts the
    libraries' sampler, a daemon thread; caught inside mem_get_info at the interpreter's end it aborted the process
    after its work was done, in about one run of four. Ten runs in a row must all exit with status 0."""
    for i in range(10):
        out = run("oom_snapshot.py", str(tmp_path / f"{i}.pickle"), allocator="gmlake")
        assert out["raised"] and out["oom_entries"] == 1, (i, out)


def _halvings(a: int, b: int) -> float:
    return abs(math.log2(a) - math.log2(b))


@pytest.mark.parametrize("finder", ["accelerate", "trainer", "lightning"])
def test_oom_batch_size_finder_finds_what_it_finds_under_pytorch(finder, tmp_path):
    """The same batch size as under expandable segments (one halving apart at most), and PyTorch's default
    allocator for reference; under gmlake the finder met at least one out-of-memory and recovered from it."""
    found = {a: run("oom_batch_finders.py", finder, str(tmp_path / a), allocator=a)
             for a in ("expandable", "native", "gmlake")}
    sizes = {a: out["batch_size"] for a, out in found.items()}
    assert all(isinstance(s, int) and s >= 1 for s in sizes.values()), found
    assert found["gmlake"]["num_ooms"] >= 1 and found["expandable"]["num_ooms"] >= 1, found
    assert _halvings(sizes["gmlake"], sizes["expandable"]) <= 1, sizes
    if finder != "lightning":       # found by halving from 1024: a power of two below it
        assert sizes["gmlake"] < 1024 and sizes["gmlake"] & (sizes["gmlake"] - 1) == 0, sizes


def test_a_refused_cudnn_workspace_is_skipped_as_under_pytorch():
    """cuDNN asks the allocator for each execution plan's workspace; PyTorch moves to the next plan when the request
    raises its out-of-memory type (under gmlake's old RuntimeError the first refusal ended the convolution). Under a
    cap that refuses the first plan's workspace, gmlake must take the same path as PyTorch's allocator: the same
    refusals skipped, and the same outcome (the convolution runs and matches, or fails with the same type)."""
    native, ours = (run("oom_workspace.py", allocator=a) for a in ("native", "gmlake"))
    assert native["workspace_mib"] > 0 and native["refused_workspaces"] >= 1, native    # the path was taken
    assert ours["refused_workspaces"] == native["refused_workspaces"], (native, ours)
    assert ours["ran"] == native["ran"] and ours["match"] == native["match"], (native, ours)
    if not ours["ran"]:
        assert ours["error"].split(":")[0] == native["error"].split(":")[0] == "OutOfMemoryError", (native, ours)
