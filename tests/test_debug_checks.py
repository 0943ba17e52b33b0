"""Invariant checks inside the allocator (issue 12): on in a GMLAKE_DEBUG build, switchable for tests."""
from __future__ import annotations

import pytest

import gmlake
from gmlake import Allocator, SimDriver
from gmlake.sim.replay import run_requests
from gmlake.sim.trace import load

MiB = 1 << 20
TINY = str(__import__("pathlib").Path(__file__).parent / "data" / "tiny-gpt2-native.pickle.gz")


@pytest.mark.parametrize("policy", gmlake.policies.names())
def test_every_operation_of_a_real_trace_ends_with_a_full_check(policy):
    trace = load(TINY)
    alloc, out = run_requests(trace, policy, upto=4000)
    assert alloc.debug_checks_run == 0, "off unless asked for (or built with GMLAKE_DEBUG)"
    checked = Allocator(SimDriver(capacity=80 << 30), gmlake.policies.get(policy))
    checked.debug_checks = True
    requests = trace.requests()[:4000]
    live = {}
    for action, stream, size, ident in zip(requests["action"], requests["stream"], requests["size"], requests["id"]):
        if action == 0:
            live[int(ident)] = checked.malloc(int(size), int(stream))
        elif action == 1 and int(ident) in live:
            checked.free(live.pop(int(ident)))
    operations = int((requests["action"] == 0).sum()) + int((requests["action"] == 1).sum())
    assert checked.debug_checks_run == operations
    assert checked.stats()["peak_reserved_bytes"] == out["peak_reserved"], "checking must not change a decision"


def test_the_checks_can_be_switched_off_again():
    alloc = Allocator(SimDriver())
    alloc.debug_checks = True
    alloc.free(alloc.malloc(3 * MiB))
    alloc.debug_checks = False
    alloc.free(alloc.malloc(3 * MiB))
    assert alloc.debug_checks_run == 2 and not alloc.debug_checks


def test_a_gmlake_debug_build_checks_every_operation_on_every_path(tmp_path):
    """Build the core with GMLAKE_DEBUG=1 (from the C++ the install generated) beside a copy of the package, and run
    the Python API and a replay under it: every allocator starts checking, with no flag set."""
    import shutil
    import subprocess
    import sys
    import sysconfig
    from pathlib import Path

    package = Path(gmlake.__file__).parent
    source = package / "core" / "_allocator.cpp"
    compiler = shutil.which("c++") or shutil.which("g++")
    if not source.is_file() or compiler is None:
        pytest.skip("needs the generated _allocator.cpp and a C++ compiler")
    copy = tmp_path / "gmlake"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("*.cpp", "__pycache__"))
    target = copy / "core" / ("_allocator" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-std=c++17", "-w", "-DGMLAKE_DEBUG=1",
                    f"-I{package / 'core'}", f"-I{package}",
                    f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(target)], check=True)
    script = f"""
import gmlake
from gmlake.sim.replay import run_requests
from gmlake.sim.trace import load
assert gmlake.__file__.startswith({str(tmp_path)!r}), gmlake.__file__
alloc = gmlake.Allocator(gmlake.SimDriver(), gmlake.policies.get("gmlake-paper"))
assert alloc.debug_checks, "a debug build checks from the start"
ptrs = [alloc.malloc(n << 20) for n in (4, 4, 4, 1, 3)]
for p in ptrs[:3]:
    alloc.free(p)
alloc.free(alloc.malloc(12 << 20))          # stitched
alloc.empty_cache()
replayed, out = run_requests(load({TINY!r}), "gmlake", upto=3000)
print(alloc.debug_checks_run, replayed.debug_checks_run, out["requests"])
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, check=False, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    direct, replayed, requests = map(int, proc.stdout.split())
    assert direct == 5 + 3 + 2 + 1                  # mallocs, frees, the stitched malloc and free, empty_cache
    assert replayed == requests
