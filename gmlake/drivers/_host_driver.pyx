# cython: language_level=3, annotation_typing=False
"""The host driver: the VMM semantics of the CUDA driver over real CPU memory.

A chunk is a memfd of `granularity` bytes; a reservation is a PROT_NONE anonymous mapping; map() places a chunk's
memfd at a fixed address inside a reservation with MAP_SHARED, so one chunk can appear in several ranges at once and a
byte written through a stitched range reads back through the chunk's primitive range.
"""
import os

from libc.stdint cimport uint64_t, int64_t, uintptr_t
from libc.errno cimport errno, ENOMEM
from gmlake.core._driver cimport ModelDriver, DRIVER_OK, DRIVER_OOM
from gmlake.core._driver cimport FAULT_RESERVE, FAULT_MAP, FAULT_SET_ACCESS, FAULT_COPY

cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    int mprotect(void* addr, size_t length, int prot)
    int memfd_create(const char* name, unsigned int flags)
    int PROT_NONE, PROT_READ, PROT_WRITE
    int MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED, MAP_NORESERVE
    int MFD_CLOEXEC
    void* MAP_FAILED

cdef extern from "<fcntl.h>" nogil:
    int fcntl(int fd, int cmd, int arg)
    int F_DUPFD_CLOEXEC

cdef extern from "<unistd.h>" nogil:
    int ftruncate(int fd, long length)
    int close(int fd)
    int usleep(unsigned int usec)

cdef extern from "<string.h>" nogil:
    char* strerror(int errnum)
    void* memcpy(void* dest, const void* src, size_t n)

cdef extern from "<sys/resource.h>" nogil:
    struct rlimit:
        unsigned long rlim_cur
        unsigned long rlim_max
    int getrlimit(int resource, rlimit* rlim)
    int setrlimit(int resource, const rlimit* rlim)
    int RLIMIT_NOFILE


cdef enum:
    ERRNO_BASE = 1000   # errno values are returned as ERRNO_BASE + errno, clear of DRIVER_OOM


cdef inline int _errno_code() noexcept nogil:
    return DRIVER_OOM if errno == ENOMEM else ERRNO_BASE + errno


cdef void _raise_fd_limit() noexcept nogil:
    # One file descriptor per chunk: lift the soft limit to the hard one.
    cdef rlimit lim
    if getrlimit(RLIMIT_NOFILE, &lim) == 0 and lim.rlim_cur < lim.rlim_max:
        lim.rlim_cur = lim.rlim_max
        setrlimit(RLIMIT_NOFILE, &lim)


cdef class HostDriver(ModelDriver):
    """HostDriver(capacity=0, granularity=2097152, unmap_pause=0.0)
--

    Real bytes on the CPU: chunks are memfd regions mapped with mmap(MAP_FIXED|MAP_SHARED).

    `unmap_pause` (seconds) holds every unmapped range unmapped that long before unmap() returns: a test widens the
    window in which another thread touching the range faults, so a race it must catch is met every run
    (tests/test_safety.py), not once in many.

    Error codes other than DRIVER_OOM are ERRNO_BASE + errno.
    """
    cdef unsigned int unmap_pause_us

    def __init__(self, capacity: int = 0, granularity: int = 2 << 20, unmap_pause: float = 0.0):
        if granularity <= 0 or granularity & (granularity - 1) or granularity % 4096:
            raise ValueError(f"granularity must be a power of two multiple of the page size, got {granularity}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        if not 0.0 <= unmap_pause <= 10.0:
            raise ValueError(f"unmap_pause must be between 0 and 10 seconds, got {unmap_pause}")
        self.granularity = granularity
        self.capacity = capacity
        self.unmap_pause_us = <unsigned int>(unmap_pause * 1e6)
        _raise_fd_limit()

    cdef int create_chunk(self, size_t size, uint64_t* handle) noexcept nogil:
        cdef int rc = self.enter_create(size)
        if rc != DRIVER_OK:
            return rc
        cdef int fd = memfd_create(b"gmlake-chunk", MFD_CLOEXEC)
        if fd < 0:
            rc = _errno_code()
            self.give_capacity(size)
            return rc
        if ftruncate(fd, <long>size) != 0:
            rc = _errno_code()
            close(fd)
            self.give_capacity(size)
            return rc
        handle[0] = <uint64_t>fd
        return DRIVER_OK

    cdef int release_chunk(self, uint64_t handle, size_t size) noexcept nogil:
        cdef int fault = self.enter_release(handle)
        if fault != DRIVER_OK:
            return fault
        if close(<int>handle) != 0:
            return _errno_code()
        self.give_capacity(size)
        return DRIVER_OK

    cdef int reserve(self, size_t size, size_t alignment, uintptr_t* va) noexcept nogil:
        cdef int fault = self.enter_reserve(&alignment)
        if fault != DRIVER_OK:
            return fault
        # Over-reserve, then trim both ends so the range is aligned like a CUDA reservation.
        cdef size_t span = size + alignment
        cdef void* raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if raw == MAP_FAILED:
            return _errno_code()
        cdef uintptr_t start = <uintptr_t>raw
        cdef uintptr_t aligned = (start + alignment - 1) & ~(<uintptr_t>alignment - 1)
        if aligned > start:
            munmap(raw, aligned - start)
        cdef uintptr_t end = start + span
        if end > aligned + size:
            munmap(<void*>(aligned + size), end - (aligned + size))
        va[0] = aligned
        self.count_reservation(size, 1)
        return DRIVER_OK

    cdef int free_va(self, uintptr_t va, size_t size) noexcept nogil:
        cdef int fault = self.enter_free_va(va, size)
        if fault != DRIVER_OK:
            return fault
        if munmap(<void*>va, size) != 0:
            return _errno_code()
        self.count_reservation(size, -1)
        return DRIVER_OK

    cdef int map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil:
        cdef int fault = self.fault(FAULT_MAP)
        if fault != DRIVER_OK:
            return fault
        cdef void* got = mmap(<void*>va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, <int>handle, 0)
        if got == MAP_FAILED:
            return _errno_code()
        return self.track_map(va, size, handle)

    cdef int unmap(self, uintptr_t va, size_t size) noexcept nogil:
        cdef int fault = self.enter_unmap(va, size)
        if fault != DRIVER_OK:
            return fault
        # Put the reservation back in place of the chunk mapping, so the range stays reserved.
        cdef void* got = mmap(<void*>va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0)
        if got == MAP_FAILED:
            return _errno_code()
        if self.unmap_pause_us:
            usleep(self.unmap_pause_us)
        return DRIVER_OK

    cdef int set_access(self, uintptr_t va, size_t size) noexcept nogil:
        cdef int fault = self.fault(FAULT_SET_ACCESS)
        if fault != DRIVER_OK:
            return fault
        if mprotect(<void*>va, size, PROT_READ | PROT_WRITE) != 0:
            return _errno_code()
        return DRIVER_OK

    cdef int copy_out(self, void* host, uintptr_t va, size_t size) noexcept nogil:
        cdef int fault = self.fault(FAULT_COPY)
        if fault == DRIVER_OK:
            memcpy(host, <const void*>va, size)
        return fault

    cdef int copy_in(self, uintptr_t va, const void* host, size_t size) noexcept nogil:
        cdef int fault = self.fault(FAULT_COPY)
        if fault == DRIVER_OK:
            memcpy(<void*>va, host, size)
        return fault

    cdef int export_chunk(self, uint64_t handle, int* fd) noexcept nogil:
        # The chunk is its memfd: another process that maps the duplicate sees the same pages, and the pages live
        # while any descriptor or mapping of them does, whichever process holds it (Note [Exporting a chunk]).
        cdef int dup = fcntl(<int>handle, F_DUPFD_CLOEXEC, 0)
        if dup < 0:
            return _errno_code()
        fd[0] = dup
        return DRIVER_OK

    cdef int shared_fd(self, uint64_t handle, int* fd) noexcept nogil:
        # The chunk's memfd itself, open while the chunk lives and closed by release_chunk (Note [One descriptor per
        # shared chunk] in gmlake/drivers/_cuda_driver.pyx).
        fd[0] = <int>handle
        return DRIVER_OK

    def _write_physical(self, handle: int, offset: int, data: bytes) -> None:
        """A queued kernel's write landing: into the chunk's memfd itself, so every mapping of it sees the bytes."""
        os.pwrite(handle, data, offset)

    def _read_physical(self, handle: int, offset: int, size: int) -> bytes:
        return os.pread(handle, size, offset)

    def describe_error(self, int code) -> str:
        if code >= ERRNO_BASE:
            return f"errno {code - ERRNO_BASE}: {strerror(code - ERRNO_BASE).decode()}"
        return ModelDriver.describe_error(self, code)
