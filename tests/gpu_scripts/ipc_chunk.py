"""A chunk's pages seen from another process (Note [Exporting a chunk]), through libcuda alone (ctypes).

`map_range([(handle, bytes), ...])` maps handles back to back into a new range of this process and returns its
address; as a script, `python ipc_chunk.py OFFSET FD:BYTES...` imports each POSIX file descriptor (inherited from
the test), maps them back to back (Note [Sharing a block's units]), checks that the block OFFSET bytes in reads
b"from-parent", writes b"from-child" after it, and prints "ok".
"""
import ctypes
import sys

cuda = ctypes.CDLL("libcuda.so.1")
HANDLE_TYPE_POSIX_FD = 1


class AccessDesc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int), ("flags", ctypes.c_int)]


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def current_context() -> None:
    """Make device 0's primary context current, as torch and gmlake's driver use it."""
    device, context = ctypes.c_int(), ctypes.c_void_p()
    check(cuda.cuInit(0), "cuInit")
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def map_range(units: list) -> int:
    size = sum(n for _, n in units)
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0),
                                   ctypes.c_uint64(0)), "cuMemAddressReserve")
    at = ptr.value
    for handle, n in units:
        check(cuda.cuMemMap(ctypes.c_uint64(at), ctypes.c_size_t(n), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                            ctypes.c_uint64(0)), "cuMemMap")
        at += n
    access = AccessDesc(1, 0, 3)            # the device, device 0, read and write
    check(cuda.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)), "cuMemSetAccess")
    return ptr.value


def write(ptr: int, data: bytes) -> None:
    check(cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), data, ctypes.c_size_t(len(data))), "cuMemcpyHtoD")


def read(ptr: int, size: int) -> bytes:
    out = ctypes.create_string_buffer(size)
    check(cuda.cuMemcpyDtoH_v2(out, ctypes.c_uint64(ptr), ctypes.c_size_t(size)), "cuMemcpyDtoH")
    return out.raw


def main(offset: int, units: list) -> None:
    current_context()
    imported = []
    for fd, n in units:
        handle = ctypes.c_uint64()
        check(cuda.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), HANDLE_TYPE_POSIX_FD),
              "cuMemImportFromShareableHandle")
        imported.append((handle.value, n))
    ptr = map_range(imported) + offset
    seen = read(ptr, 11)
    assert seen == b"from-parent", seen
    write(ptr + 11, b"from-child")
    print("ok", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), [tuple(map(int, unit.split(":"))) for unit in sys.argv[2:]])
