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


@pytest.mark.parametrize("release_first", [False, True], ids=["held", "released-before-the-receiver-maps"])
def test_an_exported_chunk_is_read_and_written_by_another_process(release_first):
    cu = _helper()
    drv = gmlake.cuda_driver(0, exportable=True)
    assert drv.exportable
    handle = drv.create(SIZE)
    ptr = cu.map_range(handle, SIZE)
    cu.write(ptr, b"from-parent")
    fd = drv.export(handle)
    if release_first:
        # The sender's handle goes; its mapping and the descriptor keep the pages, which the receiver still imports.
        drv.release(handle, SIZE)
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), str(fd), str(SIZE)], pass_fds=(fd,), capture_output=True,
                              text=True, timeout=120, check=False)
    finally:
        os.close(fd)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
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
