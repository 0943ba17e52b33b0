"""Note [Exporting a chunk] on the GPU: an exportable chunk seen by another process through its file descriptor.

The receiver (tests/gpu_scripts/ipc_chunk.py) imports the descriptor with cuMemImportFromShareableHandle and maps it
into a range of its own; bytes go both ways, and the pages outlive the sender's release while the receiver maps
them. A chunk created without the handle type refuses to export, in the sender, in one error.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gmlake

pytestmark = pytest.mark.gpu
SCRIPT = Path(__file__).parent / "gpu_scripts" / "ipc_chunk.py"
SIZE = 2 << 20


def _helper():
    spec = importlib.util.spec_from_file_location("ipc_chunk", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.current_context()
    return module


def _receive(offset: int, units: list) -> None:
    """Run the receiver on `units` (descriptor, bytes), the block `offset` bytes in; it must print ok."""
    proc = subprocess.run([sys.executable, str(SCRIPT), str(offset), *(f"{fd}:{n}" for fd, n in units)],
                          pass_fds=[fd for fd, _ in units], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr



@pytest.mark.parametrize("release_first", [False, True], ids=["held", "released-before-the-receiver-maps"])
def test_an_exported_chunk_is_read_and_written_by_another_process(release_first):
    cu = _helper()
    drv = gmlake.cuda_driver(0, exportable=True)
    assert drv.exportable
    handle = drv.create(SIZE)
    ptr = cu.map_range([(handle, SIZE)])
    cu.write(ptr, b"from-parent")
    fd = drv.export(handle)
    if release_first:
        # The sender's handle goes; its mapping and the descriptor keep the pages, which the receiver still imports.
        drv.release(handle, SIZE)
    try:
        _receive(0, [(fd, SIZE)])
    finally:
        os.close(fd)
    assert cu.read(ptr, 21) == b"from-parentfrom-child", "the receiver's write must land in the sender's pages"
    check = cu.cuda.cuMemUnmap(cu.ctypes.c_uint64(ptr), cu.ctypes.c_size_t(SIZE))
    assert check == 0
    cu.cuda.cuMemAddressFree(cu.ctypes.c_uint64(ptr), cu.ctypes.c_size_t(SIZE))
    if not release_first:
        drv.release(handle, SIZE)


def test_a_plain_chunk_refuses_to_export_in_the_sender():
    drv = gmlake.cuda_driver(0, exportable=False)
    handle = drv.create(SIZE)
    try:
        with pytest.raises(RuntimeError, match=r"^gmlake: cannot export chunk \d+: cuMemExportToShareableHandle: "):
            drv.export(handle)
    finally:
        drv.release(handle, SIZE)


def test_a_stitched_block_is_one_range_in_the_receiver():
    """A block stitched from three segments' chunks on the GPU (Note [Sharing a block's units]): the receiver maps
    the units back to back, reads the block at its offset and writes after it; the sender reads the write."""
    cu = _helper()
    drv = gmlake.cuda_driver(0, exportable=True)
    alloc = gmlake.Allocator(drv, gmlake.policies.get("gmlake-paper"))
    parts = [alloc.malloc(8 << 20) for _ in range(3)]
    guard = alloc.malloc(3 << 20)
    for p in parts:
        alloc.free(p)
    big = alloc.malloc(24 << 20)
    assert alloc.stats()["stitches"] == 1
    cu.write(big, b"from-parent")
    offset, _, units = alloc.share_units(big)
    assert len(units) >= 3
    fds = [(drv.export(handle), n) for handle, n in units]
    try:
        _receive(offset, fds)
    finally:
        for fd, _ in fds:
            os.close(fd)
    assert cu.read(big, 21) == b"from-parentfrom-child"
    for p in (big, guard):
        alloc.free(p)
    alloc.empty_cache()
    alloc.close()
    assert set(drv.leaks().values()) == {0}
