# The allocator core, room "pools": private memory pools, as PyTorch's CUDA graphs use them (its PrivatePool,
# beginAllocateToPool, endAllocateToPool, releasePool), and what graph capture forbids.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds and, where it can
# fail, the call's Failure (Note [A call's failure]).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _index_of, _capturing, _any_pool_active, _active_pool, _pool_lost_segment, _pool_for, _alloc_in_pool, _defer_uses,
#   _begin_pool, _retain_pool, _end_pool, _releasable, _merge_whole, _release_private_pool
#
# Note [Private pools]: a graph replays the addresses it was captured with, so the memory it used must stay its own
# for the graph's life. While a pool is active for a stream, that stream's requests are served from the pool's own
# free index and segments, and a pool block's free returns it to that index (each segment points at its pool's
# index). The default pool never sees a pool's blocks: they are in no default index, so best fit, stitching,
# migration and the sBlock cache cannot find them, and _release_pool skips pool segments while the pool has users.
#   - No stitching inside a pool: an sBlock is cached and evicted (unmapped) under the default pool's rules, and a
#     graph keeps its addresses for its whole life; a pool grows by whole segments instead, as PyTorch's do. Its
#     segments are never unmapped in part either, so a pool's address space only grows while it lives.
#   - Several begins share a pool: each begin counts a use, each release_pool drops one; the last release returns
#     the pool's wholly free segments (after a synchronize: replays may still run). Blocks still allocated at that
#     moment stay valid, as in PyTorch: their frees go back to the released pool, whose segments return to the
#     driver as they become wholly free, at the next empty_cache or memory pressure (both synchronize first). The
#     pool is forgotten with its last segment; until then it cannot be begun again.
#
# Note [Pools and graph capture]: during stream capture (cudaStreamCaptureModeGlobal, PyTorch's default) a call
# that would wait on or query work of a capturing stream invalidates the capture: cuCtxSynchronize, and
# cuEventRecord / cuEventQuery on a capturing stream (an event recorded inside a capture is a graph node and cannot
# be queried). The VMM calls (cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess) are synchronous and order
# no stream work, so a pool may grow during capture, as PyTorch's cudaMalloc does (it switches the thread to
# relaxed capture mode around the call: the torch wiring must do the same around gmlake's growth). So while any
# pool is capturing (`capturing` > 0), for every request, since capture mode is global:
#   - no event is recorded or queried: pending frees are not polled, stream fences are not taken, and a free with
#     other streams' uses (record_stream) waits in deferred_frees until the last capture ends, as PyTorch defers
#     them;
#   - nothing synchronizes: memory pressure is not relieved (its every stage synchronizes) and the sBlock cache is
#     not trimmed to its bound; a request that finds no memory without them fails with ERR_CAPTURE, the allocator
#     unchanged; empty_cache fails the same way;
#   - a pool block freed during capture serves the pool's next request on its stream at once: the graph orders
#     the work, as PyTorch's stream-keyed reuse does.
# Unmapping or releasing is never needed on a capturing pool's behalf: its memory only grows while it lives.
#
# Owns Allocator.pools (PoolRoom, _structs.h): the pools by id, the active ones, how many capture, and the frees
# deferred during capture; and each PrivatePool's fields (its free index: its blocks enter and leave it through the
# blocks room). Only the functions here write them. Other rooms ask _capturing() whether a capture runs, and tell a
# pool of its segments through _pool_gained_segment and _pool_lost_segment.

cdef enum PoolStatus:
    POOL_OK = 0
    POOL_ALREADY_ACTIVE
    POOL_RELEASED
    POOL_NOT_ACTIVE
    POOL_UNKNOWN
    POOL_STILL_ACTIVE
    POOL_SYNC_FAILED


cdef inline FreeIndex* _index_of(Allocator self, Block* b) noexcept nogil:
    """The free index that holds b while it is free: its private pool's, or the default pool's (the segment keeps
    a pointer to it, so a free pays no branch for pools)."""
    return b.seg.free_index


cdef inline bint _capturing(Allocator self) noexcept nogil:
    """Is a graph captured into a pool now (Note [Pools and graph capture])? The one question other rooms ask of
    the pools room's state: no event or synchronize call while it is so."""
    return self.pools.capturing != 0


cdef inline bint _any_pool_active(Allocator self) noexcept nogil:
    """Is any private pool active (so that a request asks _pool_for which serves it)?"""
    return self.pools.active.size() != 0


cdef PrivatePool* _active_pool(Allocator self, uint64_t pool_id) noexcept nogil:
    """Active pool `pool_id`, or NULL if it is not active (malloc_in_pool_nogil's target)."""
    it = self.pools.by_id.find(pool_id)
    if it == self.pools.by_id.end() or not deref(it).second.active:
        return NULL
    return deref(it).second


cdef void _pool_gained_segment(Allocator self, PrivatePool* p, Segment* seg) noexcept nogil:
    """seg is p's now: its free blocks go to p's free index."""
    seg.owner = p
    seg.free_index = &p.free_small if seg.size_class == SIZE_SMALL else &p.free_large
    p.segments += 1
    p.reserved += seg.size


cdef void _pool_lost_segment(Allocator self, PrivatePool* p, Segment* seg) noexcept nogil:
    """p's segment seg was dropped; a released pool is forgotten with its last segment."""
    p.segments -= 1
    p.reserved -= seg.size
    if p.use_count == 0 and p.segments == 0:
        _forget_pool(self, p)


cdef PrivatePool* _pool_for(Allocator self, int64_t stream) noexcept nogil:
    """The active pool that serves `stream` (the first begun whose streams hold it), or NULL: the default pool."""
    cdef size_t i, j
    cdef PrivatePool* p
    for i in range(self.pools.active.size()):
        p = self.pools.active[i]
        if p.all_streams:
            return p
        for j in range(p.streams.size()):
            if p.streams[j] == stream:
                return p
    return NULL


cdef Block* _alloc_in_pool(Allocator self, Failure* why, int kind, size_t size, int64_t stream) noexcept nogil:
    """Serve a request from its private pool (its Request's target): best fit among the pool's free blocks of
    `stream`, else a new segment of its own (never a stitch: Note [Private pools])."""
    cdef PrivatePool* p = why.request.target
    cdef Block* b = _peek_fit(self, &p.free_small if kind == SIZE_SMALL else &p.free_large, size, stream)
    cdef Segment* seg
    cdef size_t segment_size, handle_size
    if b != NULL:
        _erase_free(self, b)
        return _take(self, why, b, size, stream)
    # A pool's segments are fixed: each strategy says how it lays one out (under the expandable growth PyTorch's
    # sizes, one chunk per segment: its ranges grow in place per stream, and in whole 20 MiB pages a 22 MiB request
    # would take 40 MiB).
    self.growth.private_layout(self, kind, size, &segment_size, &handle_size)
    seg = _laid_out_segment(self, why, kind, size, segment_size, handle_size, stream)
    if seg == NULL:
        return NULL
    _pool_gained_segment(self, p, seg)
    return _take(self, why, seg.first, size, stream)


cdef void _defer_uses(Allocator self, Block* b, vector[int64_t]& streams) noexcept nogil:
    """A free with other streams' uses during capture: no event may be recorded now, so it waits, still active,
    until the last capture ends (Note [Pools and graph capture])."""
    cdef PendingFree pend
    pend.block = b
    pend.streams = streams
    self.pools.deferred_frees.push_back(pend)


cdef void _end_capture(Allocator self, Failure* why) noexcept nogil:
    """The last capture ended: the frees deferred during it record their events now."""
    cdef vector[PendingFree] deferred
    cdef size_t i
    deferred.swap(self.pools.deferred_frees)
    for i in range(deferred.size()):
        _await_uses(self, why, deferred[i].block, deferred[i].streams)


cdef int _begin_pool(Allocator self, uint64_t pool_id, vector[int64_t]& streams, bint all_streams,
                     bint capturing) noexcept nogil:
    cdef PrivatePool* p
    it = self.pools.by_id.find(pool_id)
    if it == self.pools.by_id.end():
        p = new PrivatePool()
        p.id = pool_id
        p.use_count = 1
        self.pools.by_id[pool_id] = p
    else:
        p = deref(it).second
        if p.active:
            return POOL_ALREADY_ACTIVE
        if p.use_count == 0:
            return POOL_RELEASED
        p.use_count += 1
    p.active = True
    p.capturing = capturing
    p.all_streams = all_streams
    p.streams = streams
    self.pools.active.push_back(p)
    if capturing:
        self.pools.capturing += 1
    return POOL_OK


cdef int _retain_pool(Allocator self, uint64_t pool_id) noexcept nogil:
    it = self.pools.by_id.find(pool_id)
    if it == self.pools.by_id.end() or not deref(it).second.active:
        return POOL_NOT_ACTIVE
    deref(it).second.use_count += 1
    return POOL_OK


cdef int _end_pool(Allocator self, Failure* why, uint64_t pool_id) noexcept nogil:
    cdef size_t i
    it = self.pools.by_id.find(pool_id)
    if it == self.pools.by_id.end() or not deref(it).second.active:
        return POOL_NOT_ACTIVE
    cdef PrivatePool* p = deref(it).second
    for i in range(self.pools.active.size()):
        if self.pools.active[i] == p:
            self.pools.active.erase(self.pools.active.begin() + i)
            break
    p.active = False
    p.streams.clear()
    if p.capturing:
        p.capturing = False
        self.pools.capturing -= 1
        if self.pools.capturing == 0:
            _end_capture(self, why)
    return POOL_OK


cdef bint _wholly_free(Segment* seg) noexcept nogil:
    cdef Block* b = seg.first
    while b != NULL:
        if b.state != BLOCK_FREE:
            return False
        b = b.next
    return True


cdef bint _releasable(Segment* seg) noexcept nogil:
    """May _release_pool return seg's free chunks? A default-pool segment: yes. A private pool's: only whole, once
    the pool is released (its blocks all free), so a live pool is never unmapped and never holds holes."""
    return seg.owner == NULL or (seg.owner.use_count == 0 and _wholly_free(seg))


cdef void _merge_whole(Allocator self, Segment* seg) noexcept nogil:
    """A released pool's wholly free segment becomes one free block of no stream (the caller has synchronized),
    so its chunks are released together."""
    cdef Block* b = seg.first
    while b != NULL:
        _erase_free(self, b)
        b.stream = ANY_STREAM
        b = b.next
    b = seg.first
    while b.next != NULL:
        _absorb_next(self, b)
    _insert_free(self, b)


cdef void _forget_pool(Allocator self, PrivatePool* p) noexcept nogil:
    self.pools.by_id.erase(p.id)
    del p


cdef size_t _release_pool_segments(Allocator self, Failure* why, PrivatePool* p) noexcept nogil:
    """Return a released pool's wholly free segments (the caller has synchronized). p may be forgotten (freed) by
    the time this returns. Returns the bytes released."""
    cdef vector[Segment*] segs
    cdef pair[uint64_t, Segment*] entry
    cdef size_t released = 0, i
    for entry in self.segments.by_serial:
        if entry.second.owner == p and _wholly_free(entry.second):
            segs.push_back(entry.second)
    for i in range(segs.size()):
        _merge_whole(self, segs[i])
        released += _release_chunks(self, why, segs[i], 0)
    return released


cdef int _release_private_pool(Allocator self, Failure* why, uint64_t pool_id, size_t* released) noexcept nogil:
    """Drop one use of a pool; the last returns its wholly free segments now, unless a capture is running (then at
    the next empty_cache or memory pressure)."""
    released[0] = 0
    it = self.pools.by_id.find(pool_id)
    if it == self.pools.by_id.end() or deref(it).second.use_count == 0:
        return POOL_UNKNOWN
    cdef PrivatePool* p = deref(it).second
    if p.active:
        return POOL_STILL_ACTIVE
    p.use_count -= 1
    if p.use_count > 0:
        return POOL_OK
    if p.segments == 0:
        _forget_pool(self, p)
        return POOL_OK
    if _capturing(self):
        return POOL_OK
    # Replays of the pool's graphs may still be queued: wait for them before unmapping.
    why.err = ERR_NONE
    if _sync(self, why) != DRIVER_OK:
        return POOL_SYNC_FAILED
    released[0] = _release_pool_segments(self, why, p)
    return POOL_SYNC_FAILED if why.err != ERR_NONE else POOL_OK
