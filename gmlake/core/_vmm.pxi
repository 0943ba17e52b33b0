# The allocator core, room "vmm": driver calls, each counted; new chunks created and mapped with rollback; and what the
# driver refused to take back (orphans), retried later.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds and, where it can
# fail, the call's Failure (Note [A call's failure]).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _call, _unannounced_capture, _refuse_unannounced_capture, _sync, _release_handle, _discard_range, _ask_device,
#   _reserve_kept, _alloc_from_reserve, _map_new_chunks, _destroy_event, _retry_orphans
#
# Owns Allocator.orphans (OrphanRoom, _structs.h), written only here (_release_handle, _discard_range,
# _destroy_event, _retry_orphans), and the call counters of the statistics (_call).


cdef int _call(Allocator self, Failure* why, int kind, int rc, uint64_t handles) noexcept nogil:
    self.st.calls[kind] += 1
    self.st.handles[kind] += handles
    if rc != DRIVER_OK and rc != DRIVER_OOM and why.err == ERR_NONE:
        why.err = ERR_DRIVER
        why.code = rc
        why.call = kind
    return rc


cdef bint _unannounced_capture(Allocator self, Failure* why) noexcept nogil:
    """Is the request's stream under a graph capture nobody told the allocator of? Asked before the request's first
    driver call, once per request; True means the request must make none (a caller that then fails sets
    ERR_RAW_CAPTURE).

    Note [Unannounced capture]: an extension may call cudaStreamBeginCapture itself, without beginAllocateToPool.
    A synchronize or an event on a capturing stream would break that capture, and memory mapped or stitched for it
    would be handed out again while the graph still uses it, so a request that needs the driver fails with
    ERR_RAW_CAPTURE, naming the cause, before any driver call. A request served from memory already mapped makes no
    driver call and is not checked: asking the driver on every cache hit would double its cost (PyTorch's own
    allocator does not check either). A request that polls record_stream's deferred frees (cuEventQuery) asks
    too, so while such frees are pending every request asks once; stats()["capture_queries"] counts the questions.
    An announced capture (_capturing(), room pools) has its own rules."""
    cdef bint capturing = False
    cdef Request* request = why.request
    if _capturing(self) or request == NULL:      # only a request (malloc) asks the driver for new memory
        return False
    if request.capture_check == CAPTURE_UNCHECKED:
        self.st.capture_queries += 1
        # A failed query is taken as a capture: cuStreamIsCapturing itself fails on the legacy default stream while
        # another stream captures in global mode.
        if self.driver.stream_capturing(request.stream, &capturing) != DRIVER_OK or capturing:
            request.capture_check = CAPTURE_FOUND
        else:
            request.capture_check = CAPTURE_CLEAR
    return request.capture_check == CAPTURE_FOUND


cdef bint _refuse_unannounced_capture(Allocator self, Failure* why) noexcept nogil:
    """_unannounced_capture for a step that cannot go on without the driver: it fails with ERR_RAW_CAPTURE."""
    if _unannounced_capture(self, why):
        why.err = ERR_RAW_CAPTURE
        return True
    return False


cdef int _sync(Allocator self, Failure* why) noexcept nogil:
    return _call(self, why, CALL_SYNC, self.driver.synchronize(), 0)


cdef void _release_handle(Allocator self, Failure* why, uint64_t handle, size_t size) noexcept nogil:
    """Give a chunk back to the driver; if the driver refuses, keep it as an orphan to retry later, so nothing
    leaks (it still counts in the driver's memory, not in reserved)."""
    cdef OrphanChunk orphan
    if _call(self, why, CALL_RELEASE, self.driver.release_chunk(handle, size), 1) != DRIVER_OK:
        orphan.handle = handle
        orphan.size = size
        self.orphans.chunks.push_back(orphan)


cdef void _discard_range(Allocator self, Failure* why, uintptr_t va, size_t size, size_t mapped, size_t handles,
                         bint release_va) noexcept nogil:
    """Unmap the first `mapped` bytes of a range and free its reservation (if `release_va`); what the driver
    refuses becomes an orphan to retry."""
    cdef OrphanRange orphan
    orphan.va = va
    orphan.size = size
    orphan.mapped = mapped
    orphan.handles = handles
    orphan.release_va = release_va
    if mapped and _call(self, why, CALL_UNMAP, self.driver.unmap(va, mapped), handles) != DRIVER_OK:
        self.orphans.ranges.push_back(orphan)
        return
    orphan.mapped = 0
    orphan.handles = 0
    if release_va and _call(self, why, CALL_FREE_VA, self.driver.free_va(va, size), 0) != DRIVER_OK:
        self.orphans.ranges.push_back(orphan)


cdef bint _reserve_binds(Allocator self, size_t size) noexcept nogil:
    """Would `size` new bytes leave the device less free than the reserve it keeps now (_reserve_kept)? Never where
    a cap binds (the cap is the limit) or a capture runs (it cannot relieve pressure: it takes the reserve at once),
    nor where the driver cannot say (growth goes on as without a reserve).

    Note [Leaving the libraries room]: the device's memory is shared with the process's other users, and some
    allocate late: cuDNN compiles and loads kernels for new shapes (cuLibraryLoadData), cuBLAS makes a handle and
    its workspace per thread, NCCL its buffers. An allocator that takes the device's last free bytes before they
    have what they need makes them fail outside any allocator, where no pressure stage can help (a cuDNN attention
    backward failing with cuLibraryLoadData: out of memory, where expandable segments trained).
    - What is kept: growth that would leave the device less free than the reserve fails softly. The request goes
      through every pressure stage first, which gives cached free memory back to the device, and takes the reserve
      only when they made no room (_malloc_under_pressure), so a request the device has room for still
      gets it, and the libraries find free what the allocator had cached.
    - How it is measured: each time growth asks the device what is free (cuMemGetInfo, at growth and at the edge
      only, never on a cache hit) the allocator adds its own reserved bytes: what is within its reach. A drop since
      the last ask is memory someone else took meanwhile, the libraries' rise. The reserve is the largest such
      rise (with libraries_half_life set), never less than device_reserve, a floor for kernels loaded one at a
      time.
    - When it is updated: every ask. A rise at least as large as the measured reserve sets it; after
      libraries_half_life asks without one it halves. The large rises are one-time: a cuBLAS handle and workspace
      per thread (the autograd engine's comes with the first backward), cuDNN's at its first call; later rises
      are kernels for new shapes, far smaller. So the reserve is large while a run is setting up, when more of
      the same may follow (another thread's handle), and falls back to the floor as the run settles, when keeping
      a set-up's rise would cost a job at the edge that much of its fit. A rise by another process counts the
      same, and decays the same.
    - What it costs: a larger reserve sends growth near the device's edge through the pressure stages sooner
      (driver time, and a layout that may pack worse). The half-life and the floor are measured in
      docs/benchmarks.md, "The libraries' room, measured". A model driver answers its capacity less its live
      chunks and less what the replayed trace holds outside the allocator, so replay measures and decides the
      same."""
    cdef size_t free = 0
    if _cap_binds(self) or _capturing(self) or _ask_device(self, &free) != DRIVER_OK:
        return False
    return free < size + _reserve_kept(self)


cdef int _ask_device(Allocator self, size_t* free) noexcept nogil:
    """The device's free bytes (the driver's answer, cuMemGetInfo on the GPU), and the libraries' rise since the
    last ask, measured (Note [Leaving the libraries room]). Growth's only way to ask the device what is free."""
    cdef int rc = self.driver.device_free(free)
    cdef LibrariesRoom* lib = &self.libraries
    cdef size_t within_reach, rise, i
    if rc != DRIVER_OK or free[0] >= <size_t>-1 - self.st.reserved:
        return rc                                   # no answer, or a model with no bound: nothing to measure
    within_reach = free[0] + self.st.reserved
    for i in range(self.orphans.chunks.size()):     # held by the allocator still, though no longer reserved
        within_reach += self.orphans.chunks[i].size
    lib.asks += 1
    lib.quiet_asks += 1
    if lib.within_reach and within_reach < lib.within_reach:
        rise = lib.within_reach - within_reach
        lib.rises += 1
        if rise > lib.largest_rise:
            lib.largest_rise = rise
        if rise >= lib.measured:
            lib.measured = rise
            lib.quiet_asks = 0
    if self.k.libraries_half_life and lib.quiet_asks >= self.k.libraries_half_life:
        lib.measured //= 2
        lib.quiet_asks = 0
    lib.within_reach = within_reach
    return rc


cdef inline size_t _reserve_kept(Allocator self) noexcept nogil:
    """The device reserve growth keeps now: the libraries' measured rise (with libraries_half_life set), at least
    device_reserve; 0 while a request has it open (_alloc_from_reserve). With _reserve_binds, _ask_device and
    _alloc_from_reserve, the only readers of device_reserve, reserve_open and the libraries' measure: the rule
    lives here (Note [Leaving the libraries room])."""
    if self.reserve_open:
        return 0
    if self.k.libraries_half_life and self.libraries.measured > self.k.device_reserve:
        return self.libraries.measured
    return self.k.device_reserve


cdef Block* _alloc_from_reserve(Allocator self, Failure* why, int size_class, size_t size,
                                int64_t stream) noexcept nogil:
    """Serve a request for which relief ran out with the device reserve open: the last memory a request may have.
    The reserve closes again as the call returns, so it is open for this one request only."""
    cdef Block* b
    self.reserve_open = True
    b = _malloc_try(self, why, size_class, size, stream)
    self.reserve_open = False
    return b


cdef int _map_new_chunks(Allocator self, Failure* why, uintptr_t va, size_t n, size_t chunk_size,
                         vector[uint64_t]& handles, size_t va_size, bint release_va, bint held) noexcept nogil:
    """Create `n` chunks and map them back to back from `va`, then grant access to the run in one call; on success
    `handles` holds them in order. On failure nothing is left behind: what was mapped is unmapped (and the range's
    reservation of `va_size` bytes freed, if `release_va`), every chunk created is released, `handles` is empty and
    why.err is ERR_OOM where the driver ran out of memory. Returns the driver's code. The one place new memory is
    created and mapped (a segment mapped at once, pages mapped onto an expandable range's hole, a failed re-back's
    chunk mapped again). `held`: the bytes replace memory the allocator held a moment ago, which the device reserve
    never refuses (Note [Leaving the libraries room]: the reserve bounds growth, and restoring a chunk whose live
    bytes wait on the host is not growth; refused, those bytes would be lost)."""
    cdef size_t i, mapped
    cdef uint64_t handle = 0
    cdef int rc = DRIVER_OK
    handles.clear()
    if n and not held and _reserve_kept(self) and _reserve_binds(self, n * chunk_size):
        if why.err == ERR_NONE:         # the first failure is the call's (Note [A call's failure])
            why.err = ERR_OOM
        _discard_range(self, why, va, va_size if release_va else 0, 0, 0, release_va)
        return DRIVER_OOM
    for i in range(n):
        rc = _call(self, why, CALL_CREATE, self.driver.create_chunk(chunk_size, &handle), 1)
        if rc == DRIVER_OK:
            rc = _call(self, why, CALL_MAP, self.driver.map(va + i * chunk_size, chunk_size, handle), 1)
            if rc != DRIVER_OK:
                _release_handle(self, why, handle, chunk_size)
        if rc != DRIVER_OK:
            break
        handles.push_back(handle)
    if rc == DRIVER_OK and n:
        # cuMemSetAccess is priced per handle in the range, so one call over the run costs what n calls would
        rc = _call(self, why, CALL_SET_ACCESS, self.driver.set_access(va, n * chunk_size), n)
    if rc == DRIVER_OK:
        return rc
    if rc == DRIVER_OOM and why.err == ERR_NONE:
        why.err = ERR_OOM
    mapped = handles.size() * chunk_size
    _discard_range(self, why, va, va_size if release_va else mapped, mapped, handles.size(), release_va)
    for i in range(handles.size()):
        _release_handle(self, why, handles[i], chunk_size)
    handles.clear()
    return rc


cdef void _destroy_event(Allocator self, Failure* why, uint64_t event) noexcept nogil:
    if _call(self, why, CALL_EVENT_DESTROY, self.driver.destroy_event(event), 0) != DRIVER_OK:
        self.orphans.events.push_back(event)


cdef size_t _retry_orphans(Allocator self, Failure* why) noexcept nogil:
    """Try again to return what the driver refused earlier. Returns how many are still held."""
    cdef vector[OrphanChunk] chunks
    cdef vector[OrphanRange] ranges
    cdef vector[uint64_t] events
    cdef size_t i
    chunks.swap(self.orphans.chunks)
    ranges.swap(self.orphans.ranges)
    events.swap(self.orphans.events)
    for i in range(ranges.size()):
        _discard_range(self, why, ranges[i].va, ranges[i].size, ranges[i].mapped, ranges[i].handles,
                            ranges[i].release_va)
    for i in range(chunks.size()):
        _release_handle(self, why, chunks[i].handle, chunks[i].size)
    for i in range(events.size()):
        _destroy_event(self, why, events[i])
    return self.orphans.count()
