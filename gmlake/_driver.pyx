# cython: language_level=3, annotation_typing=False
"""Base class of the drivers: an abstract interface; every call fails until a subclass overrides it."""
from libc.stdint cimport uint64_t, int64_t, uintptr_t
from cython.operator cimport dereference as deref

cdef enum:
    NOT_IMPLEMENTED = -1


cdef class Driver:
    """A source of physical memory chunks and virtual address ranges.

    Subclasses: SimDriver (bookkeeping only), HostDriver (memfd + mmap) and CudaDriver (CUDA VMM).
    """

    def __cinit__(self):
        self.granularity = 0
        self.capacity = 0

    cdef int create_chunk(self, size_t size, uint64_t* handle) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int release_chunk(self, uint64_t handle, size_t size) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int reserve(self, size_t size, size_t alignment, uintptr_t* va) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int free_va(self, uintptr_t va, size_t size) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int unmap(self, uintptr_t va, size_t size) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int set_access(self, uintptr_t va, size_t size) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int synchronize(self) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int record_event(self, int64_t stream, uint64_t* event) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int query_event(self, uint64_t event) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int destroy_event(self, uint64_t event) noexcept nogil:
        return NOT_IMPLEMENTED

    def describe_error(self, int code) -> str:
        """Text for a code returned by one of the driver calls."""
        if code == DRIVER_OOM:
            return "out of memory"
        if code == NOT_IMPLEMENTED:
            return f"{type(self).__name__} does not implement this call"
        return f"driver error {code}"

    @property
    def name(self) -> str:
        return type(self).__name__

    def leaks(self) -> dict:
        """What the driver still holds: all zero once an allocator over it has released everything."""
        return {
            "chunks": self.live_chunks,
            "chunk_bytes": self.live_chunk_bytes,
            "reservations": self.live_reservations,
            "reserved_va": self.live_reserved_va,
            "events": self.live_events,
        }


FAULT_NAMES = ("create_chunk", "release_chunk", "reserve", "free_va", "map", "unmap", "set_access", "synchronize",
               "event_record")


cdef class ModelDriver(Driver):
    """Base of SimDriver and HostDriver: models streams and events on the CPU, bounds physical memory, and can be
    told to fail chosen calls (inject_fault) so tests can drive every error path."""

    def __cinit__(self):
        self.auto_complete = True
        self.next_event = 1

    cdef int fault(self, int kind) noexcept nogil:
        """DRIVER_OK, or the injected code if this call is the one chosen to fail."""
        if self.fault_countdown[kind] == 0:
            return DRIVER_OK
        self.fault_countdown[kind] -= 1
        if self.fault_countdown[kind] != 0:
            return DRIVER_OK
        self.faults_triggered += 1
        return self.fault_code[kind]

    def inject_fault(self, call: str, nth: int = 1, oom: bool = False) -> None:
        """Make the nth next call of `call` (one of FAULT_NAMES) fail, with out-of-memory if `oom`, else with
        DRIVER_INJECTED. Only that one call fails."""
        if call not in FAULT_NAMES:
            raise ValueError(f"unknown driver call {call!r}; one of {', '.join(FAULT_NAMES)}")
        if nth < 1:
            raise ValueError("nth must be >= 1")
        cdef int kind = FAULT_NAMES.index(call)
        self.fault_countdown[kind] = nth
        self.fault_code[kind] = DRIVER_OOM if oom else DRIVER_INJECTED

    def clear_faults(self) -> None:
        """Cancel every pending injected fault."""
        cdef int kind
        for kind in range(<int>NUM_FAULTS):
            self.fault_countdown[kind] = 0

    cdef int take_capacity(self, size_t size) noexcept nogil:
        if self.capacity and <size_t>self.live_chunk_bytes + size > self.capacity:
            return DRIVER_OOM
        self.live_chunks += 1
        self.live_chunk_bytes += size
        return DRIVER_OK

    cdef void give_capacity(self, size_t size) noexcept nogil:
        self.live_chunks -= 1
        self.live_chunk_bytes -= size

    cdef int synchronize(self) noexcept nogil:
        cdef pair[int64_t, uint64_t] entry
        cdef int rc = self.fault(FAULT_SYNC)
        if rc != DRIVER_OK:
            return rc
        for entry in self.issued:
            self.completed[entry.first] = entry.second
        return DRIVER_OK

    cdef int record_event(self, int64_t stream, uint64_t* event) noexcept nogil:
        cdef int rc = self.fault(FAULT_EVENT)
        if rc != DRIVER_OK:
            return rc
        cdef uint64_t ticket = self.issued[stream] + 1
        self.issued[stream] = ticket
        event[0] = self.next_event
        self.events[self.next_event] = pair[int64_t, uint64_t](stream, ticket)
        self.next_event += 1
        self.live_events += 1
        return DRIVER_OK

    cdef int query_event(self, uint64_t event) noexcept nogil:
        cdef unordered_map[uint64_t, pair[int64_t, uint64_t]].iterator it = self.events.find(event)
        if it == self.events.end():
            return -2
        if self.auto_complete:
            return EVENT_DONE
        cdef pair[int64_t, uint64_t] entry = deref(it).second
        return EVENT_DONE if self.completed[entry.first] >= entry.second else EVENT_PENDING

    cdef int destroy_event(self, uint64_t event) noexcept nogil:
        if self.events.erase(event) == 0:
            return -2
        self.live_events -= 1
        return DRIVER_OK

    def complete_stream(self, stream: int) -> None:
        """Mark all work queued so far on `stream` as done (events recorded on it become complete)."""
        self.completed[stream] = self.issued[stream]

    def describe_error(self, int code) -> str:
        if code == -2:
            return "unknown event"
        if code == DRIVER_INJECTED:
            return "injected fault"
        return Driver.describe_error(self, code)
