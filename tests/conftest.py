from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import gmlake

MiB = 1 << 20

# A run started in the background of a shell without job control (nohup, `cmd &` in a script) inherits SIGINT
# ignored; Python then never raises KeyboardInterrupt, and neither do the programs the tests start. The tests of
# Ctrl-C need it as a terminal delivers it, so the default handler comes back here (caught, not ignored, so child
# processes start with the default too).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@functools.lru_cache(maxsize=1)
def _cuda_ok() -> bool:
    return gmlake.cuda_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="no CUDA device here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["sim", "host"])
def driver(request):
    """A fresh modelled driver of each kind (2 MiB granularity, like an H200)."""
    return gmlake.SimDriver() if request.param == "sim" else gmlake.HostDriver()


def fragment(alloc: gmlake.Allocator, sizes_mib: list[int], stream: int = 0) -> list[int]:
    """Leave free blocks of `sizes_mib` MiB, each in its own segment, separated by live 2 MiB guards (returned)."""
    parts, guards = [], []
    for size in sizes_mib:
        parts.append(alloc.malloc(size * MiB, stream))
        guards.append(alloc.malloc(2 * MiB, stream))
    for p in parts:
        alloc.free(p)
    return guards


def snapshot(alloc: gmlake.Allocator) -> tuple:
    """Everything observable about an allocator's state, for 'nothing changed' checks."""
    return alloc.stats(), alloc.segments_info()


def one_line_exit_2(cmd: list[str]) -> str:
    """Run `python CMD...` from the repository root and check it refused its input as every command here must: one
    line on stderr, nothing on stdout, exit status 2. Returns that line."""
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, check=False, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout, proc.stderr
    return proc.stderr
