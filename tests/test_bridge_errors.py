"""The torch bridge's errors travel with the call that raised them: two threads whose allocators cannot be created,
for different reasons, each receive their own message (Note [A call's failure], through the bridge). The C++
harness (tests/torch_pool_harness.cpp) calls gmlake_alloc as PyTorch does and catches what it throws; no torch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

# Two threads allocate on devices 3 and 5, whose allocators fail to be created with messages naming the device; run
# on one CPU, where a thread that lets the GIL go is often preempted by the thread it wakes, so a message kept in a
# shared buffer between the GIL's release and its reading would be the other thread's.
SCENARIO = r"""
import ctypes, json, os, sys, threading
from gmlake.torch import _torch_bridge

os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
sys.setswitchinterval(1e-6)

def factory(device):
    raise RuntimeError(f"the driver of device {device} is not there" + "." * (device * 40))

_torch_bridge.configure(factory)
bridge = ctypes.CDLL(_torch_bridge.__file__)
alloc = ctypes.cast(bridge.gmlake_alloc, ctypes.c_void_p).value
h = ctypes.CDLL(sys.argv[1])
h.harness_alloc.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64]
h.harness_alloc.restype = ctypes.c_uint64
h.harness_error.restype = ctypes.c_char_p
ROUNDS = int(sys.argv[2])
wrong = {3: 0, 5: 0}
seen = {3: set(), 5: set()}

def run(device):
    for _ in range(ROUNDS):
        assert h.harness_alloc(alloc, 4096, device, 0) == 0
        message = h.harness_error().decode()
        seen[device].add(message[:80])
        if f"device {device} " not in message:
            wrong[device] += 1

threads = [threading.Thread(target=run, args=(d,)) for d in (3, 5)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"wrong": wrong, "seen": {d: sorted(s) for d, s in seen.items()}}))
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> str:
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the stand-in for PyTorch's allocator calls")
    library = tmp_path_factory.mktemp("harness") / "torch_pool_harness.so"
    subprocess.run([compiler, "-std=c++17", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(library),
                    str(HERE / "torch_pool_harness.cpp")], check=True)
    return str(library)


def test_two_threads_whose_allocators_fail_differently_each_get_their_own_message(harness):
    proc = subprocess.run([sys.executable, "-c", SCENARIO, harness, "3000"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["wrong"] == {"3": 0, "5": 0}, got
    for device in ("3", "5"):
        assert got["seen"][device] == [f"gmlake: cannot create the allocator for device {device}: the driver of "
                                       f"device {device} is not there"[:80]], got


OOM = r"""
import ctypes, sys
from gmlake import Allocator, SimDriver
from gmlake.torch import _torch_bridge

_torch_bridge.configure(lambda device: Allocator(SimDriver(capacity=64 << 20)))
bridge = ctypes.CDLL(_torch_bridge.__file__)
h = ctypes.CDLL(sys.argv[1])
h.harness_alloc.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64]
h.harness_alloc.restype = ctypes.c_uint64
h.harness_error.restype = ctypes.c_char_p
assert h.harness_alloc(ctypes.cast(bridge.gmlake_alloc, ctypes.c_void_p).value, 1 << 30, 0, 0) == 0
print(h.harness_error().decode())
"""


def test_out_of_memory_through_the_bridge_says_what_gmlake_errors_say(harness):
    """The text torch raises is gmlake.core.errors' (OutOfMemoryError.torch_message): PyTorch's opening words, then
    gmlake's report (tests/test_torch_oom.py checks its type)."""
    proc = subprocess.run([sys.executable, "-c", OOM, harness], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == (
        "CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which 64.00 "
        "MiB is free. gmlake: 1073741824 bytes asked; 0.00 MiB reserved, 0.00 MiB allocated, 0.00 MiB cached and "
        "free; 0 stitches made so far; limit in force: no cap, the device's own 64.00 MiB. The allocator is still "
        "usable: free tensors or use a smaller batch and retry.")
