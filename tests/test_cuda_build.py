"""The `cuda` driver builds and imports with no CUDA at all, and finds and calls any CUDA 12 or 13 driver at run time.

gmlake resolves the driver's entry points with cuGetProcAddress when the first CudaDriver is made, so nothing about
CUDA is fixed at build time. These tests check that on a CPU machine: the built extension links nothing of CUDA's,
imports with cuda-bindings blocked, and drives tests/fake_libcuda.c (a stand-in libcuda.so.1) as a CUDA 12 and as a
CUDA 13 driver, through the 12.0 and the 13.0 entry points. The real driver is tested on a GPU by
FULL=1 scripts/gpu-check.sh.

Each case runs in its own process: the resolved entry points are per process.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gmlake

HERE = Path(__file__).parent
GMLAKE_DIR = Path(gmlake.__file__).parent
MiB = 1 << 20


# --- what the built extensions link ---------------------------------------------------------------------------------

def _elf_dynamic(path: Path) -> tuple[list[str], list[str]]:
    """(DT_NEEDED libraries, undefined dynamic symbols) of a 64-bit little-endian ELF shared object."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is not a 64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table: int, offset: int) -> str:
        start = sections[table][4] + offset
        return data[start:data.index(b"\0", start)].decode()

    needed, undefined = [], []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind == 6:                                    # SHT_DYNAMIC: (tag, value) pairs
            for pos in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == 1:                             # DT_NEEDED
                    needed.append(string(link, value))
        elif kind == 11:                                 # SHT_DYNSYM
            for pos in range(offset + entsize, offset + size, entsize):
                name, _, _, shndx = struct.unpack_from("<IBBH", data, pos)
                if shndx == 0:                           # SHN_UNDEF
                    undefined.append(string(link, name))
    return needed, undefined


def _is_cuda_symbol(name: str) -> bool:
    return (name.startswith("cu") and name[2:3].isupper()) or name.startswith("cuda")


def test_elf_reader_sees_what_an_extension_links():
    # The reader must find something, or the test below would pass on a reader that finds nothing.
    needed, undefined = _elf_dynamic(next(GMLAKE_DIR.rglob("_cuda_driver*.so")))
    assert any(lib.startswith("libc.so") for lib in needed), needed
    assert {"dlopen", "dlsym"} <= {name.split("@")[0] for name in undefined}, undefined


def test_no_extension_links_cuda():
    libraries = sorted(GMLAKE_DIR.rglob("_*.so"))
    assert any(lib.name.startswith("_cuda_driver") for lib in libraries), "the cuda driver was not built"
    for library in libraries:
        needed, undefined = _elf_dynamic(library)
        assert not [lib for lib in needed if "cuda" in lib], f"{library.name} needs {needed}"
        assert not [name for name in undefined if _is_cuda_symbol(name)], f"{library.name} imports CUDA symbols"


def test_nothing_of_cuda_is_required_to_build_or_install():
    requires = importlib.metadata.requires("gmlake") or []
    assert requires, "gmlake's installed metadata lists no requirements at all: is this gmlake?"
    assert not [r for r in requires if "cuda" in r.lower()], requires
    pyproject = (HERE.parent / "pyproject.toml").read_text()
    build_requires = re.search(r"^\[build-system\]\s*(?:#.*\n)*requires\s*=\s*\[(.*?)\]", pyproject,
                               re.MULTILINE | re.DOTALL)
    assert build_requires and "Cython" in build_requires[1], "no build requirements found in pyproject.toml"
    assert "cuda" not in build_requires[1].lower(), build_requires[1]


# --- running it in a fresh process ----------------------------------------------------------------------------------

# Import gmlake's cuda driver with cuda-bindings made unimportable, then run `body`, which prints one JSON line.
PRELUDE = """
import ctypes, json, os, sys
sys.modules["cuda"] = None                  # any `import cuda...` now fails: gmlake must not need cuda-bindings
import gmlake
from gmlake import Allocator
from gmlake.drivers._cuda_driver import CudaDriverError

def fake_log():
    path = os.environ.get("GMLAKE_LIBCUDA")
    if not path:
        return ""
    log = ctypes.CDLL(path).fake_cuda_log
    log.restype = ctypes.c_char_p
    return log().decode()

def error_of(call):
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
"""


def run_gmlake(body: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GMLAKE_", "FAKE_CUDA_"))}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env={**clean, **env},
                          capture_output=True, check=False, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> str:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    library = tmp_path_factory.mktemp("fake-cuda") / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(library),
                    str(HERE / "fake_libcuda.c")], check=True)
    return str(library)


WORKLOAD = """
drv = gmlake.cuda_driver(0)
busy = [drv.busy_seconds]                              # 0: the driver's own start is not counted
alloc = Allocator(drv, gmlake.policies.get("gmlake-paper"))   # stitches at once
blocks = [alloc.malloc(8 << 20, stream=1) for _ in range(3)]
guard = alloc.malloc(3 << 20, stream=1)
for p in blocks:
    alloc.free(p)
big = alloc.malloc(24 << 20, stream=1)                # no free block fits: stitched from the three
other = alloc.malloc(8 << 20, stream=2)               # another stream: the freed blocks' streams are fenced
stats = alloc.stats()
for p in (big, guard, other):
    alloc.free(p)
alloc.empty_cache()                                    # synchronizes, then releases and frees every range
alloc.close()
busy.append(drv.busy_seconds)
edge = Allocator(drv, gmlake.policies.get("gmlake", reback_slot=2 << 20), limit=200 << 20)  # re-backing (opted into) at the cap
live, gaps = [], []
for _ in range(10):
    live.append(edge.malloc(6 << 20))
    gaps.append(edge.malloc(14 << 20))
for p in gaps:
    edge.free(p)
big = edge.malloc(100 << 20)                           # fits once the pages' free slots went back
edge_stats = edge.stats()
for p in live + [big]:
    edge.free(p)
edge.empty_cache()
edge.close()
busy.append(drv.busy_seconds)
print(json.dumps({"busy": busy, "sim_busy": gmlake.SimDriver().busy_seconds,
    "driver_version": drv.driver_version, "api_version": drv.api_version, "granularity": drv.granularity,
    "capacity": drv.capacity, "mem_get_info": drv.mem_get_info(), "stitches": stats["stitches"],
    "rebacked": edge_stats["rebacked_chunks"], "copies": [edge_stats["calls"]["copy_out"], edge_stats["calls"]["copy_in"]],
    "leaks": drv.leaks(), "log": fake_log(),
}))
"""


# (driver, GMLAKE_CUDA_API_VERSION): a CUDA 12 driver has no 13.0 entry points to ask for (see the test below).
@pytest.mark.parametrize("driver_version, api_version", [
    ("12080", ""), ("12080", "12000"), ("13000", ""), ("13000", "12000"), ("13000", "13000")])
def test_the_driver_runs_on_cuda_12_and_13_drivers(fake_libcuda, driver_version, api_version):
    got = run_gmlake(WORKLOAD, GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_DRIVER_VERSION=driver_version,
                     GMLAKE_CUDA_API_VERSION=api_version)
    requested = int(api_version or 12000)                  # 12000 unless the knob asks for another
    assert (got["driver_version"], got["api_version"]) == (int(driver_version), requested)
    assert got["granularity"] == 2 * MiB and got["capacity"] == 80 << 30
    assert got["mem_get_info"] == [80 << 30, 80 << 30]     # every chunk went back to the driver
    assert got["stitches"] == 1 and set(got["leaks"].values()) == {0}
    assert got["rebacked"] == 10 and got["copies"] == [10, 10]     # Note [Taking slots back at the edge]
    # measured time inside the driver's calls grows with every call; the models measure none (replay prices them)
    assert got["busy"][0] == 0 < got["busy"][1] < got["busy"][2] and got["sim_busy"] == 0
    log = got["log"].splitlines()
    resolved = [line for line in log if line.startswith("resolve ")]
    assert len(resolved) == 29 and all(line.endswith(f" {requested} flags=1") for line in resolved), resolved
    # The synchronize variant must be the one the requested version defines (the fake rejects a wrong context).
    wanted, unwanted = ("cuCtxSynchronize(ctx)", "cuCtxSynchronize(void)")[:: 1 if requested >= 13000 else -1]
    assert wanted in log and unwanted not in log
    for call in ("cuInit", "cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                 "cuMemRelease", "cuMemAddressFree", "cuStreamIsCapturing", "cuEventCreate", "cuEventRecord",
                 "cuEventQuery", "cuEventDestroy", "cuMemcpyDtoH", "cuMemcpyHtoD"):
        assert call in log, f"{call} was never called"


def test_another_streams_block_is_taken_after_a_wait_on_the_gpu(fake_libcuda):
    """Note [Waiting for another stream's free block] through the CUDA driver: with no event ever done, a fence
    never hands stream 1's freed block to stream 2, and the default grows; with cross_stream_wait, stream 2 waits
    for stream 1's work (cuEventRecord on 1, cuStreamWaitEvent on 2) and takes the block at once."""
    got = run_gmlake("""
        drv = gmlake.cuda_driver(0)
        out = {}
        for wait in (False, True):
            alloc = Allocator(drv, gmlake.policies.get("gmlake", cross_stream_wait=wait))
            first = alloc.malloc(8 << 20, stream=1)
            alloc.free(first)
            second = alloc.malloc(8 << 20, stream=2)
            stats = alloc.stats()
            out[str(wait)] = {"same": second == first, "waits": stats["stream_waits"],
                              "calls": stats["calls"]["event_wait"], "reserved": stats["reserved_bytes"]}
            alloc.free(second)
            alloc.close()
        print(json.dumps({**out, "leaks": drv.leaks(), "log": fake_log()}))
    """, GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_EVENTS_PENDING="1")
    assert got["False"] == {"same": False, "waits": 0, "calls": 0, "reserved": 40 << 20}
    assert got["True"] == {"same": True, "waits": 1, "calls": 1, "reserved": 20 << 20}
    assert set(got["leaks"].values()) == {0} and "cuStreamWaitEvent" in got["log"]


def test_the_cuda_driver_records_a_kept_event_again(fake_libcuda):
    """Note [Reusing events] through the CUDA driver's calls: 20 record_stream frees create one event (cuEventCreate
    once, cuEventRecord 20 times), and empty_cache destroys it."""
    got = run_gmlake("""
        drv = gmlake.cuda_driver(0)
        alloc = Allocator(drv)
        for _ in range(20):
            p = alloc.malloc(6 << 20, stream=1)
            alloc.record_stream(p, 2)
            alloc.free(p)
        alloc.free(alloc.malloc(4096, stream=1))       # the last free's event is done: kept
        out = {"created": drv.created_events, "records": alloc.stats()["calls"]["event_record"],
               "spares": alloc.spares["events"]}
        alloc.empty_cache()
        out["spares_after"] = alloc.spares["events"]
        alloc.close()
        print(json.dumps({**out, "leaks": drv.leaks()}))
    """, GMLAKE_LIBCUDA=fake_libcuda)
    assert got["created"] == 1 and got["records"] == 20 and got["spares"] == 1 and got["spares_after"] == 0
    assert set(got["leaks"].values()) == {0}


def test_an_unannounced_capture_is_refused_before_any_vmm_call(fake_libcuda):
    """Note [Unannounced capture] through the CUDA driver: cuStreamIsCapturing says the stream captures, and the
    request that needs new memory fails with GraphCaptureError before cuMemAddressReserve or cuMemCreate."""
    got = run_gmlake("""
        a = Allocator(gmlake.cuda_driver(0))
        error = error_of(lambda: a.malloc(64 << 20, 0))
        print(json.dumps({"error": error, "log": fake_log(), "reserved": a.stats()["reserved_bytes"]}))
    """, GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_CAPTURING="1")
    assert got["error"].startswith("GraphCaptureError: gmlake: cannot allocate 67108864 bytes: the stream is being "
                                   "captured into a CUDA graph that the allocator was not told of"), got["error"]
    calls = "\n".join(line for line in got["log"].splitlines() if not line.startswith("resolve "))
    assert "cuStreamIsCapturing" in calls and "cuMemCreate" not in calls and "cuMemAddressReserve" not in calls, calls
    assert got["reserved"] == 0


def test_too_old_a_driver_is_refused_clearly(fake_libcuda):
    got = run_gmlake("""
        errors = [error_of(lambda: gmlake.cuda_driver(0)) for _ in range(2)]
        print(json.dumps({"errors": errors, "available": gmlake.cuda_available(), "log": fake_log()}))
    """, GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_DRIVER_VERSION="11080")
    assert got["errors"][0] == got["errors"][1] == (
        "CudaDriverError: gmlake: the CUDA driver supports CUDA 11.8, but gmlake needs CUDA 12.0 or newer: "
        "update the NVIDIA driver")
    assert got["available"] is False and "resolve" not in got["log"]


def test_cuda_13_entry_points_are_refused_on_a_cuda_12_driver(fake_libcuda):
    got = run_gmlake("print(json.dumps(error_of(lambda: gmlake.cuda_driver(0))))",
                     GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_DRIVER_VERSION="12080", GMLAKE_CUDA_API_VERSION="13000")
    assert got == ("CudaDriverError: gmlake: GMLAKE_CUDA_API_VERSION=13000 asks for CUDA 13.0 entry points, but the "
                   "CUDA driver supports only CUDA 12.8")


@pytest.mark.parametrize("value", ["12", "12010", "13000x", "-1"])
def test_an_unknown_api_version_is_refused(value):
    got = run_gmlake("print(json.dumps(error_of(lambda: gmlake.cuda_driver(0))))", GMLAKE_CUDA_API_VERSION=value)
    assert got == ("CudaDriverError: gmlake: GMLAKE_CUDA_API_VERSION must be one of 12000, 13000 (the CUDA versions "
                   f"whose entry points gmlake declares), not {value!r}")


def test_a_missing_entry_point_is_named(fake_libcuda):
    got = run_gmlake("print(json.dumps(error_of(lambda: gmlake.cuda_driver(0))))",
                     GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_NO_ENTRY="cuMemSetAccess")
    assert got == ("CudaDriverError: gmlake: cannot resolve cuMemSetAccess for CUDA 12.0: the driver has no such "
                   "entry point")


def test_failed_calls_name_the_call_and_the_result(fake_libcuda):
    got = run_gmlake("""
        drv = gmlake.cuda_driver(0)
        alloc = Allocator(drv)
        failed = error_of(lambda: alloc.malloc(64 << 20))
        alloc.close()
        print(json.dumps({"malloc": failed, "device": error_of(lambda: gmlake.cuda_driver(1)),
                          "leaks": drv.leaks()}))
    """, GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_FAIL="cuMemMap")
    assert got["malloc"].startswith(
        "DriverError: gmlake: driver call map failed: cuMemMap: CUDA_ERROR_INVALID_VALUE: invalid argument (code ")
    assert got["device"] == ("CudaDriverError: gmlake: no CUDA device 1: cuDeviceGet: CUDA_ERROR_INVALID_DEVICE: "
                             "invalid device ordinal")
    assert set(got["leaks"].values()) == {0}, "the failed malloc left chunks or reservations behind"
    got = run_gmlake("print(json.dumps(error_of(lambda: gmlake.cuda_driver(0))))",
                     GMLAKE_LIBCUDA=fake_libcuda, FAKE_CUDA_FAIL="cuInit")
    assert got == ("CudaDriverError: gmlake: cannot initialise the CUDA driver: cuInit: CUDA_ERROR_INVALID_VALUE: "
                   "invalid argument")


def _libcuda_here() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_a_machine_without_a_driver_gets_one_clear_line():
    named = run_gmlake("print(json.dumps(error_of(lambda: gmlake.cuda_driver(0))))",
                       GMLAKE_LIBCUDA="/nonexistent/libcuda.so.1")
    assert named.startswith("CudaDriverError: gmlake: no CUDA driver (/nonexistent/libcuda.so.1) found: ")
    assert "\n" not in named
    if _libcuda_here():
        return                                   # a GPU machine: the default search finds the real driver
    default = run_gmlake("print(json.dumps({'error': error_of(lambda: gmlake.cuda_driver(0)), "
                         "'available': gmlake.cuda_available()}))")
    assert default["error"].startswith("CudaDriverError: gmlake: no CUDA driver (libcuda.so.1) found: ")
    assert "\n" not in default["error"] and default["available"] is False
