"""What the torch shim's shareIpcHandle asks of the bridge and the drivers, on a CPU (Note [Sharing a tensor through
PyTorch's handle] in gmlake/torch/_torch_bridge.pyx, Note [One descriptor per shared chunk] in
gmlake/drivers/_cuda_driver.pyx): the pages under a block, one descriptor per chunk kept while it lives and closed
with it, and one clear error, in the sender, where the block's pages differ in size. Each case runs in its own
process (the bridge's allocators are per process). The GPU run through torch.multiprocessing:
tests/test_torch_ipc_gpu.py."""
from __future__ import annotations

from test_cuda_build import fake_libcuda, run_gmlake  # noqa: F401 - the fixture, shared

BRIDGE = """
import errno
from gmlake.drivers import HostDriver
from gmlake.torch import _torch_bridge
drv = HostDriver()
def factory(device):
    return Allocator(drv, gmlake.policies.get(os.environ["POLICY"]))
_torch_bridge.configure(factory)
alloc = _torch_bridge.allocator(0)
def error_of(call):
    try:
        call()
    except RuntimeError as exc:
        return str(exc)
"""


def test_the_pages_of_a_block_are_its_units_with_the_drivers_descriptors():
    """A plain block and a stitched one: the descriptors are the units' own (the host driver's memfds), in the order
    share_units gives them, the same on every call; the block's offset and the page size as share_units says."""
    got = run_gmlake(BRIDGE + """
parts = [alloc.malloc(8 << 20) for _ in range(3)]
guard = alloc.malloc(3 << 20)
plain = _torch_bridge.share_ipc(parts[0])
for p in parts:
    alloc.free(p)
big = alloc.malloc(24 << 20)
stitched = _torch_bridge.share_ipc(big)
offset, _, units = alloc.share_units(big)
print(json.dumps({"plain": plain, "stitched": stitched, "units": [[h, n] for h, n in units], "offset": offset,
                  "again": _torch_bridge.share_ipc(big) == stitched, "stitches": alloc.stats()["stitches"]}))
""", POLICY="gmlake-paper")
    assert got["plain"][0] == 0 and got["plain"][1] == 2 << 20 and len(got["plain"][2]) == 4
    assert got["stitches"] == 1
    assert got["stitched"] == [got["offset"], 2 << 20, [h for h, _ in got["units"]]]
    assert len(got["stitched"][2]) == 12 and got["again"]


def test_a_block_on_pages_of_two_sizes_is_refused_in_one_line_naming_the_knob():
    got = run_gmlake(BRIDGE + """
p = alloc.malloc(21 << 20)
sizes = sorted({n for _, n in alloc.share_units(p)[2]})
print(json.dumps({"sizes": sizes, "error": error_of(lambda: _torch_bridge.share_ipc(p)),
                  "elsewhere": error_of(lambda: _torch_bridge.share_ipc(p + 4096))}))
""", POLICY="gmlake[tail_page=2MiB]")
    assert got["sizes"] == [2 << 20, 20 << 20]
    error = got["error"]
    assert error.startswith("gmlake: cannot share the CUDA tensor at 0x") and "\n" not in error
    assert "pages of 2 sizes (2.00 MiB, 20.00 MiB)" in error and "tail_page" in error, error
    assert got["elsewhere"].startswith("gmlake: cannot share 0x") and "no allocation of gmlake's starts there" in \
        got["elsewhere"]


def test_the_cuda_driver_keeps_one_descriptor_per_shared_chunk_until_its_release(fake_libcuda):  # noqa: F811
    """Exportable by default (GMLAKE_IPC unset); shared() exports once and answers the same descriptor after;
    release closes it; GMLAKE_IPC=0 makes plain chunks, which refuse."""
    got = run_gmlake("""
        from gmlake.drivers._cuda_driver import CudaDriver
        drv = CudaDriver(0)
        h = drv.create(2 << 20)
        fd = drv.shared(h)
        same = drv.shared(h) == fd
        count = drv.shared_count()
        os.fstat(fd)
        drv.release(h, 2 << 20)
        try:
            os.fstat(fd)
            closed = False
        except OSError:
            closed = True
        os.environ["GMLAKE_IPC"] = "0"
        plain = CudaDriver(0)
        h = plain.create(2 << 20)
        try:
            plain.shared(h)
            refused = ""
        except RuntimeError as exc:
            refused = str(exc)
        plain.release(h, 2 << 20)
        print(json.dumps({"default": drv.exportable, "same": same, "count": count, "after": drv.shared_count(),
                          "closed": closed, "off": plain.exportable, "refused": refused}))
    """, GMLAKE_LIBCUDA=fake_libcuda)
    assert got["default"] is True and got["same"] and got["count"] == 1
    assert got["closed"] and got["after"] == 0
    assert got["off"] is False and got["refused"].startswith("gmlake: cannot export chunk ")
