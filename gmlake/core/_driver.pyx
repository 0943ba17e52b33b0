# cython: language_level=3, annotation_typing=False
"""Base class of the drivers: an abstract interface; every call fails until a subclass overrides it.

Also the modelled streams of the CPU drivers, and their optional hazard tracking (StreamModel): the asynchrony of a
GPU played out on the CPU, so tests see the stream-ordering bugs that would corrupt data only on a device.
"""
from bisect import bisect_right, insort
from collections import deque

from libc.stdint cimport uint64_t, int64_t, uintptr_t
from cython.operator cimport dereference as deref

from gmlake.core.errors import HazardError

cdef enum:
    NOT_IMPLEMENTED = -1


cdef class Driver:
    """A source of physical memory chunks and virtual address ranges.

    Subclasses: SimDriver (bookkeeping only), HostDriver (memfd + mmap) and CudaDriver (CUDA VMM).
    """

    def __cinit__(self):
        self.granularity = 0
        self.capacity = 0
        self.busy_ns = 0

    @property
    def busy_seconds(self) -> float:
        """Seconds spent inside this driver's calls so far, measured around each call (the CUDA driver) or 0 (the
        model drivers, whose calls replay prices instead): what a run's driver calls actually cost its CPU thread,
        a synchronize's wait for the GPU included (replay prices no synchronize)."""
        return self.busy_ns * 1e-9

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

    cdef int copy_out(self, void* host, uintptr_t va, size_t size) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int device_free(self, size_t* free) noexcept nogil:
        free[0] = self.capacity - <size_t>self.live_chunk_bytes if self.capacity else <size_t>-1
        return DRIVER_OK

    cdef int copy_in(self, uintptr_t va, const void* host, size_t size) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int record_event(self, int64_t stream, uint64_t* event) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int query_event(self, uint64_t event) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int destroy_event(self, uint64_t event) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int wait_event(self, int64_t stream, uint64_t event) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int stream_capturing(self, int64_t stream, bint* capturing) noexcept nogil:
        capturing[0] = False
        return DRIVER_OK

    cdef int exchange_capture_mode(self, int* mode) noexcept nogil:
        return DRIVER_OK

    cdef int export_chunk(self, uint64_t handle, int* fd) noexcept nogil:
        return NOT_IMPLEMENTED

    cdef int shared_fd(self, uint64_t handle, int* fd) noexcept nogil:
        return NOT_IMPLEMENTED

    def create(self, size: int) -> int:
        """A new chunk of `size` bytes (a multiple of the granularity), outside any allocator: for tests and
        benchmarks of the driver itself. A RuntimeError naming the driver's reason where it fails."""
        cdef uint64_t handle = 0
        cdef int rc = self.create_chunk(<size_t>size, &handle)
        if rc != DRIVER_OK:
            raise RuntimeError(f"gmlake: cannot create a chunk of {size} bytes: {self.describe_error(rc)}")
        return handle

    def release(self, handle: int, size: int) -> None:
        """Release a chunk create() made."""
        cdef int rc = self.release_chunk(<uint64_t>handle, <size_t>size)
        if rc != DRIVER_OK:
            raise RuntimeError(f"gmlake: cannot release chunk {handle}: {self.describe_error(rc)}")

    def export(self, handle: int) -> int:
        """A new file descriptor for chunk `handle`'s pages (Note [Exporting a chunk]), owned by the caller; a
        RuntimeError naming the driver's reason where it cannot export."""
        cdef int fd = -1
        cdef int rc = self.export_chunk(<uint64_t>handle, &fd)
        if rc != DRIVER_OK:
            raise RuntimeError(f"gmlake: cannot export chunk {handle}: {self.describe_error(rc)}")
        return fd

    def shared(self, handle: int) -> int:
        """The descriptor the driver keeps for chunk `handle` for other processes (Note [One descriptor per shared
        chunk]): the same one on every call while the chunk lives; not the caller's to close. A RuntimeError naming
        the driver's reason where it cannot export."""
        cdef int fd = -1
        cdef int rc = self.shared_fd(<uint64_t>handle, &fd)
        if rc != DRIVER_OK:
            raise RuntimeError(f"gmlake: cannot export chunk {handle}: {self.describe_error(rc)}")
        return fd

    cdef void count_reservation(self, size_t size, int sign) noexcept nogil:
        """Book an address range reserved (sign +1) or freed (-1), for stats() and the leak checks."""
        self.live_reservations += sign
        self.live_reserved_va += sign * <int64_t>size

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


include "_stream_model.pxi"


cdef class ModelDriver(Driver):
    """Base of SimDriver and HostDriver: models streams and events on the CPU, bounds physical memory, and can be
    told to fail chosen calls (inject_fault) so tests can drive every error path."""

    def __cinit__(self):
        self.auto_complete = True
        self.next_event = 1
        self.tracking = False
        self.model = None

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
        if self.capacity and <size_t>self.live_chunk_bytes + self.outside_bytes + size > self.capacity:
            return DRIVER_OOM
        self.live_chunks += 1
        self.live_chunk_bytes += size
        return DRIVER_OK

    cdef void give_capacity(self, size_t size) noexcept nogil:
        self.live_chunks -= 1
        self.live_chunk_bytes -= size

    cdef int device_free(self, size_t* free) noexcept nogil:
        cdef size_t used = <size_t>self.live_chunk_bytes + self.outside_bytes
        if not self.capacity:
            free[0] = <size_t>-1
        else:
            free[0] = self.capacity - used if used < self.capacity else 0
        return DRIVER_OK

    cdef bint hold_outside(self, size_t total) noexcept nogil:
        """Hold `total` bytes outside the allocator, as a library taking or giving back memory does; False, holding
        what it held, where the device has no room for the growth (on a GPU the library's own call fails there).

        Note [The libraries' memory in replay]: CUDA's libraries take device memory outside the allocator as a run
        goes on (kernels loaded the first time a shape picks them, handles, workspaces), and at the device's edge
        that decides who fits. A captured trace records it (Note [Sampling the libraries' memory]); the replay holds
        it here at the request where the run held it, so no chunk takes it, device_free answers as cuMemGetInfo
        would, and growth with no room is counted as the library's failure (gmlake.sim.replay)."""
        if total > self.outside_bytes and self.capacity and \
                <size_t>self.live_chunk_bytes + total > self.capacity:
            return False
        self.outside_bytes = total
        return True

    def set_outside_bytes(self, total: int) -> bool:
        """Hold `total` bytes of the device outside the allocator (hold_outside): False where it has no room."""
        if total < 0:
            raise ValueError(f"outside bytes must be >= 0, got {total}")
        return self.hold_outside(total)

    cdef int synchronize(self) noexcept nogil:
        cdef pair[int64_t, uint64_t] entry
        cdef pair[int64_t, bint] capture
        cdef int rc = self.fault(FAULT_SYNC)
        if rc != DRIVER_OK:
            return rc
        if self.sync_hooked:
            with gil:
                self.sync_hook_fn()
        if not self.raw_captures.empty():
            # cuCtxSynchronize while a stream of the context captures fails, and the capture is invalidated
            for capture in self.raw_captures:
                self.raw_captures[capture.first] = False
            return DRIVER_CAPTURE_ILLEGAL
        if self.tracking:
            with gil:
                rc = self._ask_model(self.complete_all, ())
            if rc != DRIVER_OK:
                return rc
        for entry in self.issued:
            self.completed[entry.first] = entry.second
        return DRIVER_OK

    cdef int record_event(self, int64_t stream, uint64_t* event) noexcept nogil:
        cdef int rc = self.fault(FAULT_EVENT)
        if rc != DRIVER_OK:
            return rc
        if event[0] != 0 and self.events.count(event[0]) == 0:
            return -2                   # not an event of this driver's, or one already destroyed
        cdef uint64_t ticket = self.issued[stream] + 1
        self.issued[stream] = ticket
        if event[0] == 0:
            event[0] = self.next_event
            self.next_event += 1
            self.live_events += 1
            self.created_events += 1
        self.events[event[0]] = pair[int64_t, uint64_t](stream, ticket)
        if self.event_lag:
            self.event_clock[event[0]] = self.clock
        return DRIVER_OK

    cdef int query_event(self, uint64_t event) noexcept nogil:
        cdef unordered_map[uint64_t, pair[int64_t, uint64_t]].iterator it = self.events.find(event)
        if it == self.events.end():
            return -2
        cdef pair[int64_t, uint64_t] entry = deref(it).second
        if self.event_lag:
            # Note [Event lag in replay]: a stream's work completes in order, so an event done by the clock also
            # completes everything its stream queued before it.
            if self.completed[entry.first] < entry.second and \
                    self.clock - self.event_clock[event] >= self.event_lag:
                self.completed[entry.first] = entry.second
            return EVENT_DONE if self.completed[entry.first] >= entry.second else EVENT_PENDING
        if self.auto_complete:
            return EVENT_DONE
        return EVENT_DONE if self.completed[entry.first] >= entry.second else EVENT_PENDING

    cdef int wait_event(self, int64_t stream, uint64_t event) noexcept nogil:
        cdef int rc = self.fault(FAULT_EVENT)
        if rc != DRIVER_OK:
            return rc
        cdef unordered_map[uint64_t, pair[int64_t, uint64_t]].iterator it = self.events.find(event)
        if it == self.events.end():
            return -2
        cdef pair[int64_t, uint64_t] entry = deref(it).second
        if self.tracking:           # the stream's later kernels are ordered after the event's stream's work
            with gil:
                self.model.wait(stream, entry.first, entry.second)
        return DRIVER_OK

    cdef int destroy_event(self, uint64_t event) noexcept nogil:
        if self.events.erase(event) == 0:
            return -2
        self.event_clock.erase(event)
        self.live_events -= 1
        return DRIVER_OK

    def begin_raw_capture(self, stream: int) -> None:
        """Put `stream` under a graph capture, as cudaStreamBeginCapture does: one the allocator is not told of (an
        extension's own), or, after Allocator.begin_allocate_to_pool, the capture torch.cuda.graph announced. Until
        it ends, synchronize fails (DRIVER_CAPTURE_ILLEGAL) and invalidates it, as cuCtxSynchronize does."""
        self.raw_captures[<int64_t>stream] = True

    def end_raw_capture(self, stream: int) -> None:
        """End `stream`'s capture; a RuntimeError, as cudaStreamEndCapture's, where a synchronize invalidated it."""
        cdef bint valid = self.raw_captures.count(<int64_t>stream) == 0 or self.raw_captures[<int64_t>stream]
        self.raw_captures.erase(<int64_t>stream)
        if not valid:
            raise RuntimeError(f"gmlake: the capture of stream {stream} was invalidated: a synchronize ran during it "
                               f"(cudaErrorStreamCaptureInvalidated)")

    @property
    def sync_hook(self):
        """A callable called at the start of every synchronize, with the GIL, before the capture check (None: none):
        for tests that act from another thread while the allocator is about to synchronize."""
        return self.sync_hook_fn

    @sync_hook.setter
    def sync_hook(self, hook) -> None:
        self.sync_hook_fn = hook
        self.sync_hooked = hook is not None

    cdef int stream_capturing(self, int64_t stream, bint* capturing) noexcept nogil:
        capturing[0] = self.raw_captures.count(stream) != 0
        return DRIVER_OK

    def complete_stream(self, stream: int, upto: int | None = None) -> None:
        """Mark the work queued on `stream` as done, all of it or up to ticket `upto` (see `queued`): events
        recorded on it become complete and, with hazard tracking, its kernels run."""
        cdef int64_t s = stream
        cdef uint64_t target = self.issued[s]
        if upto is not None and <uint64_t>upto < target:
            target = upto
        if self.model is not None:
            self.model.run_until(s, target)
        if target > self.completed[s]:
            self.completed[s] = target

    def complete_all(self) -> None:
        """Complete every stream's work (what synchronize does)."""
        cdef pair[int64_t, uint64_t] entry
        streams = []
        for entry in self.issued:
            streams.append(entry.first)
        for stream in streams:
            self.complete_stream(stream)

    def complete_random(self, rng) -> None:
        """A seeded random schedule: complete each stream up to a random point of its queued work (`rng` is a
        random.Random)."""
        cdef pair[int64_t, uint64_t] entry
        queued = []
        for entry in self.issued:
            queued.append((entry.first, entry.second))
        for stream, issued in sorted(queued):
            done = self.completed[<int64_t>stream]
            if issued > done:
                self.complete_stream(stream, rng.randint(done, issued))

    def completed_ticket(self, stream: int) -> int:
        """The ticket up to which `stream`'s work is done."""
        return self.completed[stream]

    def queued(self, stream: int) -> int:
        """The ticket of the last work queued on `stream` (kernels and events share one count per stream)."""
        return self.issued[stream]

    # ------------------------------------------------------------------ hazard tracking (tests)

    def track_hazards(self) -> None:
        """Turn on hazard tracking on this fresh driver: streams run nothing until completed (auto_complete off),
        kernels are queued with `launch`, and unmapping, releasing or freeing what would be unsafe on a GPU is
        refused (DRIVER_HAZARD) and logged; `check_hazards()` raises the first hazard logged."""
        if self.live_chunks or self.live_reservations:
            raise RuntimeError("track_hazards() must be called before the driver hands anything out")
        self.auto_complete = False
        self.model = StreamModel(self)
        self.tracking = True

    def _need_model(self):
        if self.model is None:
            raise RuntimeError("hazard tracking is off: call track_hazards() first")
        return self.model

    def launch(self, stream: int, ptr: int, size: int, *, write: int | None = None, expect: int | None = None,
               after=(), label: str = "") -> int:
        """Queue a kernel on `stream` that touches [ptr, ptr + size): when it runs, it writes byte `write` and/or
        checks that the bytes hold `expect` (real bytes on the host driver). It waits for all work queued so far on
        the streams in `after` (an event wait), so it does not race with them. Raises HazardError if another
        stream's queued work still touches the same physical bytes. Returns the kernel's ticket."""
        model = self._need_model()
        cdef int64_t s = stream
        waits = model.waits_of(int(stream), [int(other) for other in after])
        ticket = self.issued[s] + 1
        model.launch(stream, ticket, ptr, size, write, expect, waits, label)
        self.issued[s] = ticket
        return ticket

    def physical(self, ptr: int, size: int) -> list:
        """The physical ranges (handle, lo, hi) under VA [ptr, ptr + size)."""
        return self._need_model().extents(ptr, size)

    def pending_kernels(self, stream: int | None = None) -> int:
        """How many kernels are queued and not yet run (on `stream`, or on all)."""
        return self._need_model().pending(stream)

    @property
    def hazards(self) -> list:
        """Every hazard logged so far (empty while tracking is off)."""
        return list(self.model.hazards) if self.model is not None else []

    def check_hazards(self) -> None:
        """Raise HazardError naming the first hazard logged, if any."""
        if self.model is not None and self.model.hazards:
            raise HazardError(self.model.hazards[0])

    def _write_physical(self, handle: int, offset: int, data: bytes) -> None:
        """Write bytes into a chunk (host driver); the sim driver has no bytes."""

    def _read_physical(self, handle: int, offset: int, size: int):
        """The bytes of a chunk (host driver); None on the sim driver."""
        return None

    cdef int _ask_model(self, object method, tuple args) noexcept:
        """Call the model: DRIVER_HAZARD (logged) if it names a hazard or fails, else DRIVER_OK."""
        try:
            found = method(*args)
        except BaseException as err:
            found = f"hazard model failed: {err!r}"
        if found is None:
            return DRIVER_OK
        self.model.hazards.append(found)
        return DRIVER_HAZARD

    cdef int track_map(self, uintptr_t va, size_t size, uint64_t handle) noexcept nogil:
        if not self.tracking:
            return DRIVER_OK
        with gil:
            return self._ask_model(self.model.on_map, (va, size, handle))

    cdef int enter_create(self, size_t size) noexcept nogil:
        cdef int rc = self.fault(FAULT_CREATE)
        return rc if rc != DRIVER_OK else self.take_capacity(size)

    cdef int enter_release(self, uint64_t handle) noexcept nogil:
        cdef int rc = self.fault(FAULT_RELEASE)
        if rc != DRIVER_OK or not self.tracking:
            return rc
        with gil:
            return self._ask_model(self.model.on_release, (handle,))

    cdef int enter_reserve(self, size_t* alignment) noexcept nogil:
        """A reservation's entry: its injected fault; the alignment raised to the granularity, as CUDA's is."""
        cdef int rc = self.fault(FAULT_RESERVE)
        if rc == DRIVER_OK and alignment[0] < self.granularity:
            alignment[0] = self.granularity
        return rc

    cdef int enter_free_va(self, uintptr_t va, size_t size) noexcept nogil:
        cdef int rc = self.fault(FAULT_FREE_VA)
        if rc != DRIVER_OK or not self.tracking:
            return rc
        with gil:
            return self._ask_model(self.model.on_free_va, (va, size))

    cdef int enter_unmap(self, uintptr_t va, size_t size) noexcept nogil:
        cdef int rc = self.fault(FAULT_UNMAP)
        if rc != DRIVER_OK or not self.tracking:
            return rc
        with gil:
            return self._ask_model(self.model.on_unmap, (va, size))

    def describe_error(self, int code) -> str:
        if code == -2:
            return "unknown event"
        if code == DRIVER_INJECTED:
            return "injected fault"
        if code == DRIVER_CAPTURE_ILLEGAL:
            return "operation not permitted when stream is capturing (a synchronize during a graph capture)"
        if code == DRIVER_HAZARD:
            # Index from the front: this module is compiled with wraparound off.
            found = self.model.hazards if self.model is not None else []
            return "hazard: " + (found[len(found) - 1] if found else "?")
        return Driver.describe_error(self, code)
