# cython: language_level=3, annotation_typing=False
"""The simulation driver: bookkeeping only, no memory behind it, so it can model a device of any size."""
from libc.stdint cimport uint64_t, int64_t, uintptr_t
from gmlake.core._driver cimport ModelDriver, DRIVER_OK, DRIVER_OOM
from gmlake.core._driver cimport FAULT_RESERVE, FAULT_MAP, FAULT_SET_ACCESS, FAULT_COPY


cdef class SimDriver(ModelDriver):
    """SimDriver(capacity=0, granularity=2097152, exportable=None)
--

    Pretends to be a device with `capacity` bytes (0: unbounded) and allocation `granularity`. `exportable`: whether
    the chunks it models are exportable, as CudaDriver's would be (None: GMLAKE_IPC, else the default; Note [Exporting
    a chunk]). It changes nothing here but their price: replay prices each handle of an exportable chunk at the cost
    table's per_handle plus per_handle_exportable_extra.

    Addresses are handed out by a bump pointer and never reused, so a stale pointer can never alias a new range.
    """
    cdef uintptr_t next_va
    cdef uint64_t next_handle
    cdef readonly bint exportable

    def __init__(self, capacity: int = 0, granularity: int = 2 << 20, exportable=None):
        if granularity <= 0 or granularity & (granularity - 1):
            raise ValueError(f"granularity must be a positive power of two, got {granularity}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.granularity = granularity
        self.capacity = capacity
        self.next_va = <uintptr_t>1 << 44
        self.next_handle = 1
        if exportable is None:
            from gmlake.drivers._cuda_driver import exportable_requested    # reads GMLAKE_IPC; loads no CUDA
            exportable = exportable_requested()
        self.exportable = bool(exportable)

    cdef int create_chunk(self, size_t size, uint64_t* handle) noexcept nogil:
        cdef int rc = self.enter_create(size)
        if rc != DRIVER_OK:
            return rc
        handle[0] = self.next_handle
        self.next_handle += 1
        return DRIVER_OK

    cdef int release_chunk(self, uint64_t handle, size_t size) noexcept nogil:
        cdef int fault = self.enter_release(handle)
        if fault != DRIVER_OK:
            return fault
        self.give_capacity(size)
        return DRIVER_OK

    cdef int reserve(self, size_t size, size_t alignment, uintptr_t* va) noexcept nogil:
        cdef int fault = self.enter_reserve(&alignment)
        if fault != DRIVER_OK:
            return fault
        self.next_va = (self.next_va + alignment - 1) & ~(<uintptr_t>alignment - 1)
        va[0] = self.next_va
        self.next_va += size
        self.count_reservation(size, 1)
        return DRIVER_OK

    cdef int free_va(self, uintptr_t va, size_t size) noexcept nogil:
        cdef int fault = self.enter_free_va(va, size)
        if fault != DRIVER_OK:
            return fault
        self.count_reservation(size, -1)
        return DRIVER_OK

    cdef int map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil:
        cdef int fault = self.fault(FAULT_MAP)
        if fault != DRIVER_OK:
            return fault
        return self.track_map(va, size, handle)

    cdef int unmap(self, uintptr_t va, size_t size) noexcept nogil:
        return self.enter_unmap(va, size)

    cdef int set_access(self, uintptr_t va, size_t size) noexcept nogil:
        return self.fault(FAULT_SET_ACCESS)

    cdef int copy_out(self, void* host, uintptr_t va, size_t size) noexcept nogil:
        return self.fault(FAULT_COPY)       # no bytes: the copy is counted and priced (gmlake.sim.replay)

    cdef int copy_in(self, uintptr_t va, const void* host, size_t size) noexcept nogil:
        return self.fault(FAULT_COPY)
