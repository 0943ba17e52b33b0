"""Note [Exporting a chunk]: a driver's chunk handed to another process as a file descriptor, over real processes.

The host driver's chunk is a memfd, so the rules CUDA IPC needs are checked on bytes: the receiver maps the same
pages (a write either side is seen by the other), and the pages outlive the sender's release while the receiver
still maps them, or a receiver that was killed while mapping them. The CUDA driver's export goes through the
stand-in libcuda (tests/fake_libcuda.c): only chunks created exportable export.
"""
import mmap
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from test_cuda_build import fake_libcuda, run_gmlake  # noqa: F401 - the fixture, shared

import gmlake
from gmlake import HostDriver

MiB = 1 << 20
CHUNK = 2 * MiB

# The receiver: maps the descriptor it inherited (its number in argv), checks the sender's bytes, writes its own, says so on
# stdout, then waits for a line on stdin before reading the pages again and exiting.
RECEIVER = textwrap.dedent("""
    import mmap, sys
    fd, size = int(sys.argv[1]), int(sys.argv[2])
    view = mmap.mmap(fd, size)
    seen = view[:4]
    view[4:8] = b"back"
    print(seen.decode(), flush=True)
    sys.stdin.readline()
    print(view[:8].decode(), flush=True)
""")


def _receiver(fd: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RECEIVER, str(fd), str(CHUNK)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, pass_fds=(fd,))


def _write(drv: HostDriver, handle: int, data: bytes) -> None:
    drv._write_physical(handle, 0, data)


def test_an_exported_chunk_is_the_same_pages_in_another_process():
    drv = HostDriver()
    handle = drv.create(CHUNK)
    _write(drv, handle, b"send")
    fd = drv.export(handle)
    assert fd != handle, "an export is a descriptor of its own, which the receiver's side closes"
    child = _receiver(fd)
    os.close(fd)
    try:
        assert child.stdout.readline().strip() == "send"
        assert drv._read_physical(handle, 0, 8) == b"sendback", "the receiver's write must land in the chunk"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "sendback"
    finally:
        child.communicate(timeout=30)
    drv.release(handle, CHUNK)
    assert drv.leaks()["chunks"] == 0


def test_the_pages_outlive_the_senders_release_while_a_receiver_maps_them():
    drv = HostDriver()
    handle = drv.create(CHUNK)
    _write(drv, handle, b"keep")
    fd = drv.export(handle)
    child = _receiver(fd)
    os.close(fd)
    try:
        assert child.stdout.readline().strip() == "keep"
        drv.release(handle, CHUNK)                    # the sender lets go of its chunk while the receiver reads
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "keepback"
    finally:
        child.communicate(timeout=30)
    assert child.returncode == 0


def test_a_killed_receiver_leaves_the_senders_pages_as_they_were():
    """A receiver killed mid-hold: its descriptor and mapping go with it; the sender's chunk is unharmed and releases
    as usual, and a fresh export still works."""
    drv = HostDriver()
    handle = drv.create(CHUNK)
    _write(drv, handle, b"held")
    fd = drv.export(handle)
    child = _receiver(fd)
    os.close(fd)
    assert child.stdout.readline().strip() == "held"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert drv._read_physical(handle, 0, 8) == b"heldback"
    again = drv.export(handle)
    with mmap.mmap(again, CHUNK) as view:
        assert view[:8] == b"heldback"
    os.close(again)
    drv.release(handle, CHUNK)
    assert drv.leaks()["chunks"] == 0


def test_the_sim_driver_exports_nothing_and_says_so():
    drv = gmlake.SimDriver()
    handle = drv.create(CHUNK)
    with pytest.raises(RuntimeError, match=r"cannot export chunk .*: SimDriver does not implement this call"):
        drv.export(handle)
    drv.release(handle, CHUNK)


def test_the_cuda_driver_exports_only_chunks_created_exportable(fake_libcuda):  # noqa: F811
    got = run_gmlake("""
        from gmlake.drivers._cuda_driver import CudaDriver
        out = {}
        for exportable in (False, True):
            drv = CudaDriver(0, exportable)
            h = drv.create(2 << 20)
            try:
                fd = drv.export(h)
                out[str(exportable)] = {"fd": fd >= 0, "exportable": drv.exportable}
                os.close(fd)
            except RuntimeError as exc:
                out[str(exportable)] = {"error": str(exc), "exportable": drv.exportable}
            drv.release(h, 2 << 20)
        out["env"] = CudaDriver(0).exportable
        print(json.dumps(out))
    """, GMLAKE_LIBCUDA=fake_libcuda, GMLAKE_IPC="1")
    assert got["True"] == {"fd": True, "exportable": True}
    assert got["False"]["exportable"] is False
    assert got["False"]["error"].startswith("gmlake: cannot export chunk 1: cuMemExportToShareableHandle: "
                                            "CUDA_ERROR_INVALID_VALUE"), got["False"]
    assert got["env"] is True, "GMLAKE_IPC=1 makes chunks exportable"


def test_a_bad_gmlake_ipc_is_one_clear_line(fake_libcuda):  # noqa: F811
    got = run_gmlake("""
        print(json.dumps({"error": error_of(lambda: gmlake.cuda_driver(0))}))
    """, GMLAKE_LIBCUDA=fake_libcuda, GMLAKE_IPC="yes")
    assert got["error"] == ("CudaDriverError: gmlake: GMLAKE_IPC must be 0 or 1 (share CUDA tensors between "
                            "processes), not 'yes'")
