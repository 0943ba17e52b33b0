"""Note [Exporting a chunk]: a driver's chunk handed to another process as a file descriptor, over real processes.

The host driver's chunk is a memfd, so the rules CUDA IPC needs are checked on bytes: the receiver maps the same
pages (a write either side is seen by the other), and the pages outlive the sender's release while the receiver
still maps them, or a receiver that was killed while mapping them. The CUDA driver's export goes through the
stand-in libcuda (tests/fake_libcuda.c): only chunks created exportable export.
"""
import ctypes
import mmap
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from test_cuda_build import fake_libcuda, run_gmlake  # noqa: F401 - the fixture, shared

import gmlake
from gmlake import Allocator, HostDriver

MiB = 1 << 20
# Stitching at once, so a test gets a stitched block from three freed ones (tests/test_host_driver.py).
PAPER = gmlake.policies.get("gmlake-paper")
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


# The receiver of a block (Note [Sharing a block's units]): maps each inherited descriptor back to back into one range
# of its own (argv: the block's offset and size, then FD:BYTES per unit), checks the sender's pattern (byte i // MiB
# + 1 at each MiB's first and last byte), writes 0x5A over the block and prints "ok".
BLOCK_RECEIVER = textwrap.dedent("""
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    offset, size = int(sys.argv[1]), int(sys.argv[2])
    units = [tuple(map(int, u.split(":"))) for u in sys.argv[3:]]
    base = libc.mmap(None, sum(n for _, n in units), 0, 0x02 | 0x20, -1, 0)       # PROT_NONE, MAP_PRIVATE|ANON
    at = base
    for fd, n in units:
        assert libc.mmap(at, n, 0x3, 0x01 | 0x10, fd, 0) == at                   # RW, MAP_SHARED|MAP_FIXED
        at += n
    ptr, MiB = base + offset, 1 << 20
    seen = [(ctypes.string_at(ptr + i * MiB, 1)[0], ctypes.string_at(ptr + (i + 1) * MiB - 1, 1)[0])
            for i in range(size // MiB)]
    assert seen == [(i + 1, i + 1) for i in range(size // MiB)], seen
    ctypes.memset(ptr, 0x5A, size)
    print("ok", flush=True)
""")


def _share(drv, alloc, ptr: int) -> tuple[int, int, list]:
    """The allocation at `ptr` as the receiver maps it: offset, size, and an exported descriptor per unit."""
    offset, size, units = alloc.share_units(ptr)
    return offset, size, [(drv.export(handle), n) for handle, n in units]


def _receive(offset: int, size: int, units: list) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", BLOCK_RECEIVER, str(offset), str(size),
                               *(f"{fd}:{n}" for fd, n in units)], pass_fds=[fd for fd, _ in units],
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        for fd, _ in units:
            os.close(fd)


def _pattern(ptr: int, size: int) -> None:
    for i in range(size // MiB):
        ctypes.memset(ptr + i * MiB, i + 1, MiB)


def test_a_stitched_block_is_one_range_in_the_receiver():
    """A block stitched from three segments' chunks: the receiver maps the units in the sBlock's order and reads
    and writes the block at its offset; its write lands in the sender's primitive blocks."""
    drv = HostDriver()
    alloc = Allocator(drv, PAPER)
    parts = [alloc.malloc(4 * MiB) for _ in range(3)]
    guards = [alloc.malloc(MiB + 512) for _ in range(3)]
    for p in parts:
        alloc.free(p)
    big = alloc.malloc(12 * MiB)
    assert alloc.stats()["stitches"] == 1
    _pattern(big, 12 * MiB)
    offset, size, units = _share(drv, alloc, big)
    assert size >= 12 * MiB and len(units) >= 3 and offset + size <= sum(n for _, n in units)
    proc = _receive(offset, 12 * MiB, units)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert ctypes.string_at(big, 12 * MiB) == b"\x5a" * (12 * MiB)
    assert all(ctypes.string_at(p, 4 * MiB) == b"\x5a" * (4 * MiB) for p in parts), "the pBlocks are the same pages"
    for p in [big, *guards]:
        alloc.free(p)
    alloc.close()
    assert set(drv.leaks().values()) == {0}


def test_a_block_inside_a_unit_is_found_at_its_offset():
    """Two 3 MiB blocks split from one free 8 MiB block: the second starts 1 MiB into a 2 MiB unit that the first
    ends in. The receiver writes only the second's bytes, so the offset is right."""
    drv = HostDriver()
    alloc = Allocator(drv, PAPER)
    alloc.free(alloc.malloc(8 * MiB))
    first = alloc.malloc(3 * MiB)
    second = alloc.malloc(3 * MiB)
    assert second == first + 3 * MiB, "both are split from the one free block"
    ctypes.memset(first, 0, 3 * MiB)
    _pattern(second, 3 * MiB)
    offset, size, units = _share(drv, alloc, second)
    assert size >= 3 * MiB
    assert 0 < offset < units[0][1]
    proc = _receive(offset, 3 * MiB, units)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert ctypes.string_at(second, 3 * MiB) == b"\x5a" * (3 * MiB)
    assert ctypes.string_at(first, 3 * MiB) == b"\x00" * (3 * MiB), "the receiver wrote only the block it was given"
    with pytest.raises(ValueError, match="is not a live allocation of this allocator"):
        alloc.share_units(second + 1)
    for p in (first, second):
        alloc.free(p)
    alloc.close()
