"""An out-of-memory through the torch bridge is PyTorch's: c10::OutOfMemoryError in C++, torch.OutOfMemoryError in
Python, its text opening with PyTorch's words, counted in num_ooms, announced to the out-of-memory observers first
(Note [Torch's out-of-memory type] in gmlake/torch/_torch_oom.py). Policy and driver failures stay RuntimeErrors naming
their cause.

On a CPU: the C++ harnesses call gmlake_alloc as CUDAPluggableAllocator does, over an allocator on the sim driver;
torch_oom_harness.cpp hands what it throws to torch::translate_exception_to_python, the function behind torch's
Python bindings' error handling. The tests that need torch (its headers, libc10, libtorch_python) skip without it.
Each scenario runs in its own process: the bridge's allocators, thrower and observers are per process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gmlake import Allocator, SimDriver
from gmlake.core.errors import OutOfMemoryError, format_torch_size

HERE = Path(__file__).parent
MiB = 1 << 20
C10_OOM = "N3c1016OutOfMemoryErrorE"     # typeid(c10::OutOfMemoryError).name()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> str:
    compiler = _compiler()
    if compiler is None:
        pytest.skip("no C++ compiler to build the stand-in for PyTorch's allocator calls")
    library = tmp_path_factory.mktemp("harness") / "torch_pool_harness.so"
    subprocess.run([compiler, "-std=c++17", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(library),
                    str(HERE / "torch_pool_harness.cpp")], check=True)
    return str(library)


@pytest.fixture(scope="module")
def torch_harness(tmp_path_factory) -> str:
    """torch_oom_harness.cpp, linked to the installed torch's libtorch_python."""
    torch = _torch()
    compiler = _compiler()
    if torch is None or compiler is None:
        pytest.skip("needs torch and a C++ compiler")
    libdir = Path(torch.__file__).parent / "lib"
    library = tmp_path_factory.mktemp("harness") / "torch_oom_harness.so"
    subprocess.run([compiler, "-std=c++17", "-shared", "-fPIC", "-O1", "-Wall", "-Werror",
                    f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}", "-o", str(library),
                    str(HERE / "torch_oom_harness.cpp"), f"-L{libdir}", "-ltorch_python", f"-Wl,-rpath,{libdir}"],
                   check=True)
    return str(library)


# A scenario's common part: the bridge over a 64 MiB sim device capped at 48 MiB, the harness loaded, and
# alloc(size) -> (address or 0, the error's text, its C++ type).
PRELUDE = r"""
import ctypes, json, os, sys
from gmlake import Allocator, SimDriver
from gmlake.torch import _torch_bridge
MiB = 1 << 20
made = []
def factory(device):
    a = Allocator(SimDriver(capacity=64 * MiB), limit=48 * MiB)
    a.record_history(True)
    made.append(a)
    return a
_torch_bridge.configure(factory)
bridge = ctypes.CDLL(_torch_bridge.__file__)
hook = ctypes.cast(bridge.gmlake_alloc, ctypes.c_void_p).value
h = ctypes.CDLL(sys.argv[1])
h.harness_alloc.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64]
h.harness_alloc.restype = ctypes.c_uint64
h.harness_error.restype = ctypes.c_char_p
h.harness_error_type.restype = ctypes.c_char_p
def alloc(size):
    ptr = h.harness_alloc(hook, size, 0, 0)
    return ptr, h.harness_error().decode() if ptr == 0 else "", h.harness_error_type().decode() if ptr == 0 else ""
"""


def _run(script: str, *args: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", PRELUDE + script, *args], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the core: every out-of-memory is counted

def test_a_request_over_the_cap_is_counted_and_recorded_as_an_out_of_memory():
    """A request the cap (or the device) can never hold fails at once; it is still an out-of-memory for
    memory_stats' num_ooms and the snapshot's history, as under PyTorch's allocator."""
    a = Allocator(SimDriver(capacity=64 * MiB), limit=16 * MiB)
    a.record_history(True)
    for size in (32 * MiB, 1 << 40):        # over the cap; over the device
        with pytest.raises(OutOfMemoryError):
            a.malloc(size)
    assert a.stats()["ooms"] == 2
    ooms = [e for e in a.history() if e["action"] == "oom"]
    assert [e["size"] for e in ooms] == [32 * MiB, 1 << 40]
    assert all(e["device_free"] == 64 * MiB and "addr" not in e for e in ooms), ooms


def test_format_torch_size_writes_sizes_as_pytorch_does():
    assert [format_torch_size(n) for n in (0, 1024, 1025, MiB, MiB + 1, 1 << 30, (1 << 30) + 1, 3 << 30)] == [
        "0 bytes", "1024 bytes", "1.00 KiB", "1024.00 KiB", "1.00 MiB", "1024.00 MiB", "1.00 GiB", "3.00 GiB"]


# ---------------------------------------------------------------- through the bridge, without torch

OOM_TEXT = r"""
ptr, text, kind = alloc(int(sys.argv[2]))
print(json.dumps({"ptr": ptr, "text": text, "type": kind, "ooms": made[0].stats()["ooms"]}))
"""


def test_without_the_shim_an_out_of_memory_is_a_runtime_error_with_pytorchs_words(harness):
    got = _run(OOM_TEXT, harness, str(1 << 30))
    assert got["ptr"] == 0 and got["type"] == "St13runtime_error", got
    assert got["ooms"] == 1
    assert got["text"] == (
        "CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which 64.00 "
        "MiB is free. 48.00 MiB allowed; gmlake: 1073741824 bytes asked; 0.00 MiB reserved, 0.00 MiB allocated, "
        "0.00 MiB cached and free; 0 stitches made so far; limit in force: the cap of 48.00 MiB "
        "(set_per_process_memory_fraction or GMLAKE_LIMIT) binds before the device's 64.00 MiB. The allocator is "
        "still usable: free tensors or use a smaller batch and retry, or raise the cap.")


OBSERVED = r"""
seen = []
def observer(*args):
    seen.append(list(args))
    seen.append([e["action"] for e in made[0].history()][-1])      # the failure is in the history already
def raising(*args):
    raise ValueError("the observer failed")
_torch_bridge.attach_out_of_memory_observer(observer)
if sys.argv[2] == "raising":
    _torch_bridge.attach_out_of_memory_observer(raising)
keep = alloc(40 * MiB)
ptr, text, kind = alloc(16 * MiB)
print(json.dumps({"kept": keep[0] != 0, "seen": seen, "text": text, "type": kind}))
"""


def test_the_out_of_memory_observers_are_called_before_the_error(harness):
    """PyTorch's observer protocol: (device, bytes asked, the cap or else the device's capacity, free bytes)."""
    got = _run(OBSERVED, harness, "plain")
    assert got["kept"] and got["type"] == "St13runtime_error", got
    assert got["seen"] == [[0, 16 * MiB, 48 * MiB, 24 * MiB], "oom"], got
    assert got["text"].startswith("CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity of "
                                  "64.00 MiB of which 24.00 MiB is free. 48.00 MiB allowed; gmlake: ")


def test_an_observer_that_raises_leaves_the_out_of_memory_error_and_says_so(harness):
    proc = subprocess.run([sys.executable, "-c", PRELUDE + OBSERVED, harness, "raising"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["type"] == "St13runtime_error" and got["text"].startswith("CUDA out of memory."), got
    assert got["text"].endswith(" (An out-of-memory observer raised ValueError: the observer failed.)"), got
    assert "gmlake: an out-of-memory observer" in proc.stderr and "the observer failed" in proc.stderr


POLICY_AND_DRIVER = r"""
from dataclasses import dataclass
import gmlake
@dataclass(frozen=True)
class RefusesLargeSplits(gmlake.policies.GMLakePolicy):
    def should_split(self, block_size, size, pool, default):
        if pool == "large" and size >= 8 * MiB:
            raise ValueError("this policy refuses large splits")
        return default
def factory(device):
    a = Allocator(SimDriver(capacity=64 * MiB), RefusesLargeSplits() if device == 0 else gmlake.policies.GMLakePolicy())
    made.append(a)
    return a
_torch_bridge.configure(factory)
if sys.argv[2] == "shim":
    import torch
    from gmlake.torch import _torch_oom
    address, why = _torch_oom.thrower(torch)
    assert address, why
    _torch_bridge.set_oom_thrower(address)
policy = alloc(10 * MiB)
_torch_bridge.allocator(1).driver.inject_fault("create_chunk", 1)
driver = h.harness_alloc(hook, 4 * MiB, 1, 0), h.harness_error().decode(), h.harness_error_type().decode()
print(json.dumps({"policy": policy, "driver": driver}))
"""


@pytest.mark.parametrize("shim", ["none", "shim"])
def test_policy_and_driver_failures_stay_runtime_errors_naming_their_cause(harness, shim, tmp_path):
    if shim == "shim" and (_torch() is None or _compiler() is None):
        pytest.skip("the shim needs torch and a C++ compiler")
    got = _run(POLICY_AND_DRIVER, harness, shim, env={"GMLAKE_CACHE_DIR": str(tmp_path)})
    ptr, text, kind = got["policy"]
    assert ptr == 0 and kind == "St13runtime_error", got
    assert text.startswith("gmlake: allocating 10485760 bytes on device 0 failed: ") and "refuses large splits" in text
    assert "out of memory" not in text
    ptr, text, kind = got["driver"]
    assert ptr == 0 and kind == "St13runtime_error", got
    assert text.startswith("gmlake: allocating 4194304 bytes on device 1 failed: gmlake: driver call create_chunk "
                           "failed: "), got
    assert "out of memory" not in text


# ---------------------------------------------------------------- with torch: c10's type, torch's Python type

SHIM = r"""
import torch
from gmlake.torch import _torch_oom
address, why = _torch_oom.thrower(torch)
assert address, why
_torch_bridge.set_oom_thrower(address)
keep = alloc(40 * MiB)
ptr, text, kind = alloc(16 * MiB)
print(json.dumps({"text": text, "type": kind, "ooms": made[0].stats()["ooms"]}))
"""


def test_the_shim_throws_c10s_out_of_memory_error(harness, tmp_path):
    if _torch() is None or _compiler() is None:
        pytest.skip("the shim needs torch and a C++ compiler")
    got = _run(SHIM, harness, env={"GMLAKE_CACHE_DIR": str(tmp_path)})
    assert got["type"] == C10_OOM, got
    assert got["ooms"] == 1
    # c10::Error::what() is the message, then where it was raised.
    assert got["text"].startswith("CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity of "
                                  "64.00 MiB of which 24.00 MiB is free. 48.00 MiB allowed; gmlake: 16777216 bytes "
                                  "asked; 40.00 MiB reserved, 40.00 MiB allocated, 0.00 MiB cached and free; "), got
    assert list(tmp_path.glob("torch_oom-*.so")), "the shim was not cached"


PYTHON_SIDE = r"""
import torch
from gmlake.torch import _torch_oom
if sys.argv[3] == "shim":
    address, why = _torch_oom.thrower(torch)
    assert address, why
    _torch_bridge.set_oom_thrower(address)
t = ctypes.PyDLL(sys.argv[2])
t.harness_torch_alloc.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int]
t.harness_torch_alloc.restype = ctypes.py_object
keep = alloc(40 * MiB)
try:
    t.harness_torch_alloc(hook, 16 * MiB, 0)
    raise SystemExit("no error")
except Exception as exc:
    e = exc
# accelerate's should_reduce_batch_size, and Lightning's test of the words
accelerate = isinstance(e, RuntimeError) and len(e.args) == 1 and "CUDA out of memory." in e.args[0]
print(json.dumps({"type": type(e).__name__, "oom": isinstance(e, torch.cuda.OutOfMemoryError),
                  "torch_oom": isinstance(e, torch.OutOfMemoryError), "accelerate": accelerate,
                  "text": str(e), "ooms": made[0].stats()["ooms"]}))
"""


@pytest.mark.parametrize("shim", ["shim", "none"])
def test_python_receives_torch_out_of_memory_error(harness, torch_harness, shim, tmp_path):
    """What torch's binding raises for the bridge's error: torch.OutOfMemoryError with the shim; without it (no
    compiler) a RuntimeError that accelerate and Lightning still recognise by its words."""
    got = _run(PYTHON_SIDE, harness, torch_harness, shim, env={"GMLAKE_CACHE_DIR": str(tmp_path)})
    assert got["oom"] == got["torch_oom"] == (shim == "shim"), got
    assert got["type"] == ("OutOfMemoryError" if shim == "shim" else "RuntimeError"), got
    assert got["accelerate"], got
    assert got["text"].startswith("CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity"), got
    assert "\nException raised from" not in got["text"], got      # torch shows c10's backtrace only when asked
    assert got["ooms"] == 1


# ---------------------------------------------------------------- building the shim

def test_the_shim_is_built_once_then_loaded_from_the_cache(tmp_path):
    torch = _torch()
    if torch is None or _compiler() is None:
        pytest.skip("the shim needs torch and a C++ compiler")
    script = ("import time, torch; from gmlake.torch import _torch_oom; t = time.perf_counter(); "
              "a, why = _torch_oom.thrower(torch); print(a != 0, why, time.perf_counter() - t)")
    env = {**os.environ, "GMLAKE_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    built = sorted(tmp_path.iterdir())
    assert [p.suffix for p in built] == [".so"], built          # no temporary file left behind
    mtime = built[0].stat().st_mtime_ns
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.split()[:2] == second.stdout.split()[:2] == ["True", "None"], (first.stdout, second.stdout)
    assert built[0].stat().st_mtime_ns == mtime, "the cached shim was rebuilt"


def test_without_a_compiler_the_shim_is_refused_with_the_reason(tmp_path):
    torch = _torch()
    if torch is None:
        pytest.skip("needs torch")
    script = "import torch; from gmlake.torch import _torch_oom; print(_torch_oom.thrower(torch))"
    env = {**os.environ, "GMLAKE_CACHE_DIR": str(tmp_path), "CXX": "/nonexistent/c++"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "(0, 'no C++ compiler (set CXX, or install g++)')"


INSTALL = r"""
import warnings, torch
import gmlake.torch as gt
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    installed = gt.install_oom_error(torch)
print(json.dumps({"installed": installed, "thrower": _torch_bridge.oom_thrower() != 0,
                  "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.parametrize("cxx", ["found", "missing"])
def test_enable_installs_the_shim_or_warns_once_why_not(harness, cxx, tmp_path):
    """What enable() does for the error type (the rest of enable() needs CUDA)."""
    if _torch() is None:
        pytest.skip("needs torch")
    if cxx == "found" and _compiler() is None:
        pytest.skip("needs a C++ compiler")
    env = {"GMLAKE_CACHE_DIR": str(tmp_path), **({"CXX": "/nonexistent/c++"} if cxx == "missing" else {})}
    got = _run(INSTALL, harness, env=env)
    if cxx == "found":
        assert got == {"installed": True, "thrower": True, "warnings": []}, got
    else:
        assert got["installed"] is False and got["thrower"] is False, got
        assert got["warnings"] == [(
            "gmlake: an out-of-memory will be a RuntimeError whose text begins \"CUDA out of memory.\", not "
            f"torch.OutOfMemoryError: the shim that raises torch's type could not be built against torch "
            f"{_torch().__version__} (no C++ compiler (set CXX, or install g++))")], got


ATTACH = r"""
import torch
import gmlake.torch as gt
gt.install_memory_api(torch)
seen = []
torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(list(args)))
ptr, text, kind = alloc(1 << 30)
gt.restore_memory_api(torch)
print(json.dumps({"seen": seen, "num_ooms": gt.nested_memory_stats(0)["num_ooms"],
                  "restored": getattr(torch._C, "_cuda_attach_out_of_memory_observer", None) is None}))
"""


def test_torchs_observer_entry_point_reaches_the_bridge(harness):
    """torch._C._cuda_attach_out_of_memory_observer, which the pluggable allocator refuses, registers with gmlake
    once gmlake answers torch's memory API; num_ooms counts the failure."""
    torch = _torch()
    if torch is None:
        pytest.skip("needs torch")
    got = _run(ATTACH, harness)
    assert got["seen"] == [[0, 1 << 30, 48 * MiB, 64 * MiB]], got
    assert got["num_ooms"] == 1
    assert got["restored"] == (not hasattr(torch._C, "_cuda_attach_out_of_memory_observer"))


def test_a_snapshot_with_an_out_of_memory_renders_in_memory_viz():
    """The oom entry carries device_free, as PyTorch's does: torch.cuda._memory_viz's text trace reads it."""
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    from gmlake.torch import snapshot_of

    a = Allocator(SimDriver(capacity=64 * MiB), limit=48 * MiB)
    a.record_history(True)
    kept = a.malloc(40 * MiB)
    with pytest.raises(OutOfMemoryError):
        a.malloc(16 * MiB)
    snapshot = snapshot_of({0: a})
    assert "raise OutOfMemoryError # 16.0MiB requested, 24.0MiB free in CUDA" in _memory_viz.trace(snapshot)
    assert len(_memory_viz.trace_plot(snapshot)) > 1000 and len(_memory_viz.segment_plot(snapshot)) > 1000
    a.free(kept)


def test_the_guides_sample_message_is_what_the_error_says():
    """docs/guide.md's out-of-memory sample is the text torch_message writes for its figures, so it cannot drift."""
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    sample = guide.split("<!-- generated: oom-message -->\n```\n", 1)[1].split("```", 1)[0]
    mib, gib = 1 << 20, 1 << 30
    error = OutOfMemoryError(requested=gib, reserved=1536 * mib, allocated=1536 * mib, cached=0, limit=2 * gib,
                             capacity=143156 * mib)
    assert " ".join(sample.split()) == error.torch_message(0, device_free=int(137.62 * gib), stitches=3)


def test_a_cap_of_the_whole_device_is_not_named_as_the_limit():
    """set_per_process_memory_fraction(1.0) sets a cap of the device's size, which binds nothing (the core's rule):
    the message names the device as the limit and does not tell the user to raise the cap."""
    device = 140 * (1 << 30)
    error = OutOfMemoryError(requested=93 * MiB, reserved=8988 * MiB, allocated=8632 * MiB, cached=355 * MiB,
                             limit=device, capacity=device)
    text = error.torch_message(0, device_free=63 * MiB, stitches=11)
    assert "limit in force: the device's own 143360.00 MiB (the cap of 143360.00 MiB is not below it" in text
    assert "binds before" not in text and "raise the cap" not in text
    capped = OutOfMemoryError(requested=93 * MiB, reserved=0, allocated=0, cached=0, limit=device // 2,
                              capacity=device).torch_message(0)
    assert "binds before the device's" in capped and "raise the cap" in capped


@pytest.mark.parametrize("page, cached, free, hint", [
    (20 * MiB, 300 * MiB, 400 * MiB, True),         # the bytes are there, in coarse pages: finer ones may fit
    (2 * MiB, 300 * MiB, 400 * MiB, False),         # already the finest pages
    (None, 300 * MiB, 400 * MiB, False),            # a policy without expandable ranges
    (20 * MiB, 75 * MiB, 457 * MiB, False),         # cached and free together are short of the request: no page helps
    (20 * MiB, 0, 900 * MiB, False),                # nothing cached: the device itself could not give the bytes
])
def test_the_message_suggests_finer_pages_only_where_they_could_fit_the_request(page, cached, free, hint):
    """Like PyTorch's hint at expandable segments: coarse pages, with the request no larger than what is cached free
    and what the device still has, name the knob and where it is measured."""
    error = OutOfMemoryError(requested=700 * MiB, reserved=8508 * MiB, allocated=8508 * MiB - cached, cached=cached,
                             limit=None, capacity=143156 * MiB)
    text = error.torch_message(0, device_free=free, stitches=1, page=page)
    assert ("GMLAKE_KNOBS=expandable_page_large=2MiB" in text) == hint
    assert ('"Fine pages from the start"' in text) == hint


@pytest.mark.parametrize("tail_page, suggested", [(0, True), (2 * MiB, False), (None, False)])
def test_the_hint_offers_tail_pages_first_where_the_policy_does_not_cut_them(tail_page, suggested):
    """Slots at blocks' tails cost fewer driver calls than fine pages everywhere: the hint names them first where the
    policy maps whole tail pages (0), not where it already cuts them or has no such knob (None)."""
    error = OutOfMemoryError(requested=700 * MiB, reserved=8508 * MiB, allocated=8208 * MiB, cached=300 * MiB,
                             limit=None, capacity=143156 * MiB)
    text = error.torch_message(0, device_free=400 * MiB, stitches=1, page=20 * MiB, tail_page=tail_page)
    assert ("GMLAKE_KNOBS=tail_page=2MiB" in text) == suggested, text
    assert "GMLAKE_KNOBS=expandable_page_large=2MiB" in text
    assert text.index("tail_page") < text.index("expandable_page_large") if suggested else True


def test_under_a_cap_the_room_is_the_caps():
    """Under a binding cap the room is the cap less reserved, not the device's free memory."""
    error = OutOfMemoryError(requested=100 * MiB, reserved=560 * MiB, allocated=500 * MiB, cached=60 * MiB,
                             limit=600 * MiB, capacity=143156 * MiB)
    assert "expandable_page_large" in error.torch_message(0, device_free=100 << 30, page=20 * MiB)
    short = OutOfMemoryError(requested=200 * MiB, reserved=560 * MiB, allocated=500 * MiB, cached=60 * MiB,
                             limit=600 * MiB, capacity=143156 * MiB)
    assert "expandable_page_large" not in short.torch_message(0, device_free=100 << 30, page=20 * MiB)


@pytest.mark.parametrize("limit, capped_page, hint", [
    (600 * MiB, 4 * MiB, "capped_page_large=2MiB"),        # the cap binds: its pages are in force, and its knob
    (600 * MiB, 2 * MiB, None),                            # ... already the finest: nothing to suggest
    (600 * MiB, None, "expandable_page_large=2MiB"),       # no capped page: the uncapped one is in force
    (None, 2 * MiB, "expandable_page_large=2MiB"),         # no cap: the capped page is not in force
])
def test_the_hint_names_the_pages_in_force_and_their_knob(limit, capped_page, hint):
    """A policy with capped_page_large maps those pages while a cap binds: the hint judges them, and names the knob
    that would change them (expandable_page_large does not, under the cap)."""
    error = OutOfMemoryError(requested=100 * MiB, reserved=560 * MiB, allocated=500 * MiB, cached=60 * MiB,
                             limit=limit, capacity=143156 * MiB)
    text = error.torch_message(0, device_free=100 << 20, page=20 * MiB, capped_page=capped_page)
    assert ("GMLAKE_KNOBS=" in text) == (hint is not None), text
    if hint:
        assert f"GMLAKE_KNOBS={hint}" in text, text
