"""gmlake as PyTorch's CUDA allocator (skipped where no CUDA device exists).

Each scenario runs in its own process: the allocator must be installed before CUDA is initialised.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SCRIPTS = Path(__file__).parent / "gpu_scripts"


def run(script: str, *args: str, gmlake: bool = True, env: dict | None = None, timeout: int = 300) -> str:
    cmd = [sys.executable, "-m", "gmlake", "run", str(SCRIPTS / script), *args] if gmlake else \
        [sys.executable, str(SCRIPTS / script), *args]
    proc = subprocess.run(cmd, capture_output=True, check=False, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_training_gives_the_same_losses_as_the_native_allocator():
    native = json.loads(run("train_losses.py", gmlake=False).strip().splitlines()[-1])
    ours = json.loads(run("train_losses.py").strip().splitlines()[-1])
    assert ours == native


@pytest.mark.parametrize("policy", ["gmlake", "gmlake-paper"])
def test_thousands_of_random_tensors_filled_and_checked(policy):
    assert "ok" in run("random_tensors.py", env={"GMLAKE_POLICY": policy})


def test_record_stream_keeps_cross_stream_use_safe():
    assert "ok" in run("record_stream.py")


@pytest.mark.parametrize("wait", [True, False])
def test_cross_stream_wait_orders_the_side_streams_late_write_first(wait):
    """Note [Waiting for another stream's free block] on the real driver (cuStreamWaitEvent): with the default
    policy the default stream waits and takes blocks whose old stream still writes them, and every byte checks;
    without the wait it never does (it grows)."""
    env = {} if wait else {"GMLAKE_POLICY": "gmlake[cross_stream_wait=false]"}
    assert "ok" in run("cross_stream_wait.py", "wait" if wait else "no-wait", env=env)


def test_rebacking_at_the_cap_keeps_every_live_tensor():
    """Note [Taking slots back at the edge] on the real driver: live bytes copied through the host and mapped back
    at the same addresses in 2 MiB handles, kernels running on them after."""
    assert "ok" in run("reback.py", env={"GMLAKE_KNOBS": "reback_slot=2MiB"})     # off by default


def test_empty_cache_returns_memory_to_the_driver():
    run("empty_cache.py")


def test_memory_fraction_cap_gives_clear_oom_and_recovers():
    assert "recovered at batch" in run("oom_recover.py")


def test_torch_compile_trains():
    assert "ok" in run("compile_train.py")


def test_cuda_graphs_capture_replay_share_release_and_fail_clearly():
    """torch.cuda.graph, shared pools, release, make_graphed_callables, side streams, a capture out of memory, an
    unannounced capture, MemPool: tests/gpu_scripts/graph_capture.py, one scenario per "ok:" line."""
    out = run("graph_capture.py")
    assert "all ok" in out, out


def test_make_graphed_callables_trains_with_native_losses():
    native = json.loads(run("graphed_train.py", gmlake=False).strip().splitlines()[-1])
    ours = json.loads(run("graphed_train.py").strip().splitlines()[-1])
    assert ours == pytest.approx(native, rel=1e-6) and ours[-1] < ours[0]


def test_reduce_overhead_trains_with_native_losses_and_replays_graphs():
    native = json.loads(run("reduce_overhead.py", gmlake=False, timeout=600).strip().splitlines()[-1])
    ours = json.loads(run("reduce_overhead.py", timeout=600).strip().splitlines()[-1])
    assert ours["graph_replays"] >= 40 and native["graph_replays"] >= 40, (ours["graph_replays"], native["graph_replays"])
    assert ours["losses"] == pytest.approx(native["losses"], rel=1e-5, abs=1e-6)


def test_stats_api_and_snapshot_replays_to_the_real_peak(tmp_path):
    out = run("stats_snapshot.py", str(tmp_path / "snap.pickle.gz"))
    assert "ok" in out


def test_environment_variables_configure_the_policy():
    out = run("stats_snapshot.py", "/tmp/gmlake-env-snap.pickle.gz",
              env={"GMLAKE_POLICY": "expandable", "GMLAKE_KNOBS": f"expandable_page_large={4 << 20}"})
    assert "policy expandable" in out


def test_enable_after_cuda_init_is_a_clear_error():
    code = "import torch; torch.zeros(1, device='cuda'); import gmlake.torch as g; g.enable()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False, text=True, timeout=120)
    assert proc.returncode != 0 and "CUDA is already initialised" in proc.stderr


def test_two_gpus_under_torchrun_with_ddp():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "gmlake", "run",
         str(SCRIPTS / "ddp_train.py")],
        capture_output=True, check=False, text=True, timeout=300,
        env={**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok, device ") == 2


def test_soak_500_steps_reserved_stays_flat():
    out = run("soak.py", "500", timeout=900)
    assert out.strip().endswith("ok")
    print(out)


def test_threads_and_autograd_allocate_at_once():
    assert "ok:" in run("threads.py")


def test_a_custom_policy_from_a_file_has_its_seams_called_on_the_torch_path():
    """Issue 13: `gmlake run --policy FILE.py:Class`, the seams asked through the torch bridge."""
    out = run("policy_seams.py", env={"GMLAKE_POLICY": f"{SCRIPTS / 'counting_policy.py'}:CountingSeams"})
    assert "ok seams called on the GPU" in out


def test_a_raising_policy_hook_fails_the_torch_allocation_with_its_message():
    assert "ok policy error reached torch" in run("policy_error.py", gmlake=False)


@pytest.mark.parametrize("limit", [None, "3GiB"])
def test_cudnn_benchmark_trains_as_under_pytorchs_allocator(limit, tmp_path):
    """torch.backends.cudnn.benchmark = True under gmlake (Note [cacheInfo through a subclass]): the shim is built
    (into a fresh cache) and installed, cuDNN's benchmark asks cacheInfo and the bridge answers, no out-of-memory
    is counted, and a conv net and timm's resnet18 train to PyTorch's losses (cuDNN may time its way to other
    algorithms than in the native run: equal within fp32 rounding). Under a cap the answer stays under it."""
    env = {"GMLAKE_CACHE_DIR": str(tmp_path), **({"GMLAKE_LIMIT": limit} if limit else {})}
    native = json.loads(run("cudnn_benchmark.py", gmlake=False).strip().splitlines()[-1])
    ours = json.loads(run("cudnn_benchmark.py", env=env).strip().splitlines()[-1])
    print(json.dumps(ours))
    assert ours["allocator"] == "gmlake" and ours["cache_info_installed"], ours
    assert ours["cache_info_calls"] > 0, ours
    assert ours["num_ooms"] == 0, ours
    assert ours["losses"].keys() == native["losses"].keys()
    for name, losses in native["losses"].items():
        assert ours["losses"][name] == pytest.approx(losses, rel=5e-3, abs=1e-4), name
    if limit:
        assert ours["cache_info_mib"] <= ours["limit_mib"], ours
    else:
        # the device's free memory less the device reserve, in whole pages, or a larger free block
        assert ours["device_free_mib"] - 40 <= ours["cache_info_mib"] <= ours["device_free_mib"] + \
            ours["reserved_mib"], ours


def test_without_the_shim_cudnn_benchmark_fails_as_before_with_one_warning(tmp_path):
    """Where the shim cannot be built (here: no C++ compiler), enable() warns once why and installs torch's plain
    pluggable allocator: everything but cudnn.benchmark works, which fails as it did."""
    env = {k: v for k, v in os.environ.items() if k not in ("GMLAKE", "PYTORCH_CUDA_ALLOC_CONF")}
    env.update(PYTHONUNBUFFERED="1", GMLAKE_CACHE_DIR=str(tmp_path), CXX=str(tmp_path / "no-c++"))
    proc = subprocess.run([sys.executable, "-m", "gmlake", "run", str(SCRIPTS / "cudnn_benchmark.py"), "2"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode != 0, proc.stdout
    assert proc.stderr.count("gmlake: torch.backends.cudnn.benchmark = True will fail in the first convolution") == 1, \
        proc.stderr[-3000:]
    assert "no C++ compiler" in proc.stderr and "does not yet support cacheInfo" in proc.stderr, proc.stderr[-3000:]
