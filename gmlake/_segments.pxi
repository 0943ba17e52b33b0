# The allocator core, room "segments": segments and their handles: create (with rollback), release free chunks, drop;
# memory pressure.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds and, where it can
# fail, the call's Failure (Note [A call's failure]).
#
# Owns Allocator.segments (SegmentRoom, _structs.h): every segment by serial, and the serials segments and sBlocks
# take (_new_serial). A segment's blocks are the blocks room's (_first_block, _forget_blocks); a private pool's
# count of its segments is the pools room's (_pool_gained_segment, _pool_lost_segment).


cdef Segment* _new_segment(Allocator self, Failure* why, int size_class, size_t size, size_t chunk_size, int64_t stream,
                           bint mapped) noexcept nogil:
    """Reserve VA and map fresh chunks into it (unless not `mapped`: then the whole range is one unmapped hole,
    as an expandable segment starts). NULL with why.err set on failure; nothing is left behind."""
    cdef size_t n = size // chunk_size if mapped else 0
    cdef uintptr_t va = 0
    cdef int rc
    cdef vector[uint64_t] handles
    if mapped and self.limit_bytes and self.st.reserved + size > self.limit_bytes:
        why.err = ERR_OOM
        return NULL
    if _refuse_unannounced_capture(self, why):
        return NULL
    rc = _call(self, why, CALL_RESERVE, self.driver.reserve(size, self.driver.granularity, &va), 0)
    if rc != DRIVER_OK:
        if rc == DRIVER_OOM:
            why.err = ERR_OOM
        return NULL
    if _map_new_chunks(self, why, va, n, chunk_size, handles, size, True) != DRIVER_OK:
        return NULL                 # the reservation is freed too
    cdef Segment* seg = new Segment()
    seg.serial = _new_serial(self)
    seg.va = va
    seg.size = size
    seg.chunk_size = chunk_size
    seg.size_class = size_class
    seg.under_cap = _cap_binds(self)
    seg.free_index = free_index(self, size_class)
    if mapped:
        seg.handles = handles
    else:
        seg.handles.assign(size // chunk_size, 0)
    seg.sblock_maps.assign(size // chunk_size, 0)
    seg.mapped_chunks = n
    _first_block(self, seg, stream, mapped)
    self.segments.by_serial[seg.serial] = seg
    self.st.segments_created += 1
    if not mapped:
        return seg
    self._record(TRACE_SEGMENT_ALLOC, va, size, stream)
    self.st.reserved += size
    peak_update(&self.st.peak_reserved, self.st.reserved)
    return seg


cdef inline uint64_t _new_serial(Allocator self) noexcept nogil:
    """The next serial of the creation order segments and sBlocks share (it orders free blocks the same way on
    every driver)."""
    cdef uint64_t serial = self.segments.next_serial
    self.segments.next_serial += 1
    return serial


cdef size_t _release_chunks(Allocator self, Failure* why, Segment* seg, size_t wanted) noexcept nogil:
    """Return to the driver chunks of seg that lie wholly in free blocks and that no sBlock maps, until
    `wanted` bytes are released (0: all). The caller has synchronized. Returns the bytes released."""
    cdef size_t C = seg.chunk_size
    cdef size_t released = 0
    cdef size_t first, end, i, j, k
    cdef Block* b = seg.first
    cdef Block* nxt
    cdef Block* hole
    cdef uintptr_t lo, hi
    cdef int rc
    while b != NULL and (wanted == 0 or released < wanted):
        nxt = b.next
        if b.state == BLOCK_FREE:
            first = (b.addr - seg.va + C - 1) // C
            end = (b.addr + b.size - seg.va) // C
            i = first
            while i < end:
                if seg.sblock_maps[i] != 0:
                    i += 1
                    continue
                j = i
                while j < end and seg.sblock_maps[j] == 0:
                    j += 1
                lo = seg.va + i * C
                hi = seg.va + j * C
                rc = _call(self, why, CALL_UNMAP, self.driver.unmap(lo, hi - lo), j - i)
                if rc != DRIVER_OK:
                    return released
                for k in range(i, j):
                    _release_handle(self, why, seg.handles[k], C)
                    seg.handles[k] = 0
                    self.st.chunks_released += 1
                seg.mapped_chunks -= j - i
                self._record(TRACE_SEGMENT_UNMAP, lo, hi - lo, b.stream)
                self.st.reserved -= hi - lo
                released += hi - lo
                # Carve the hole out of b: [b.addr, lo) stays free, [lo, hi) becomes unmapped.
                _erase_free(self, b)
                hole = b
                if lo > b.addr:
                    hole = _split(self, b, lo - b.addr)
                    _insert_free(self, b)
                if hole.addr + hole.size > hi:
                    nxt = _split(self, hole, hi - hole.addr)
                    _insert_free(self, nxt)
                hole.state = BLOCK_UNMAPPED
                hole = _merge_holes(self, hole)
                _insert_hole(self, hole)
                nxt = hole.next
                break   # continue from the block after the hole
        b = nxt
    if seg.mapped_chunks == 0:
        _drop_segment(self, why, seg)
    return released


cdef void _drop_segment(Allocator self, Failure* why, Segment* seg) noexcept nogil:
    """Forget a segment whose chunks are all released; frees its VA."""
    _forget_blocks(self, seg)
    _discard_range(self, why, seg.va, seg.size, 0, 0, True)
    self.segments.by_serial.erase(seg.serial)
    if seg.owner != NULL:
        _pool_lost_segment(self, seg.owner, seg)
    del seg


cdef size_t _release_free(Allocator self, Failure* why, int size_class, size_t wanted, int reason) noexcept nogil:
    """Release fully free chunks of `size_class` (large: evicting cached sBlocks first, for `reason`, an EvictReason).
    The caller has synchronized."""
    cdef vector[Segment*] segs
    cdef pair[uint64_t, Segment*] entry
    cdef size_t released = 0, i
    if size_class == SIZE_LARGE and self.sblock_cache.cached():
        if _evict_lru(self, why, 0, True, reason) != DRIVER_OK:
            return 0
    for entry in self.segments.by_serial:
        if entry.second.size_class == size_class and _releasable(entry.second):
            segs.push_back(entry.second)
    for i in range(segs.size()):
        if segs[i].owner != NULL:
            _merge_whole(self, segs[i])
        released += _release_chunks(self, why, segs[i], 0 if wanted == 0 else wanted - released)
        if wanted and released >= wanted:
            break
    return released


cdef bint _relieve(Allocator self, Failure* why, int size_class, size_t size, int action) noexcept nogil:
    """Step 5, one attempt: carry out a PressureAction (the growth's built-in stage, or what the policy's
    relieve_pressure chose). Each action first waits for every stream, so every free block serves any stream;
    "release_other_pool" then returns what the other size class holds free, "release_all" everything free. True if
    anything changed."""
    cdef size_t changed
    why.err = ERR_NONE
    changed = _reclaim_streams(self, why, ANY_STREAM, True)
    if why.err != ERR_NONE:
        return False
    if action == PRESSURE_RELEASE_OTHER:
        changed += _release_free(self, why, SIZE_LARGE if size_class == SIZE_SMALL else SIZE_SMALL, size, EVICT_PRESSURE)
    elif action == PRESSURE_RELEASE_ALL:
        # the small size class first, then the large (its cached sBlocks evicted, then its chunks): two statements,
        # since C leaves the order of a sum's operands open, and an evict_victim hook sees which came first
        changed += _release_free(self, why, SIZE_SMALL, 0, EVICT_PRESSURE)
        changed += _release_free(self, why, SIZE_LARGE, 0, EVICT_PRESSURE)
    return changed > 0 and why.err == ERR_NONE
