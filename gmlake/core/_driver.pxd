# The driver interface: what the allocator asks of physical memory and virtual address space.
# Three implementations: _cuda_driver (CUDA VMM), _host_driver (memfd + mmap, real bytes), _sim_driver (bookkeeping).
# Every method returns 0 on success, DRIVER_OOM when memory is exhausted, or another nonzero driver-specific code
# that describe_error() turns into text.
from libc.stdint cimport uint64_t, int64_t, uintptr_t

cdef enum:
    DRIVER_OK = 0
    DRIVER_OOM = 1

# query_event results
cdef enum:
    EVENT_DONE = 0
    EVENT_PENDING = 1


cdef class Driver:
    cdef readonly size_t granularity
    # What the driver holds now, kept by every implementation so tests can check for leaks.
    cdef readonly int64_t live_chunks
    cdef readonly int64_t live_chunk_bytes
    cdef readonly int64_t live_reservations
    cdef readonly int64_t live_reserved_va
    cdef readonly int64_t live_events
    # Physical memory the device has (0: unbounded).
    cdef readonly size_t capacity
    # Wall time spent inside driver calls, measured around each by the CUDA driver (the models leave it 0: replay
    # prices their calls instead, gmlake.sim.replay.driver_seconds). Shared by every allocator on this driver.
    cdef readonly double busy_ns

    cdef int create_chunk(self, size_t size, uint64_t* handle) noexcept nogil
    cdef int release_chunk(self, uint64_t handle, size_t size) noexcept nogil
    cdef int reserve(self, size_t size, size_t alignment, uintptr_t* va) noexcept nogil
    cdef int free_va(self, uintptr_t va, size_t size) noexcept nogil
    cdef int map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil
    cdef int unmap(self, uintptr_t va, size_t size) noexcept nogil
    cdef int set_access(self, uintptr_t va, size_t size) noexcept nogil
    cdef int synchronize(self) noexcept nogil
    # The device's free memory, for the reserve growth leaves to the process's other users (Note [Leaving the
    # libraries room]): cuMemGetInfo on a GPU; a model driver's capacity less its live chunks (SIZE_MAX unbounded).
    cdef int device_free(self, size_t* free) noexcept nogil
    # Copy device memory at `va` to host memory and back, synchronously, for re-backing (the caller synchronized the
    # device first). The sim driver has no bytes and copies nothing.
    cdef int copy_out(self, void* host, uintptr_t va, size_t size) noexcept nogil
    cdef int copy_in(self, uintptr_t va, const void* host, size_t size) noexcept nogil
    # Record an event on `stream`: a new one, written to *event, where *event is 0; else *event, one this driver
    # made and has not destroyed, recorded again (Note [Reusing events]).
    cdef int record_event(self, int64_t stream, uint64_t* event) noexcept nogil
    cdef readonly uint64_t created_events                # events made over the driver's life (reuse makes none)
    cdef int query_event(self, uint64_t event) noexcept nogil
    cdef int destroy_event(self, uint64_t event) noexcept nogil
    # Work queued on `stream` after this waits for `event` (recorded on another stream): an ordering on the GPU, no
    # wait on the CPU (cuStreamWaitEvent).
    cdef int wait_event(self, int64_t stream, uint64_t event) noexcept nogil
    # Graph capture (Note [Pools and graph capture]): is `stream` being captured; and the calling thread's capture
    # mode, swapped (CUstreamCaptureMode: 0 global, 1 thread-local, 2 relaxed). The models capture nothing unless a
    # test says so (ModelDriver.raw_captures) and have no mode.
    cdef int stream_capturing(self, int64_t stream, bint* capturing) noexcept nogil
    cdef int exchange_capture_mode(self, int* mode) noexcept nogil
    # A new POSIX file descriptor for chunk `handle`, through which another process maps
    # the same physical pages (the host driver's memfd, duplicated; the CUDA driver's cuMemExportToShareableHandle,
    # for chunks created exportable). The caller owns and closes it. The sim driver has no pages and exports none.
    # Note [Exporting a chunk] in gmlake/drivers/_cuda_driver.pyx.
    cdef int export_chunk(self, uint64_t handle, int* fd) noexcept nogil
    # The descriptor the driver keeps for chunk `handle` while the chunk lives, for another process to take from
    # this one (PyTorch's receiver takes it with pidfd_getfd): exported on the first call, the same one after,
    # closed by release_chunk; the caller must not close it. Note [One descriptor per shared chunk] in
    # gmlake/drivers/_cuda_driver.pyx.
    cdef int shared_fd(self, uint64_t handle, int* fd) noexcept nogil
    cdef void count_reservation(self, size_t size, int sign) noexcept nogil


from libcpp.unordered_map cimport unordered_map
from libcpp.pair cimport pair

# Calls a ModelDriver can be told to fail (fault injection).
cdef enum FaultKind:
    FAULT_CREATE = 0
    FAULT_RELEASE
    FAULT_RESERVE
    FAULT_FREE_VA
    FAULT_MAP
    FAULT_UNMAP
    FAULT_SET_ACCESS
    FAULT_SYNC
    FAULT_EVENT
    FAULT_COPY
    NUM_FAULTS

cdef enum:
    DRIVER_INJECTED = 77      # the code an injected (non-OOM) fault returns
    DRIVER_HAZARD = 78        # hazard tracking refused a call the CUDA driver would make dangerous
    DRIVER_CAPTURE_ILLEGAL = 79   # a synchronize while a stream captures (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)


cdef class ModelDriver(Driver):
    """Shared by the sim and host drivers: modelled streams and events, and the capacity bound."""
    # When true, work on a stream is done as soon as it is asked about (the CPU runs nothing asynchronously).
    # When false, it is done only once complete_stream() or synchronize() says so: for tests of stream ordering.
    cdef public bint auto_complete
    # Note [Event lag in replay]: with event_lag > 0, an event is done once `clock` has advanced event_lag ticks
    # past its recording (the replay ticks once per request), or once a synchronize or complete_stream covers it.
    cdef public uint64_t event_lag
    cdef public uint64_t clock
    cdef unordered_map[uint64_t, uint64_t] event_clock                # event -> clock when recorded (event_lag > 0)
    cdef uint64_t next_event
    cdef unordered_map[uint64_t, pair[int64_t, uint64_t]] events      # event -> (stream, ticket)
    cdef unordered_map[int64_t, uint64_t] issued                      # stream -> last ticket issued
    cdef unordered_map[int64_t, uint64_t] completed                   # stream -> last ticket completed
    # Fault injection: the countdown-th next call of a kind fails (0: off) with fault_code.
    cdef int64_t fault_countdown[<int>NUM_FAULTS]
    cdef int fault_code[<int>NUM_FAULTS]
    cdef readonly int64_t faults_triggered
    # Hazard tracking (tests only, off by default): `model` is a StreamModel that queues kernels per stream and
    # judges every map, unmap, release and address free; while off, each of those calls costs one branch.
    cdef bint tracking
    cdef object model
    # Streams a test has put under a graph capture (begin_raw_capture), each True until a synchronize invalidates
    # it: as cuCtxSynchronize, the model's synchronize fails while any stream captures (Note [A cut under another
    # thread's capture]). `sync_hook`, where set, is called (with the GIL) at the start of every synchronize.
    cdef unordered_map[int64_t, bint] raw_captures
    cdef object sync_hook_fn
    cdef bint sync_hooked
    # Note [The libraries' memory in replay]: device memory the process holds outside the allocator (CUDA's libraries'
    # kernels, handles and workspaces), which the capacity serves before any chunk.
    cdef readonly size_t outside_bytes
    cdef int take_capacity(self, size_t size) noexcept nogil
    cdef bint hold_outside(self, size_t total) noexcept nogil
    cdef int device_free(self, size_t* free) noexcept nogil
    cdef void give_capacity(self, size_t size) noexcept nogil
    cdef int fault(self, int kind) noexcept nogil
    cdef int _ask_model(self, object method, tuple args) noexcept
    cdef int track_map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil
    # Each call's entry checks, one funnel per call: its injected fault, then the hazard model (or the capacity).
    cdef int enter_create(self, size_t size) noexcept nogil
    cdef int enter_release(self, uint64_t handle) noexcept nogil
    cdef int enter_reserve(self, size_t* alignment) noexcept nogil
    cdef int enter_free_va(self, uintptr_t va, size_t size) noexcept nogil
    cdef int enter_unmap(self, uintptr_t va, size_t size) noexcept nogil
