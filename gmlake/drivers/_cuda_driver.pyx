# cython: language_level=3, annotation_typing=False
"""The CUDA driver: physical chunks are cuMemCreate handles, mapped into cuMemAddressReserve ranges (CUDA VMM).

No CUDA headers, cuda-bindings or libcuda are needed to build or import this module. The first CudaDriver loads
libcuda.so.1 with dlopen, checks the driver's version, and resolves every entry point it calls with
cuGetProcAddress for one CUDA version (12000 unless GMLAKE_CUDA_API_VERSION says otherwise), into the typed
function pointers of _cuda_api.pxd. The VMM API has kept its ABI since CUDA 10.2, so one build serves CUDA 12 and 13
drivers alike.

Error codes other than DRIVER_OOM are CUDA_BASE + CUresult * CALL_SLOTS + the CudaCall that failed, so that
describe_error() can name the call as well as the result.
"""
import os

from libc.stdint cimport uint64_t, int64_t, uintptr_t
from libc.string cimport memset
from libcpp.unordered_map cimport unordered_map
from cython.operator cimport dereference as deref
from posix.unistd cimport close
from posix.dlfcn cimport dlopen, dlsym, dlclose, dlerror, RTLD_NOW, RTLD_LOCAL
from gmlake.drivers._cuda_api cimport *
from gmlake.core._driver cimport Driver, DRIVER_OK, DRIVER_OOM, EVENT_DONE, EVENT_PENDING
from gmlake.core._clock cimport monotonic_ns

# The CUDA versions whose entry points _cuda_api.pxd declares (see there); the first is the default.
SUPPORTED_API_VERSIONS = (12000, 13000)
# The oldest driver gmlake runs on: one that supports CUDA 12.0 (every one exports cuGetProcAddress_v2).
MIN_DRIVER_VERSION = 12000
# Where the driver library is looked for, in order; GMLAKE_LIBCUDA (a test/debug knob) names another.
LIBRARY_NAMES = ("libcuda.so.1", "libcuda.so")
# Note [Exporting a chunk]: another process reaches a chunk's physical pages through a POSIX file descriptor that
# Driver.export_chunk makes (the host driver duplicates the chunk's memfd; the CUDA driver calls
# cuMemExportToShareableHandle, which works only for chunks created with requestedHandleTypes = POSIX file
# descriptor). The receiver imports it (cuMemImportFromShareableHandle, or mmap on the host) and maps it into a range
# of its own; the pages then live while any process holds a handle or mapping of them, so a sender that releases
# its chunk, or a receiver that dies, leaves the other's view intact (tests/test_ipc_export.py holds this over real
# processes on the host driver). What the pages live for is not what the allocator may reuse them for: a block a
# receiver still reads must not be handed to another tensor by the sender, which is the job of the layer that
# shares it (PyTorch's Note [Sharing CUDA tensors] keeps the sender's storage, hence its block, alive while a
# receiver's count is held). PyTorch noted slower cuMemCreate for exportable handles on older drivers, so whether
# chunks are exportable is a setting: GMLAKE_IPC=1 or 0, else EXPORTABLE_DEFAULT. The default follows the price:
# exportable only if a handle's whole life (creating, mapping, setting access to, unmapping and releasing a chunk
# created with the POSIX handle type but never exported) and an allocator's grow-and-release step each cost no more
# than plain ones on the GPU, within the threshold bench/report_docs/benchmarks.py's `decide` applies to
# `python -m bench ipc-price`'s newest record (bench/tests/test_ipc_price.py holds this default against it; docs/benchmarks.md, "Sharing CUDA
# tensors: exportable chunks", shows the figures). An exported chunk costs more per call, and the export itself, but
# only shared chunks pay that. Replay prices exportable chunks with the cost table's per_handle_exportable_extra
# (SimDriver.exportable). So chunks are exportable by default, and GMLAKE_IPC=0 turns it off.
EXPORTABLE_DEFAULT = True

# Note [One descriptor per shared chunk]: PyTorch's expandable-segment handle (the format gmlake's torch shim writes,
# gmlake/torch/_torch_allocator_shim.cc) carries the sender's pid and the numbers of its descriptors, not the
# descriptors themselves: the receiver takes each one from the sender with pidfd_getfd when it opens the handle,
# which may be long after the handle was made. So the sender keeps one descriptor per shared chunk open for as long as
# the chunk lives: Driver.shared_fd exports it on the first share and answers the same one after (a chunk shared
# again costs nothing, and a handle made twice for one block is the same bytes, which PyTorch's receiver caches by),
# and release_chunk closes it. A receiver that already imported keeps the pages (Note [Exporting a chunk]).

cdef extern from "<mutex>" namespace "std" nogil:
    cppclass _Mutex "std::mutex":
        void lock()
        void unlock()

cdef enum:
    CUDA_BASE = 10000
    CALL_SLOTS = 64

# Every driver call, numbered for the error codes; _CALL_NAMES holds their names in the same order.
cdef enum CudaCall:
    CALL_INIT
    CALL_DEVICE_GET
    CALL_PRIMARY_CTX_RETAIN
    CALL_GRANULARITY
    CALL_MEM_GET_INFO
    CALL_MEM_CREATE
    CALL_MEM_RELEASE
    CALL_ADDRESS_RESERVE
    CALL_ADDRESS_FREE
    CALL_MEM_MAP
    CALL_MEM_UNMAP
    CALL_MEM_SET_ACCESS
    CALL_CTX_SYNCHRONIZE
    CALL_EVENT_CREATE
    CALL_EVENT_RECORD
    CALL_EVENT_QUERY
    CALL_EVENT_DESTROY
    CALL_STREAM_WAIT_EVENT
    CALL_STREAM_IS_CAPTURING
    CALL_EXCHANGE_CAPTURE_MODE
    CALL_MEMCPY_DTOH
    CALL_MEMCPY_HTOD
    CALL_MEM_EXPORT

_CALL_NAMES = (
    "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuMemGetAllocationGranularity", "cuMemGetInfo",
    "cuMemCreate", "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree", "cuMemMap", "cuMemUnmap",
    "cuMemSetAccess", "cuCtxSynchronize", "cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventDestroy",
    "cuStreamWaitEvent", "cuStreamIsCapturing", "cuThreadExchangeStreamCaptureMode", "cuMemcpyDtoH", "cuMemcpyHtoD",
    "cuMemExportToShareableHandle",
)


cdef inline int _code(CUresult rc, CudaCall call) noexcept nogil:
    """The one funnel every driver call's result goes through on the nogil path."""
    if rc == CUDA_SUCCESS:
        return DRIVER_OK
    if rc == CUDA_ERROR_OUT_OF_MEMORY:
        return DRIVER_OOM
    return CUDA_BASE + <int>rc * CALL_SLOTS + <int>call


class CudaDriverError(RuntimeError):
    """The CUDA driver could not be used (no driver, too old a driver, no device, or a failed call at start-up)."""


# The resolved entry points, shared by every CudaDriver of the process. Written once, under the GIL, before the first
# CudaDriver exists (api.version is 0 until then); only read afterwards, so the nogil paths need no lock.
cdef CudaApi api
cdef int _driver_version = 0


def version_text(int version) -> str:
    """12080 -> '12.8', the way CUDA writes its versions."""
    return f"{version // 1000}.{version % 1000 // 10}"


def requested_api_version() -> int:
    """The CUDA version to resolve entry points for: GMLAKE_CUDA_API_VERSION (a test/debug knob) or 12000."""
    text = os.environ.get("GMLAKE_CUDA_API_VERSION", "").strip()
    if not text:
        return SUPPORTED_API_VERSIONS[0]
    if text.isdigit() and int(text) in SUPPORTED_API_VERSIONS:
        return int(text)
    raise CudaDriverError(
        f"gmlake: GMLAKE_CUDA_API_VERSION must be one of {', '.join(map(str, SUPPORTED_API_VERSIONS))} "
        f"(the CUDA versions whose entry points gmlake declares), not {text!r}")


def exportable_requested() -> bool:
    """Whether chunks are created exportable: GMLAKE_IPC=1 or 0, else EXPORTABLE_DEFAULT (Note [Exporting a chunk])."""
    text = os.environ.get("GMLAKE_IPC", "").strip()
    if not text:
        return EXPORTABLE_DEFAULT
    if text in ("0", "1"):
        return text == "1"
    raise CudaDriverError(f"gmlake: GMLAKE_IPC must be 0 or 1 (share CUDA tensors between processes), not {text!r}")


def check_versions(int driver_version, int api_version) -> None:
    """Raise CudaDriverError unless a driver of `driver_version` serves gmlake's entry points for `api_version`."""
    if driver_version < MIN_DRIVER_VERSION:
        raise CudaDriverError(
            f"gmlake: the CUDA driver supports CUDA {version_text(driver_version)}, but gmlake needs CUDA "
            f"{version_text(MIN_DRIVER_VERSION)} or newer: update the NVIDIA driver")
    if api_version > driver_version:
        raise CudaDriverError(
            f"gmlake: GMLAKE_CUDA_API_VERSION={api_version} asks for CUDA {version_text(api_version)} entry points, "
            f"but the CUDA driver supports only CUDA {version_text(driver_version)}")


cdef void* _open_library() except NULL:
    cdef void* library
    explicit = os.environ.get("GMLAKE_LIBCUDA", "")
    names = (explicit,) if explicit else LIBRARY_NAMES
    first_error = None
    for name in names:
        library = dlopen(name.encode(), RTLD_NOW | RTLD_LOCAL)
        if library != NULL:
            return library
        reason = dlerror()
        if first_error is None:
            first_error = reason.decode(errors="replace") if reason != NULL else "dlopen failed"
    raise CudaDriverError(f"gmlake: no CUDA driver ({names[0]}) found: {first_error}")


cdef int _resolve(PFN_cuGetProcAddress_v12000 get_proc, const char* name, void** slot, int api_version) except -1:
    """Point `slot` at the driver's `name` as CUDA `api_version` defines it."""
    cdef int status = -1
    cdef CUresult rc = get_proc(name, slot, api_version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)
    if rc == CUDA_SUCCESS and slot[0] != NULL:
        return 0
    slot[0] = NULL
    why = {
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: "the driver has no such entry point",
        CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: "the driver's is newer than that version",
    }.get(status, f"cuGetProcAddress returned CUresult {rc}")
    raise CudaDriverError(
        f"gmlake: cannot resolve {name.decode()} for CUDA {version_text(api_version)}: {why}")


cdef int _load_api() except -1:
    """Load libcuda and fill `api` once per process; raise CudaDriverError, leaving `api` empty, if it cannot."""
    global api, _driver_version
    if api.version != 0:
        return 0
    cdef int requested = requested_api_version()
    cdef void* library = _open_library()
    cdef PFN_cuDriverGetVersion get_version
    cdef PFN_cuGetProcAddress_v12000 get_proc
    cdef int driver_version = 0
    cdef CudaApi resolved
    memset(&resolved, 0, sizeof(resolved))
    try:
        # Both are plain exports of libcuda. cuDriverGetVersion first, so that too old a driver gets a clear error
        # rather than a missing cuGetProcAddress_v2 (new in CUDA 12.0).
        get_version = <PFN_cuDriverGetVersion>dlsym(library, "cuDriverGetVersion")
        if get_version == NULL:
            raise CudaDriverError("gmlake: the CUDA driver library has no cuDriverGetVersion")
        if get_version(&driver_version) != CUDA_SUCCESS:
            raise CudaDriverError("gmlake: cuDriverGetVersion failed")
        check_versions(driver_version, requested)
        get_proc = <PFN_cuGetProcAddress_v12000>dlsym(library, "cuGetProcAddress_v2")
        if get_proc == NULL:
            raise CudaDriverError(
                f"gmlake: the CUDA driver (CUDA {version_text(driver_version)}) has no cuGetProcAddress_v2")
        _resolve(get_proc, "cuInit", <void**>&resolved.cuInit, requested)
        _resolve(get_proc, "cuDeviceGet", <void**>&resolved.cuDeviceGet, requested)
        _resolve(get_proc, "cuDevicePrimaryCtxRetain", <void**>&resolved.cuDevicePrimaryCtxRetain, requested)
        _resolve(get_proc, "cuDevicePrimaryCtxRelease", <void**>&resolved.cuDevicePrimaryCtxRelease, requested)
        _resolve(get_proc, "cuCtxGetCurrent", <void**>&resolved.cuCtxGetCurrent, requested)
        _resolve(get_proc, "cuCtxPushCurrent", <void**>&resolved.cuCtxPushCurrent, requested)
        _resolve(get_proc, "cuCtxPopCurrent", <void**>&resolved.cuCtxPopCurrent, requested)
        # The one entry point whose signature changed between the versions gmlake requests (see _cuda_api.pxd).
        if requested >= 13000:
            _resolve(get_proc, "cuCtxSynchronize", <void**>&resolved.cuCtxSynchronize_v13000, requested)
        else:
            _resolve(get_proc, "cuCtxSynchronize", <void**>&resolved.cuCtxSynchronize_v2000, requested)
        _resolve(get_proc, "cuMemCreate", <void**>&resolved.cuMemCreate, requested)
        _resolve(get_proc, "cuMemRelease", <void**>&resolved.cuMemRelease, requested)
        _resolve(get_proc, "cuMemExportToShareableHandle", <void**>&resolved.cuMemExportToShareableHandle,
                 requested)
        _resolve(get_proc, "cuMemAddressReserve", <void**>&resolved.cuMemAddressReserve, requested)
        _resolve(get_proc, "cuMemAddressFree", <void**>&resolved.cuMemAddressFree, requested)
        _resolve(get_proc, "cuMemMap", <void**>&resolved.cuMemMap, requested)
        _resolve(get_proc, "cuMemUnmap", <void**>&resolved.cuMemUnmap, requested)
        _resolve(get_proc, "cuMemSetAccess", <void**>&resolved.cuMemSetAccess, requested)
        _resolve(get_proc, "cuMemGetAllocationGranularity", <void**>&resolved.cuMemGetAllocationGranularity,
                 requested)
        _resolve(get_proc, "cuMemGetInfo", <void**>&resolved.cuMemGetInfo, requested)
        _resolve(get_proc, "cuEventCreate", <void**>&resolved.cuEventCreate, requested)
        _resolve(get_proc, "cuEventRecord", <void**>&resolved.cuEventRecord, requested)
        _resolve(get_proc, "cuEventQuery", <void**>&resolved.cuEventQuery, requested)
        _resolve(get_proc, "cuEventDestroy", <void**>&resolved.cuEventDestroy, requested)
        _resolve(get_proc, "cuStreamWaitEvent", <void**>&resolved.cuStreamWaitEvent, requested)
        _resolve(get_proc, "cuStreamIsCapturing", <void**>&resolved.cuStreamIsCapturing, requested)
        _resolve(get_proc, "cuThreadExchangeStreamCaptureMode", <void**>&resolved.cuThreadExchangeStreamCaptureMode,
                 requested)
        _resolve(get_proc, "cuMemcpyDtoH", <void**>&resolved.cuMemcpyDtoH, requested)
        _resolve(get_proc, "cuMemcpyHtoD", <void**>&resolved.cuMemcpyHtoD, requested)
        _resolve(get_proc, "cuGetErrorName", <void**>&resolved.cuGetErrorName, requested)
        _resolve(get_proc, "cuGetErrorString", <void**>&resolved.cuGetErrorString, requested)
    except BaseException:
        dlclose(library)
        raise
    # The library stays open for good: the pointers point into it.
    resolved.version = requested
    _driver_version = driver_version
    api = resolved
    return 0


cdef class CudaDriver(Driver):
    """CudaDriver(device=0, exportable=None)
--

    CUDA virtual memory management on one device, through driver entry points resolved at run time (nogil).
    `exportable`: create chunks another process can map (Note [Exporting a chunk]); None reads GMLAKE_IPC."""
    cdef readonly int device
    cdef readonly bint exportable
    # The CUDA version the driver supports (cuDriverGetVersion, e.g. 13000) and the one whose entry points are used.
    cdef readonly int driver_version
    cdef readonly int api_version
    cdef CUdevice cu_device
    cdef CUcontext context
    cdef CUmemAllocationProp prop
    cdef CUmemAccessDesc access
    # Note [One descriptor per shared chunk]: chunk -> the descriptor kept for it, under shared_lock.
    cdef unordered_map[uint64_t, int] shared_fds
    cdef _Mutex shared_lock

    def __init__(self, device: int = 0, exportable=None):
        cdef size_t granularity = 0
        cdef size_t free_bytes = 0, total_bytes = 0
        cdef CUresult rc
        cdef bint pushed
        cdef double started
        _load_api()
        self.driver_version = _driver_version
        self.api_version = api.version
        _check(api.cuInit(0), CALL_INIT, "cannot initialise the CUDA driver")
        _check(api.cuDeviceGet(&self.cu_device, device), CALL_DEVICE_GET, f"no CUDA device {device}")
        self.device = device
        _check(api.cuDevicePrimaryCtxRetain(&self.context, self.cu_device), CALL_PRIMARY_CTX_RETAIN,
               f"cannot retain the primary context of device {device}")
        memset(&self.prop, 0, sizeof(self.prop))
        self.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = device
        self.exportable = exportable_requested() if exportable is None else bool(exportable)
        if self.exportable:
            self.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        memset(&self.access, 0, sizeof(self.access))
        self.access.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        self.access.location.id = device
        self.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _check(api.cuMemGetAllocationGranularity(&granularity, &self.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               CALL_GRANULARITY, "cannot read the VMM allocation granularity")
        self.granularity = granularity
        pushed = self._enter(&started)
        rc = api.cuMemGetInfo(&free_bytes, &total_bytes)
        self._leave(pushed, started)
        self.busy_ns = 0                # the allocator's calls, not the driver's start
        if rc == CUDA_SUCCESS:
            self.capacity = total_bytes

    def __dealloc__(self):
        for entry in self.shared_fds:
            close(entry.second)
        if self.context != NULL:
            api.cuDevicePrimaryCtxRelease(self.cu_device)

    cdef inline bint _enter(self, double* started) noexcept nogil:
        """Make our device's primary context current for one call; True if it had to be pushed (then _leave pops
        it). A thread's own current context, such as the one torch set for another device, is left as it was.
        Starts the call's clock: _leave adds the call's time, context switch included, to busy_ns."""
        cdef CUcontext current = NULL
        started[0] = monotonic_ns()
        api.cuCtxGetCurrent(&current)
        if current == self.context:
            return False
        api.cuCtxPushCurrent(self.context)
        return True

    cdef inline void _leave(self, bint pushed, double started) noexcept nogil:
        cdef CUcontext popped = NULL
        if pushed:
            api.cuCtxPopCurrent(&popped)
        # Not atomic: allocators sharing this driver on several threads may lose an addition (a statistic only).
        self.busy_ns += monotonic_ns() - started

    cdef int create_chunk(self, size_t size, uint64_t* handle) noexcept nogil:
        cdef CUmemGenericAllocationHandle h = 0
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemCreate(&h, size, &self.prop, 0), CALL_MEM_CREATE)
        self._leave(pushed, started)
        if rc == DRIVER_OK:
            handle[0] = <uint64_t>h
            self.live_chunks += 1
            self.live_chunk_bytes += size
        return rc

    cdef int release_chunk(self, uint64_t handle, size_t size) noexcept nogil:
        cdef double started
        self._forget_shared(handle)
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemRelease(<CUmemGenericAllocationHandle>handle), CALL_MEM_RELEASE)
        self._leave(pushed, started)
        if rc == DRIVER_OK:
            self.live_chunks -= 1
            self.live_chunk_bytes -= size
        return rc

    cdef int export_chunk(self, uint64_t handle, int* fd) noexcept nogil:
        # A chunk created without the POSIX handle type cannot be exported: the driver answers
        # CUDA_ERROR_INVALID_VALUE (or NOT_SUPPORTED), which describe_error names.
        cdef int shared = -1
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemExportToShareableHandle(&shared, <CUmemGenericAllocationHandle>handle,
                                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                            CALL_MEM_EXPORT)
        self._leave(pushed, started)
        if rc == DRIVER_OK:
            fd[0] = shared
        return rc

    cdef int shared_fd(self, uint64_t handle, int* fd) noexcept nogil:
        cdef int rc = DRIVER_OK
        self.shared_lock.lock()
        it = self.shared_fds.find(handle)
        if it != self.shared_fds.end():
            fd[0] = deref(it).second
        else:
            rc = self.export_chunk(handle, fd)
            if rc == DRIVER_OK:
                self.shared_fds[handle] = fd[0]
        self.shared_lock.unlock()
        return rc

    cdef void _forget_shared(self, uint64_t handle) noexcept nogil:
        self.shared_lock.lock()
        it = self.shared_fds.find(handle)
        if it != self.shared_fds.end():
            close(deref(it).second)
            self.shared_fds.erase(it)
        self.shared_lock.unlock()

    def shared_count(self) -> int:
        """How many chunks have a descriptor kept for other processes now (Note [One descriptor per shared chunk])."""
        return self.shared_fds.size()

    cdef int reserve(self, size_t size, size_t alignment, uintptr_t* va) noexcept nogil:
        cdef CUdeviceptr ptr = 0
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemAddressReserve(&ptr, size, alignment, 0, 0), CALL_ADDRESS_RESERVE)
        self._leave(pushed, started)
        if rc == DRIVER_OK:
            va[0] = <uintptr_t>ptr
            self.count_reservation(size, 1)
        return rc

    cdef int free_va(self, uintptr_t va, size_t size) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemAddressFree(<CUdeviceptr>va, size), CALL_ADDRESS_FREE)
        self._leave(pushed, started)
        if rc == DRIVER_OK:
            self.count_reservation(size, -1)
        return rc

    cdef int map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemMap(<CUdeviceptr>va, size, 0, <CUmemGenericAllocationHandle>handle, 0),
                            CALL_MEM_MAP)
        self._leave(pushed, started)
        return rc

    cdef int unmap(self, uintptr_t va, size_t size) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemUnmap(<CUdeviceptr>va, size), CALL_MEM_UNMAP)
        self._leave(pushed, started)
        return rc

    cdef int set_access(self, uintptr_t va, size_t size) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemSetAccess(<CUdeviceptr>va, size, &self.access, 1), CALL_MEM_SET_ACCESS)
        self._leave(pushed, started)
        return rc

    cdef int copy_out(self, void* host, uintptr_t va, size_t size) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemcpyDtoH(host, <CUdeviceptr>va, size), CALL_MEMCPY_DTOH)
        self._leave(pushed, started)
        return rc

    cdef int copy_in(self, uintptr_t va, const void* host, size_t size) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemcpyHtoD(<CUdeviceptr>va, host, size), CALL_MEMCPY_HTOD)
        self._leave(pushed, started)
        return rc

    cdef int synchronize(self) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef CUresult result
        if api.cuCtxSynchronize_v13000 != NULL:
            result = api.cuCtxSynchronize_v13000(self.context)
        else:
            result = api.cuCtxSynchronize_v2000()
        self._leave(pushed, started)
        return _code(result, CALL_CTX_SYNCHRONIZE)

    cdef int stream_capturing(self, int64_t stream, bint* capturing) noexcept nogil:
        # Under our context like every other call: without a current one the driver answers CUDA_ERROR_INVALID_CONTEXT,
        # which the allocator must read as a capture (Note [Unannounced capture]).
        cdef int status = CU_STREAM_CAPTURE_STATUS_NONE
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuStreamIsCapturing(<CUstream><uintptr_t>stream, &status), CALL_STREAM_IS_CAPTURING)
        self._leave(pushed, started)
        capturing[0] = status != CU_STREAM_CAPTURE_STATUS_NONE      # active, or invalidated: either way a capture
        return rc

    cdef int exchange_capture_mode(self, int* mode) noexcept nogil:
        return _code(api.cuThreadExchangeStreamCaptureMode(mode), CALL_EXCHANGE_CAPTURE_MODE)

    cdef int record_event(self, int64_t stream, uint64_t* event) noexcept nogil:
        cdef CUevent ev = <CUevent><uintptr_t>event[0]
        cdef bint created = ev == NULL
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = DRIVER_OK
        if created:
            rc = _code(api.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CALL_EVENT_CREATE)
        if rc == DRIVER_OK:
            rc = _code(api.cuEventRecord(ev, <CUstream><uintptr_t>stream), CALL_EVENT_RECORD)
            if rc != DRIVER_OK and created:
                api.cuEventDestroy(ev)
        self._leave(pushed, started)
        if rc != DRIVER_OK:
            return rc
        if created:
            event[0] = <uint64_t><uintptr_t>ev
            self.live_events += 1
            self.created_events += 1
        return DRIVER_OK

    cdef int query_event(self, uint64_t event) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef CUresult rc = api.cuEventQuery(<CUevent><uintptr_t>event)
        self._leave(pushed, started)
        if rc == CUDA_SUCCESS:
            return EVENT_DONE
        if rc == CUDA_ERROR_NOT_READY:
            return EVENT_PENDING
        return _code(rc, CALL_EVENT_QUERY)

    cdef int destroy_event(self, uint64_t event) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuEventDestroy(<CUevent><uintptr_t>event), CALL_EVENT_DESTROY)
        self._leave(pushed, started)
        if rc == DRIVER_OK:
            self.live_events -= 1
        return rc

    cdef int wait_event(self, int64_t stream, uint64_t event) noexcept nogil:
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuStreamWaitEvent(<CUstream><uintptr_t>stream, <CUevent><uintptr_t>event, 0),
                            CALL_STREAM_WAIT_EVENT)
        self._leave(pushed, started)
        return rc

    cdef int device_free(self, size_t* free) noexcept nogil:
        cdef size_t total_bytes = 0
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef int rc = _code(api.cuMemGetInfo(free, &total_bytes), CALL_MEM_GET_INFO)
        self._leave(pushed, started)
        return rc

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, from cuMemGetInfo."""
        cdef size_t free_bytes = 0, total_bytes = 0
        cdef double started
        cdef bint pushed = self._enter(&started)
        cdef CUresult rc = api.cuMemGetInfo(&free_bytes, &total_bytes)
        self._leave(pushed, started)
        _check(rc, CALL_MEM_GET_INFO, "cannot read the device's free memory")
        return free_bytes, total_bytes

    def describe_error(self, int code) -> str:
        """'cuMemMap: CUDA_ERROR_INVALID_VALUE: invalid argument' for an error code this driver returned."""
        if code >= CUDA_BASE:
            result, call = divmod(code - CUDA_BASE, CALL_SLOTS)
            name = _CALL_NAMES[call] if call < len(_CALL_NAMES) else "a CUDA call"
            return f"{name}: {_result_name(result)}"
        return Driver.describe_error(self, code)


cdef int _check(CUresult rc, CudaCall call, str what) except -1:
    """The funnel for calls made with the GIL: raise CudaDriverError naming `what` failed, the call and its result."""
    if rc == CUDA_SUCCESS:
        return 0
    raise CudaDriverError(f"gmlake: {what}: {_CALL_NAMES[<int>call]}: {_result_name(rc)}")


cdef str _result_name(CUresult rc):
    cdef const char* name = NULL
    cdef const char* text = NULL
    if api.cuGetErrorName != NULL:
        api.cuGetErrorName(rc, &name)
        api.cuGetErrorString(rc, &text)
    if name == NULL:
        return f"CUresult {<int>rc}"
    return f"{name.decode()}: {text.decode() if text != NULL else ''}"
