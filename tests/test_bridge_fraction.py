"""set_per_process_memory_fraction through the torch bridge, as PyTorch's allocator takes it: a fraction of 0 is a cap
of 0 bytes under which every allocation fails with out-of-memory (not the core's limit 0, which means no cap), and a
NaN or a fraction outside [0, 1] is refused with one clear message, leaving the cap as it was. Driven through the
bridge's C entry points by the C++ stand-in for PyTorch (tests/torch_pool_harness.cpp); no torch, no GPU."""
from __future__ import annotations

import json
import subprocess
import sys

from test_bridge_errors import harness  # noqa: F401 (the fixture that builds the stand-in)

SCENARIO = r"""
import ctypes, json, sys
from gmlake import Allocator, HostDriver
from gmlake.torch import _torch_bridge

made = {}
def factory(device):
    made[device] = Allocator(HostDriver(capacity=64 << 20))
    return made[device]

_torch_bridge.configure(factory)
bridge = ctypes.CDLL(_torch_bridge.__file__)
h = ctypes.CDLL(sys.argv[1])
h.harness_alloc.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64]
h.harness_alloc.restype = ctypes.c_uint64
h.harness_fraction.argtypes = [ctypes.c_uint64, ctypes.c_double, ctypes.c_int]
h.harness_error.restype = ctypes.c_char_p
alloc = ctypes.cast(bridge.gmlake_alloc, ctypes.c_void_p).value
fraction = ctypes.cast(bridge.gmlake_memory_fraction, ctypes.c_void_p).value
free = bridge.gmlake_free
free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
out = {}

def try_alloc(size):
    p = h.harness_alloc(alloc, size, 0, 0)
    if p:
        free(p, size, 0, None)
        return "ok"
    return h.harness_error().decode()

out["uncapped"] = try_alloc(1 << 20)
out["set_0"] = h.harness_fraction(fraction, 0.0, 0)
out["limit_at_0"] = made[0].limit
out["at_0"] = try_alloc(512)
out["at_0_again"] = try_alloc(1 << 20)
out["set_half"] = h.harness_fraction(fraction, 0.5, 0)
out["limit_at_half"] = made[0].limit
out["at_half"] = try_alloc(16 << 20)
out["over_half"] = try_alloc(40 << 20)
for name, value in (("nan", float("nan")), ("negative", -0.25), ("above_one", 1.5), ("inf", float("inf"))):
    rc = h.harness_fraction(fraction, value, 0)
    out[name] = [rc, h.harness_error().decode() if rc else "", made[0].limit]
out["set_1"] = h.harness_fraction(fraction, 1.0, 0)
out["at_1"] = try_alloc(40 << 20)
print(json.dumps(out))
"""


def test_memory_fraction_through_the_bridge(harness):  # noqa: F811
    proc = subprocess.run([sys.executable, "-c", SCENARIO, harness], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["uncapped"] == "ok"
    # 0: a cap of 0 bytes, every allocation refused with out-of-memory, the message saying so
    assert got["set_0"] == 0 and got["limit_at_0"] == 0
    for key in ("at_0", "at_0_again"):
        assert got[key].startswith("CUDA out of memory. Tried to allocate"), got[key]
        assert "a cap of 0 bytes (set_per_process_memory_fraction(0): no allocation fits)" in got[key], got[key]
    # a fraction in (0, 1]: fraction x the device's memory
    assert got["set_half"] == 0 and got["limit_at_half"] == 32 << 20
    assert got["at_half"] == "ok"
    assert got["over_half"].startswith("CUDA out of memory.") and "the cap of 32.00 MiB" in got["over_half"]
    # NaN and out of range: refused, one line naming the value, the cap unchanged
    for name, shown in (("nan", "nan"), ("negative", "-0.25"), ("above_one", "1.5"), ("inf", "inf")):
        rc, message, limit = got[name]
        assert rc == 1 and message == (f"gmlake: set_per_process_memory_fraction: invalid fraction {shown}, it must "
                                       f"be between 0 and 1"), got[name]
        assert limit == 32 << 20
    assert got["set_1"] == 0 and got["at_1"] == "ok"
