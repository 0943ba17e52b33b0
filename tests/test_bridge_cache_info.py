"""cacheInfo through the torch bridge (Note [The largest block served now] in gmlake/torch/_torch_bridge.pyx): what
gmlake_cache_info answers for a device, driven through its C entry point over the model driver, for each built-in
policy; the answer is always served without an out-of-memory and without growing past the cap. No torch, no GPU."""
from __future__ import annotations

import json
import subprocess
import sys

MiB = 1 << 20

PRELUDE = r"""
import ctypes, json, random, sys
from gmlake import Allocator, SimDriver
from gmlake.policies import resolve
from gmlake.torch import _torch_bridge

MiB = 1 << 20
made = {}
bridge = ctypes.CDLL(_torch_bridge.__file__)
bridge.gmlake_cache_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
bridge.gmlake_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]

def info(device):
    largest, error = ctypes.c_size_t(12345), ctypes.create_string_buffer(256)
    if bridge.gmlake_cache_info(device, ctypes.byref(largest), error, len(error)):
        return error.value.decode()
    return largest.value
"""

# Device d: SimDriver(256 MiB) under POLICIES[d].
STATES = PRELUDE + r"""
POLICIES = sys.argv[1].split(",")
def factory(device):
    if device >= len(POLICIES):
        raise RuntimeError(f"no device {device} here")
    made[device] = Allocator(SimDriver(capacity=256 * MiB), resolve(POLICIES[device], {}, None).policy)
    return made[device]
_torch_bridge.configure(factory)

out = {}
for d, name in enumerate(POLICIES):
    got = out[name] = {"fresh": info(d)}
    a = made[d]
    big, small = a.malloc(100 * MiB), a.malloc(20 * MiB)
    a.free(big)
    got["one_free"] = info(d)
    reserved = a.stats()["reserved_bytes"]
    a.set_limit(reserved)                  # no room to grow: the free block is what it serves
    got["cap_at_reserved"] = info(d)
    a.set_limit(reserved + 131 * MiB)      # room past the free block, rounded down to whole pages
    got["cap_with_room"] = info(d)
    # free blocks of three streams, the largest on each stream in turn: each stream's run is walked
    a.set_limit(None)
    a.free(small)
    a.empty_cache()
    got["streams"] = []
    for order in ((7, 3, 0), (3, 7, 0), (0, 3, 7)):
        ptrs = [a.malloc(size * MiB, stream) for size, stream in zip((60, 20, 10), order)]
        for p in ptrs:
            a.free(p)
        a.set_limit(a.stats()["reserved_bytes"])
        got["streams"].append(info(d))
        a.set_limit(None)
        a.empty_cache()
    bridge.gmlake_memory_fraction(0.0, d)  # a cap of 0 bytes: nothing is served
    got["zero_cap"] = info(d)
out["errors"] = [info(64), info(-1), info(len(POLICIES))]
print(json.dumps(out))
"""

POLICY_NAMES = ("gmlake", "gmlake-paper", "caching", "expandable")
# What each one's growth maps at a time: 20 MiB pages of an expandable range, 2 MiB chunks, PyTorch's 2 MiB steps.
PAGE = {"gmlake": 20 * MiB, "gmlake-paper": 2 * MiB, "caching": 2 * MiB, "expandable": 20 * MiB}


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cache_info_answers_the_largest_block_served_now():
    got = _run(STATES, ",".join(POLICY_NAMES))
    for name in POLICY_NAMES:
        g, page, reserve = got[name], PAGE[name], (8 * MiB if name == "gmlake" else 0)
        # A fresh device: what growth may take, the device's free memory less the policy's device reserve, in whole
        # pages of its growth.
        assert g["fresh"] == (256 * MiB - reserve) // page * page, (name, g)
        # 100 MiB freed, 20 MiB live: the device's free memory wins; at a cap of what is reserved, the free block.
        assert g["one_free"] == (256 * MiB - 120 * MiB - reserve) // page * page, (name, g)
        assert g["cap_at_reserved"] == 100 * MiB, (name, g)
        # 131 MiB of room under a cap below the device's memory (the device reserve is not left then), in whole
        # pages: past the 100 MiB free block.
        assert g["cap_with_room"] == 131 * MiB // page * page, (name, g)
        assert g["streams"] == [60 * MiB] * 3, (name, g)
        assert g["zero_cap"] == 0, (name, g)
    n = len(POLICY_NAMES)
    assert got["errors"] == ["gmlake: device 64 out of range", "gmlake: device -1 out of range",
                             f"gmlake: cannot create the allocator for device {n}: no device {n} here"], got["errors"]


# Random allocations and frees, under a cap that moves; after each step the answer is asked for and a request of
# that size made: it must be served with no out-of-memory counted and the cap kept. On three streams where the
# policy serves one stream from another's free blocks (cross_stream), else on one: cacheInfo names no stream, and
# counts every stream's free blocks, as PyTorch's does.
SERVED = PRELUDE + r"""
name, seed = sys.argv[1], int(sys.argv[2])
def factory(device):
    made[device] = Allocator(SimDriver(capacity=512 * MiB), resolve(name, {}, None).policy)
    return made[device]
_torch_bridge.configure(factory)
a = _torch_bridge.allocator(0)
streams = [0, 5, 9] if a.policy.cross_stream else [0]
rng = random.Random(seed)
live, asked, failures = [], [], []
for step in range(300):
    if live and rng.random() < 0.45:
        a.free(live.pop(rng.randrange(len(live))))
    else:
        size = rng.choice([rng.randrange(1, 1 << 20), rng.randrange(1 << 20, 48 * MiB)])
        try:
            live.append(a.malloc(size, rng.choice(streams)))
        except Exception:
            pass
    if rng.random() < 0.2:
        a.set_limit(rng.choice([None, a.stats()["reserved_bytes"] + rng.randrange(0, 64 * MiB), 300 * MiB]))
    n = info(0)
    if not n:
        continue
    asked.append(n)
    before = a.stats()
    try:
        p = a.malloc(n, rng.choice(streams))
    except Exception as exc:
        failures.append([step, n, a.limit, before["reserved_bytes"], type(exc).__name__])
        continue
    after = a.stats()
    # a cap set under what is reserved already is kept by not growing at all
    if after["ooms"] != before["ooms"] or (
            a.limit is not None and after["reserved_bytes"] > max(a.limit, before["reserved_bytes"])):
        failures.append([step, n, a.limit, after["reserved_bytes"], "grew past the cap or counted an out-of-memory"])
    a.free(p)
print(json.dumps({"asked": len(asked), "largest": max(asked), "failures": failures[:5]}))
"""


def test_the_answer_is_served_without_out_of_memory():
    for name in POLICY_NAMES:
        for seed in (1, 2):
            got = _run(SERVED, name, str(seed))
            assert got["failures"] == [], (name, seed, got)
            assert got["asked"] > 200, (name, seed, got)


COUNTED = PRELUDE + r"""
_torch_bridge.configure(lambda device: Allocator(SimDriver(capacity=256 * MiB), resolve("caching", {}, None).policy))
before = _torch_bridge.cache_info_calls()
through_c = info(0)
through_python = _torch_bridge.cache_info(0)
try:
    _torch_bridge.cache_info(70)
    error = None
except RuntimeError as exc:
    error = str(exc)
print(json.dumps([before, through_c, through_python, error, _torch_bridge.cache_info_calls()]))
"""


def test_each_call_is_counted_and_python_asks_the_same():
    """cache_info_calls() says whether cacheInfo reached the bridge (the GPU check reads it); cache_info(device) is
    the same answer from Python, and its error a RuntimeError."""
    assert _run(COUNTED) == [0, 256 * MiB, 256 * MiB, "gmlake: device 70 out of range", 3]
