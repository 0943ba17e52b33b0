# The allocator core, room "streams": stream ordering: fences that hand other streams' free blocks over, frees
# deferred by record_stream, and the events all of them record.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds and, where it can
# fail, the call's Failure (Note [A call's failure]).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _destroy_spare_events, _may_reclaim, _reclaim_streams, _wait_for_other_stream, _process_pending, _note_stream_use,
#   _has_pending, _free_after_uses, _await_uses
#
# Owns Allocator.streams (StreamRoom, _structs.h), as RMM's stream_ordered_memory_resource owns stream ordering:
# the fences, the streams each live pointer was used on (record_stream), the frees pending on their events and the
# spare events. Only the functions here write it; the entry points call _note_stream_use, _free_after_uses,
# _has_pending and _process_pending, the pools room _await_uses when a capture ends.


cdef enum:
    MAX_SPARE_EVENTS = 1024


cdef int _record_event(Allocator self, Failure* why, int64_t stream, uint64_t* event) noexcept nogil:
    """Record an event on `stream` into *event: a spare one recorded again where one is kept, else a new one.

    Note [Reusing events]: a fence, a wait on another stream and a record_stream'ed free each need an event, used
    once: queried until done, or waited on once. Creating one per use and destroying it after costs a
    cuEventCreate and a cuEventDestroy per use, which FSDP pays thousands of times a step; PyTorch's allocator keeps
    its events in a pool instead. So does this one: an event nothing waits on any more is kept (up to
    MAX_SPARE_EVENTS) and recorded again. That is safe once it is done or once a wait has been issued on it, the
    only two ways the core lets go of one: cuStreamWaitEvent orders the stream after the event's record at the time
    of the call, which a later record does not move. empty_cache and close destroy the spares."""
    cdef uint64_t spare = 0
    if not self.streams.spare_events.empty():
        spare = self.streams.spare_events.back()
        self.streams.spare_events.pop_back()
    event[0] = spare
    cdef int rc = _call(self, why, CALL_EVENT_RECORD, self.driver.record_event(stream, event), 0)
    if rc != DRIVER_OK and spare != 0:
        _destroy_event(self, why, spare)        # a spare the driver refused is not offered again
        event[0] = 0
    return rc


cdef void _release_event(Allocator self, Failure* why, uint64_t event) noexcept nogil:
    """An event nothing will query or wait on again: kept for the next record, or destroyed past the bound."""
    if self.streams.spare_events.size() < MAX_SPARE_EVENTS:
        self.streams.spare_events.push_back(event)
    else:
        _destroy_event(self, why, event)


cdef void _destroy_spare_events(Allocator self, Failure* why) noexcept nogil:
    cdef vector[uint64_t] spares
    cdef size_t i
    spares.swap(self.streams.spare_events)
    for i in range(spares.size()):
        _destroy_event(self, why, spares[i])


cdef inline size_t _migrate(Allocator self, int64_t stream, uint64_t upto) noexcept nogil:
    """Blocks freed on `stream` (all streams but ANY when stream == ANY) at or before free_seq `upto`
    become usable by any stream."""
    return _migrate_to(self, stream, upto, ANY_STREAM)


cdef size_t _migrate_to(Allocator self, int64_t stream, uint64_t upto, int64_t to) noexcept nogil:
    """Blocks freed on `stream` (all streams but ANY when stream == ANY) at or before free_seq `upto`
    become blocks of stream `to` (ANY: of every stream)."""
    cdef vector[Block*] moving
    cdef FreeIndex.iterator it
    cdef FreeIndex* index
    cdef int size_class
    cdef Block* b
    cdef size_t i
    for size_class in range(2):
        index = free_index(self, size_class)
        if stream == ANY_STREAM:
            it = index.begin()
        else:
            it = index.lower_bound(free_key(stream, 0))
        while it != index.end():
            b = deref(it).second
            if stream != ANY_STREAM and b.stream != stream:
                break
            if b.stream != ANY_STREAM and b.free_seq <= upto:
                moving.push_back(b)
            inc(it)
    # Adjacent free blocks of one stream are always merged, so merging never deletes a block still queued here.
    for i in range(moving.size()):
        b = moving[i]
        _erase_free(self, b)
        b.stream = to
        _insert_free(self, _coalesce(self, b))
    self.st.stream_migrations += moving.size()
    return moving.size()


cdef inline bint _may_reclaim(Allocator self, Failure* why) noexcept nogil:
    """May a request fence other streams' frees now? Not under a capture, announced or not: it records events."""
    return not _capturing(self) and not _unannounced_capture(self, why)


cdef size_t _reclaim_streams(Allocator self, Failure* why, int64_t stream, bint wait) noexcept nogil:
    """Make blocks other streams freed usable by `stream` once their work is done. With wait, synchronize
    and make every free block usable by any stream. Returns how many blocks moved."""
    cdef FreeIndex* index
    cdef FreeIndex.iterator it
    cdef int size_class, rc
    cdef int64_t s
    cdef Fence fence
    cdef vector[int64_t] done
    cdef size_t moved = 0, i
    cdef pair[int64_t, Fence] entry
    if not self.k.cross_stream:
        # Blocks stay with their stream, as in PyTorch; only a synchronize is owed under pressure.
        if wait and _sync(self, why) == DRIVER_OK and self.streams.pending.size():
            moved = self.streams.pending.size()
            _process_pending(self, why)
        return moved
    if wait:
        if _sync(self, why) != DRIVER_OK:
            return 0
        _process_pending(self, why)
        for entry in self.streams.fences:
            _release_event(self, why, entry.second.event)
        self.streams.fences.clear()
        return _migrate(self, ANY_STREAM, _free_clock(self))
    # Fence each other stream that holds free blocks: an event now covers all work queued before its frees.
    for size_class in range(2):
        index = free_index(self, size_class)
        it = index.begin()
        while it != index.end():
            s = deref(it).first.stream
            if s != ANY_STREAM and s != stream and self.streams.fences.count(s) == 0:
                fence.seq = _free_clock(self)
                rc = _record_event(self, why, s, &fence.event)
                if rc != DRIVER_OK:
                    return moved
                self.streams.fences[s] = fence
            it = index.lower_bound(free_key(s + 1, 0))
    for entry in self.streams.fences:
        rc = _call(self, why, CALL_EVENT_QUERY, self.driver.query_event(entry.second.event), 0)
        if rc == EVENT_DONE:
            done.push_back(entry.first)
    for i in range(done.size()):
        fence = self.streams.fences[done[i]]
        moved += _migrate(self, done[i], fence.seq)
        _release_event(self, why, fence.event)
        self.streams.fences.erase(done[i])
    return moved


cdef Block* _wait_for_other_stream(Allocator self, Failure* why, int size_class, size_t size,
                                   int64_t stream) noexcept nogil:
    """With cross_stream_wait: a free block another stream held that fits a request no block of its own stream (or
    of none) fits, made safe for `stream` by a wait on the GPU, with every block that stream had freed; NULL if no
    other stream's block fits, or with why.err set if a driver call failed. The block stays in the free index.

    Note [Waiting for another stream's free block]: a fence (_reclaim_streams) hands another stream's free blocks
    over only once an event says that stream's work is done, which is late whenever the GPU trails the CPU: FSDP's
    rank traces replayed with events completing late (`gmlake replay --event-lag`) reserve markedly more than
    with events done at once. Instead, as RMM's stream_ordered_memory_resource takes a block from another stream, record
    an event on the best-fitting block's stream and make the requesting stream wait for it (cuStreamWaitEvent):
    the GPU orders the request's work after everything the other stream had queued, the CPU waits for nothing, and
    every block that stream had freed now serves the requesting stream (as RMM merges the other stream's free
    list; replayed on FSDP's traces at lags that reserved less than moving the one block, whose stream then grew
    instead). The price is that ordering: work the requesting stream queues from now on cannot overlap
    what the other stream had queued (FSDP's prefetch stream can end up waiting for compute), so the wait is taken
    only where a single block fits, not for a stitch, and only on a miss: a stream that finds a block of its own
    (a prefetching side stream reusing its buffers, say) never waits. The default takes the wait, since over FSDP
    it reserves less at no cost in tokens/s the runs resolve (docs/benchmarks.md, the training suite); gmlake-paper does not (cross_stream_wait=False, as the paper describes). Blocks freed on a stream are used
    only by their stream's work (a record_stream'ed block enters the index once its other streams' events are
    done), so the one event covers all of them."""
    cdef FreeIndex* index = free_index(self, size_class)
    cdef FreeIndex.iterator it = index.begin()
    cdef Block* best = NULL
    cdef Block* b
    cdef int64_t s
    cdef uint64_t event = 0
    cdef int rc
    while it != index.end():
        s = deref(it).first.stream
        if s != ANY_STREAM and s != stream:
            b = _peek_fit(self, index, size, s)
            if b != NULL and (best == NULL or b.size < best.size):
                best = b
        it = index.lower_bound(free_key(s + 1, 0))
    if best == NULL:
        return NULL
    if _record_event(self, why, best.stream, &event) != DRIVER_OK:
        return NULL
    rc = _call(self, why, CALL_EVENT_WAIT, self.driver.wait_event(stream, event), 0)
    _release_event(self, why, event)
    if rc != DRIVER_OK:
        return NULL
    self.st.stream_waits += 1
    cdef uintptr_t addr = best.addr
    _migrate_to(self, best.stream, _free_clock(self), stream)
    return _containing(self, addr)      # merged with the requesting stream's free neighbours, maybe


cdef inline void _count_pending_event_done(Allocator self, int64_t stream) noexcept nogil:
    # operator[] yields a reference; Cython copies the pair an iterator derefs to, so that decrement would be lost
    self.streams.pending_per_stream[stream] -= 1
    if self.streams.pending_per_stream[stream] == 0:
        self.streams.pending_per_stream.erase(stream)


cdef void _process_pending(Allocator self, Failure* why) noexcept nogil:
    """Retire the deferred frees whose events have all completed.

    Note [Polling pending frees]: events on one stream complete in order, so once an event of stream S is found
    incomplete, no later-recorded event of S can be done: each pass queries each stream until its first
    incomplete event, as PyTorch's process_events does, not every pending event (FSDP keeps hundreds pending).
    Completed events are destroyed at once, so no event is queried twice after it is done. That needs the entries
    walked in the order their frees were made: retired entries are compacted out in place, keeping the order (a
    swap-with-last removal would let a newer incomplete event of S hide older completed ones, so that their memory
    stayed pending for many passes while the stream kept busy, and reserved: `python -m bench fsdp-pattern --lag 2`
    shows it, bench/tests/test_fsdp_pattern.py checks the backlog stays small). A pass ends as soon as every stream with
    pending events has shown an incomplete one (`pending_per_stream` counts them), so a request costs a few entries,
    not a walk over hundreds (`python -m bench micro`'s pending300_4KiB times a cache hit with 300 frees pending on
    a busy stream). A skipped event only ever delays a free; it never hands out memory early. Polling only when no
    free block fits (fewer queries) was tried and rejected: on `python -m bench fsdp-pattern` it reserved more, with
    and without a lag, and its priced driver time rose with the stitches: a request that polls late is served a
    worse-fitting block while its best fit still sits pending."""
    cdef size_t i = 0, kept = 0, j, k
    cdef bint busy_stream
    cdef int rc
    cdef vector[int64_t] busy
    cdef PendingFree* entry
    while i < self.streams.pending.size():
        if busy.size() == self.streams.pending_per_stream.size():
            # Every stream with pending events has an incomplete one: nothing further can be done (the common case
            # while the GPU trails the CPU, found in a few entries instead of a walk over hundreds).
            if kept == i:               # nothing retired this pass: the vector stands as it is
                kept = self.streams.pending.size()
                break
            while i < self.streams.pending.size():
                self.streams.pending[kept] = move(self.streams.pending[i])
                kept += 1
                i += 1
            break
        entry = &self.streams.pending[i]
        j = 0
        while j < entry.events.size():
            busy_stream = False
            for k in range(busy.size()):
                if busy[k] == entry.streams[j]:
                    busy_stream = True
                    break
            if busy_stream:
                j += 1
                continue
            rc = _call(self, why, CALL_EVENT_QUERY, self.driver.query_event(entry.events[j]), 0)
            if rc != EVENT_DONE:
                busy.push_back(entry.streams[j])
                j += 1
                continue
            _release_event(self, why, entry.events[j])
            _count_pending_event_done(self, entry.streams[j])
            entry.events.erase(entry.events.begin() + j)       # in order: the entry's events are per stream
            entry.streams.erase(entry.streams.begin() + j)
        if entry.events.empty():
            _free_retire(self, entry.block)
        else:
            if kept != i:
                self.streams.pending[kept] = move(self.streams.pending[i])      # the event vectors move: no copy per pass
            kept += 1
        i += 1
    self.streams.pending.resize(kept)
    why.err = ERR_NONE


cdef int _note_stream_use(Allocator self, uintptr_t ptr, int64_t stream) noexcept nogil:
    """record_stream: `stream` uses the live allocation at ptr, so its free waits for that stream's work
    (ERR_INVALID_FREE if ptr is not live)."""
    cdef size_t i
    it = self.live.find(ptr)
    if it == self.live.end():
        return ERR_INVALID_FREE
    if deref(it).second.stream != stream:
        uses = &self.streams.uses[ptr]
        for i in range(uses.size()):
            if deref(uses)[i] == stream:
                return ERR_NONE
        uses.push_back(stream)
    return ERR_NONE


cdef inline bint _has_pending(Allocator self) noexcept nogil:
    """Do frees wait for other streams' events (so that a request polls them: Note [Polling pending frees])?"""
    return self.streams.pending.size() != 0


cdef inline bint _free_after_uses(Allocator self, Failure* why, Block* b, uintptr_t ptr) noexcept nogil:
    """A free of the live block b at ptr: if other streams used it (record_stream), it waits for their work (for the
    capture to end first, under a capture: _defer_uses) and True; False if it may be retired now."""
    uses = self.streams.uses.find(ptr)
    if uses == self.streams.uses.end():
        return False
    if _capturing(self):
        _defer_uses(self, b, deref(uses).second)
    else:
        _await_uses(self, why, b, deref(uses).second)
    self.streams.uses.erase(uses)
    return True


cdef void _await_uses(Allocator self, Failure* why, Block* b, vector[int64_t]& streams) noexcept nogil:
    """A free whose block other streams used: it returns once events recorded on them now have completed."""
    cdef PendingFree pend
    cdef uint64_t event = 0
    cdef size_t i
    pend.block = b
    for i in range(streams.size()):
        if _record_event(self, why, streams[i], &event) == DRIVER_OK:
            pend.events.push_back(event)
            pend.streams.push_back(streams[i])
            self.streams.pending_per_stream[streams[i]] += 1
        else:
            # No event: the only safe course is to wait for the device.
            _sync(self, why)
    if pend.events.empty():             # waited for the device instead: nothing left to wait for
        _free_retire(self, b)
        return
    self.streams.pending.push_back(pend)
