# cython: language_level=3, annotation_typing=False
"""The CUDA driver: physical chunks are cuMemCreate handles, mapped into cuMemAddressReserve ranges (CUDA VMM).

Imported only when a CudaDriver is asked for, so `import gmlake` works on machines with no GPU or driver.
Error codes other than DRIVER_OOM are CUDA_BASE + CUresult.
"""
from libc.stdint cimport uint64_t, int64_t, uintptr_t
from libc.string cimport memset
from cuda.bindings cimport cydriver
from cuda.bindings.cydriver cimport CUresult, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_NOT_READY
from gmlake._driver cimport Driver, DRIVER_OK, DRIVER_OOM, EVENT_DONE, EVENT_PENDING

cdef enum:
    CUDA_BASE = 10000


cdef inline int _code(CUresult rc) noexcept nogil:
    if rc == CUDA_SUCCESS:
        return DRIVER_OK
    if rc == CUDA_ERROR_OUT_OF_MEMORY:
        return DRIVER_OOM
    return CUDA_BASE + <int>rc


class CudaDriverError(RuntimeError):
    """The CUDA driver could not be used (no driver, no device, or a failed call at start-up)."""


cdef class CudaDriver(Driver):
    """CUDA virtual memory management on one device, through cuda-python's cydriver (nogil)."""
    cdef readonly int device
    cdef cydriver.CUdevice cu_device
    cdef cydriver.CUcontext context
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUmemAccessDesc access

    def __init__(self, device: int = 0):
        cdef CUresult rc
        cdef size_t granularity = 0
        cdef size_t free_bytes = 0, total_bytes = 0
        cdef bint pushed
        try:
            rc = cydriver.cuInit(0)
        except Exception as exc:  # the bindings raise when libcuda cannot be loaded
            raise CudaDriverError(f"gmlake: the CUDA driver is not available: {exc}") from None
        if rc != CUDA_SUCCESS:
            raise CudaDriverError(f"gmlake: cuInit failed: {_result_name(rc)}")
        rc = cydriver.cuDeviceGet(&self.cu_device, device)
        if rc != CUDA_SUCCESS:
            raise CudaDriverError(f"gmlake: no CUDA device {device}: {_result_name(rc)}")
        self.device = device
        rc = cydriver.cuDevicePrimaryCtxRetain(&self.context, self.cu_device)
        if rc != CUDA_SUCCESS:
            raise CudaDriverError(f"gmlake: cannot retain the primary context of device {device}: {_result_name(rc)}")
        memset(&self.prop, 0, sizeof(self.prop))
        self.prop.type = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = device
        memset(&self.access, 0, sizeof(self.access))
        self.access.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
        self.access.location.id = device
        self.access.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        rc = cydriver.cuMemGetAllocationGranularity(
            &granularity, &self.prop, cydriver.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        if rc != CUDA_SUCCESS:
            raise CudaDriverError(f"gmlake: cuMemGetAllocationGranularity failed: {_result_name(rc)}")
        self.granularity = granularity
        pushed = self._enter()
        rc = cydriver.cuMemGetInfo(&free_bytes, &total_bytes)
        self._leave(pushed)
        if rc == CUDA_SUCCESS:
            self.capacity = total_bytes

    def __dealloc__(self):
        if self.context != NULL:
            cydriver.cuDevicePrimaryCtxRelease(self.cu_device)

    cdef inline bint _enter(self) noexcept nogil:
        """Make our device's primary context current for one call; True if it had to be pushed (then _leave pops
        it). A thread's own current context, such as the one torch set for another device, is left as it was."""
        cdef cydriver.CUcontext current = NULL
        cydriver.cuCtxGetCurrent(&current)
        if current == self.context:
            return False
        cydriver.cuCtxPushCurrent(self.context)
        return True

    cdef inline void _leave(self, bint pushed) noexcept nogil:
        cdef cydriver.CUcontext popped = NULL
        if pushed:
            cydriver.cuCtxPopCurrent(&popped)

    cdef int create_chunk(self, size_t size, uint64_t* handle) noexcept nogil:
        cdef cydriver.CUmemGenericAllocationHandle h = 0
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuMemCreate(&h, size, &self.prop, 0))
        self._leave(pushed)
        if rc == DRIVER_OK:
            handle[0] = <uint64_t>h
            self.live_chunks += 1
            self.live_chunk_bytes += size
        return rc

    cdef int release_chunk(self, uint64_t handle, size_t size) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuMemRelease(<cydriver.CUmemGenericAllocationHandle>handle))
        self._leave(pushed)
        if rc == DRIVER_OK:
            self.live_chunks -= 1
            self.live_chunk_bytes -= size
        return rc

    cdef int reserve(self, size_t size, size_t alignment, uintptr_t* va) noexcept nogil:
        cdef cydriver.CUdeviceptr ptr = 0
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuMemAddressReserve(&ptr, size, alignment, 0, 0))
        self._leave(pushed)
        if rc == DRIVER_OK:
            va[0] = <uintptr_t>ptr
            self.live_reservations += 1
            self.live_reserved_va += size
        return rc

    cdef int free_va(self, uintptr_t va, size_t size) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuMemAddressFree(<cydriver.CUdeviceptr>va, size))
        self._leave(pushed)
        if rc == DRIVER_OK:
            self.live_reservations -= 1
            self.live_reserved_va -= size
        return rc

    cdef int map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuMemMap(<cydriver.CUdeviceptr>va, size, 0,
                                              <cydriver.CUmemGenericAllocationHandle>handle, 0))
        self._leave(pushed)
        return rc

    cdef int unmap(self, uintptr_t va, size_t size) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuMemUnmap(<cydriver.CUdeviceptr>va, size))
        self._leave(pushed)
        return rc

    cdef int set_access(self, uintptr_t va, size_t size) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuMemSetAccess(<cydriver.CUdeviceptr>va, size, &self.access, 1))
        self._leave(pushed)
        return rc

    cdef int synchronize(self) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuCtxSynchronize())
        self._leave(pushed)
        return rc

    cdef int record_event(self, int64_t stream, uint64_t* event) noexcept nogil:
        cdef cydriver.CUevent ev = NULL
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING))
        if rc == DRIVER_OK:
            rc = _code(cydriver.cuEventRecord(ev, <cydriver.CUstream><uintptr_t>stream))
            if rc != DRIVER_OK:
                cydriver.cuEventDestroy(ev)
        self._leave(pushed)
        if rc != DRIVER_OK:
            return rc
        event[0] = <uint64_t><uintptr_t>ev
        self.live_events += 1
        return DRIVER_OK

    cdef int query_event(self, uint64_t event) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef CUresult rc = cydriver.cuEventQuery(<cydriver.CUevent><uintptr_t>event)
        self._leave(pushed)
        if rc == CUDA_SUCCESS:
            return EVENT_DONE
        if rc == CUDA_ERROR_NOT_READY:
            return EVENT_PENDING
        return _code(rc)

    cdef int destroy_event(self, uint64_t event) noexcept nogil:
        cdef bint pushed = self._enter()
        cdef int rc = _code(cydriver.cuEventDestroy(<cydriver.CUevent><uintptr_t>event))
        self._leave(pushed)
        if rc == DRIVER_OK:
            self.live_events -= 1
        return rc

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, from cuMemGetInfo."""
        cdef size_t free_bytes = 0, total_bytes = 0
        cdef bint pushed = self._enter()
        cdef CUresult rc = cydriver.cuMemGetInfo(&free_bytes, &total_bytes)
        self._leave(pushed)
        if rc != CUDA_SUCCESS:
            raise CudaDriverError(f"gmlake: cuMemGetInfo failed: {_result_name(rc)}")
        return free_bytes, total_bytes

    def describe_error(self, int code) -> str:
        if code >= CUDA_BASE:
            return _result_name(<CUresult>(code - CUDA_BASE))
        return Driver.describe_error(self, code)


cdef str _result_name(CUresult rc):
    cdef const char* name = NULL
    cdef const char* text = NULL
    cydriver.cuGetErrorName(rc, &name)
    cydriver.cuGetErrorString(rc, &text)
    if name == NULL:
        return f"CUresult {<int>rc}"
    return f"{name.decode()}: {text.decode() if text != NULL else ''}"
