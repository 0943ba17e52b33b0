"""bench/_bench.pyx, the nogil timing loops of `bench micro` and the replay price table: built from its source on
first use (bench/native.py) against the installed gmlake, and run over the modelled drivers and, through the
stand-in libcuda (tests/fake_libcuda.c), over the CUDA driver."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import gmlake
from bench import ROOT
from bench.native import load

STREAM_CALLS = {"capture_query", "event_record", "event_query", "event_rerecord", "event_destroy", "iterations"}
DRIVER_CALLS = {"create_chunk", "reserve", "map", "set_access_per_handle", "set_access_one_handle", "unmap_per_handle",
                "free_va", "release_chunk", "copy_out_per_mib", "copy_in_per_mib", "chunk_size", "handles"}


@pytest.mark.parametrize("make", [gmlake.SimDriver, gmlake.HostDriver])
def test_stream_calls_are_timed(make):
    time_stream_calls = load().time_stream_calls
    got = time_stream_calls(make(), 0, 100)
    assert set(got) == STREAM_CALLS
    assert all(got[k] >= 0 for k in got)
    with pytest.raises(ValueError):
        time_stream_calls(make(), 0, 0)


@pytest.mark.parametrize("make", [gmlake.SimDriver, gmlake.HostDriver])
def test_driver_calls_are_timed_and_leave_nothing_behind(make):
    driver = make()
    got = load().time_driver_calls(driver, 2 << 20, 4)
    assert set(got) == DRIVER_CALLS and got["handles"] == 4 and got["chunk_size"] == 2 << 20
    assert all(got[k] >= 0 for k in got)
    assert set(driver.leaks().values()) == {0}


def test_a_clean_checkout_builds_the_module_on_first_use(tmp_path):
    """No built module, no generated C++: load() cythonizes and compiles bench/_bench.pyx against the installed
    gmlake's .pxd files, in the checkout it is loaded from (here a copy of bench/ with only its sources)."""
    (tmp_path / "bench").mkdir()
    for name in ("__init__.py", "native.py", "_bench.pyx"):
        shutil.copy(ROOT / "bench" / name, tmp_path / "bench" / name)
    code = ("import json, gmlake; from bench.native import load; m = load(); "
            "print(json.dumps([m.__file__, sorted(m.time_stream_calls(gmlake.SimDriver(), 0, 3))]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built, calls = json.loads(proc.stdout.strip().splitlines()[-1])
    assert built.startswith(str(tmp_path / "bench" / "_bench.")) and built.endswith(".so"), built
    assert set(calls) == STREAM_CALLS


def test_a_failed_build_is_one_clear_error(tmp_path):
    """A source that does not compile: load() raises ImportError with the one line that says why."""
    (tmp_path / "bench").mkdir()
    for name in ("__init__.py", "native.py"):
        shutil.copy(ROOT / "bench" / name, tmp_path / "bench" / name)
    (tmp_path / "bench" / "_bench.pyx").write_text("cdef int broken(:\n")
    code = "from bench.native import load\ntry:\n    load()\nexcept ImportError as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = proc.stdout.strip()
    assert message.startswith("could not build bench/_bench.pyx: ") and "\n" not in message, message
    # the compiler's own diagnostic, at its place in the source: not the traceback's last line
    assert message.removeprefix("could not build bench/_bench.pyx: ").startswith("bench/_bench.pyx:1:"), message


# --- through the CUDA driver, on the stand-in libcuda ---------------------------------------------------------------

@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> str:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    library = tmp_path_factory.mktemp("fake-cuda") / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(library),
                    str(ROOT / "tests" / "fake_libcuda.c")], check=True)
    return str(library)


TIMED = """
import json, gmlake
from bench.native import load
_bench = load()
drv = gmlake.cuda_driver(0)
busy = [drv.busy_seconds]
costs = _bench.time_driver_calls(drv, 2 << 20, 4)     # every VMM call and the copies, and synchronize
busy.append(drv.busy_seconds)
streams = _bench.time_stream_calls(drv, 0, 8)          # the capture query and the event calls
busy.append(drv.busy_seconds)
print(json.dumps({"costs": costs, "streams": streams, "busy": busy, "leaks": drv.leaks()}))
"""


@pytest.mark.parametrize("driver_version", ["12080", "13000"])
def test_the_timing_loops_run_over_the_cuda_driver(fake_libcuda, driver_version):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GMLAKE_", "FAKE_CUDA_"))}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(TIMED)], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=600, env={**clean, "GMLAKE_LIBCUDA": fake_libcuda,
                                                         "FAKE_CUDA_DRIVER_VERSION": driver_version})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(got["costs"]) == DRIVER_CALLS and set(got["streams"]) == STREAM_CALLS
    assert got["streams"]["iterations"] == 8
    # the time inside the driver's calls grows with each loop: the loops made real calls into the library
    assert got["busy"][0] == 0 < got["busy"][1] < got["busy"][2]
    assert set(got["leaks"].values()) == {0}
