# The allocator core: the Python API's locked steps, and the rows they copy. Included into _allocator.pyx.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _begin_pool_nogil, _retain_pool_nogil, _end_pool_nogil, _release_pool_nogil, _copy_pools, _copy_pool_ids,
#   _copy_segments, _count_spares, _copy_stats, _reset_peaks, _set_tracing, _copy_history, _copy_units
#
# Each Python method of the Allocator that needs the lock calls one of these without the GIL: it takes the lock (a
# ScopedLock, let go when it returns), copies or changes what the method needs, and returns before any Python object
# is made, so no Python code (a finalizer that frees memory of this allocator, say) ever runs under the lock.

# segments_info's rows, copied under the lock.
cdef struct SegmentRow:
    uint64_t serial
    uint64_t private_pool
    uintptr_t va
    int size_class
    size_t size
    size_t chunk_size
    size_t mapped_chunks
    size_t first_row
    size_t end_row

cdef struct BlockRow:
    size_t offset
    size_t size
    int state
    int64_t stream
    size_t used

# pools_info's rows, copied under the lock; each pool's streams are streams[first_stream:end_stream].
cdef struct PoolRow:
    uint64_t id
    int64_t use_count
    bint active
    bint capturing
    bint all_streams
    size_t first_stream
    size_t end_stream
    size_t segments
    size_t reserved
    size_t allocated

# What stats() and spares copy under the lock.
cdef struct StatsCopy:
    Stats st
    size_t cached
    size_t pending
    size_t orphans
    size_t orphan_bytes
    LibrariesRoom measure            # the libraries' (Note [Leaving the libraries room])
    size_t room_kept

cdef struct Spares:
    size_t blocks
    size_t free_index_nodes
    size_t address_nodes
    size_t live_nodes
    size_t events




cdef int _begin_pool_nogil(Allocator self, uint64_t pool_id, vector[int64_t]& streams, bint all_streams,
                           bint capturing) noexcept nogil:
    cdef ScopedLock held
    held.acquire(self.mutex)
    cdef int rc = _begin_pool(self, pool_id, streams, all_streams, capturing)
    self._debug_check()
    return rc


cdef int _retain_pool_nogil(Allocator self, uint64_t pool_id) noexcept nogil:
    cdef ScopedLock held
    held.acquire(self.mutex)
    return _retain_pool(self, pool_id)


cdef int _end_pool_nogil(Allocator self, Failure* why, uint64_t pool_id) noexcept nogil:
    cdef ScopedLock held
    held.acquire(self.mutex)
    cdef int rc = _end_pool(self, why, pool_id)
    self._debug_check()
    return rc


cdef int _release_pool_nogil(Allocator self, Failure* why, uint64_t pool_id, size_t* released) noexcept nogil:
    cdef ScopedLock held
    held.acquire(self.mutex)
    cdef int rc = _release_private_pool(self, why, pool_id, released)
    self._report(why, why)
    self._debug_check()
    return rc


cdef void _copy_pools(Allocator self, vector[PoolRow]& rows, vector[int64_t]& streams) noexcept nogil:
    """pools_info's rows: each pool, and the bytes its blocks in use hold."""
    cdef ScopedLock held
    cdef unordered_map[uint64_t, size_t] used
    cdef pair[uint64_t, Segment*] sp
    cdef pair[uint64_t, PrivatePool*] pp
    cdef PrivatePool* p
    cdef PoolRow row
    cdef Block* b
    held.acquire(self.mutex)
    for sp in self.segments.by_serial:
        if sp.second.owner != NULL:
            b = sp.second.first
            while b != NULL:
                if b.state != BLOCK_FREE:
                    used[sp.second.owner.id] += b.size
                b = b.next
    for pp in self.pools.by_id:
        p = pp.second
        row.id = p.id
        row.use_count = p.use_count
        row.active = p.active
        row.capturing = p.capturing
        row.all_streams = p.all_streams
        row.first_stream = streams.size()
        streams.insert(streams.end(), p.streams.begin(), p.streams.end())
        row.end_stream = streams.size()
        row.segments = p.segments
        row.reserved = p.reserved
        row.allocated = used[p.id]
        rows.push_back(row)


cdef void _copy_pool_ids(Allocator self, vector[uint64_t]& ids) noexcept nogil:
    """pools_ids' answer: the id of every private pool that exists."""
    cdef ScopedLock held
    cdef pair[uint64_t, PrivatePool*] pp
    held.acquire(self.mutex)
    for pp in self.pools.by_id:
        ids.push_back(pp.first)


cdef void _copy_segments(Allocator self, vector[SegmentRow]& segs, vector[BlockRow]& rows) noexcept nogil:
    """segments_info's rows: each segment, and each of its blocks."""
    cdef ScopedLock held
    cdef SegmentRow seg_row
    cdef BlockRow row
    cdef pair[uint64_t, Segment*] sp
    cdef Block* b
    held.acquire(self.mutex)
    for sp in self.segments.by_serial:
        seg_row.serial = sp.second.serial
        seg_row.private_pool = sp.second.owner.id if sp.second.owner != NULL else 0
        seg_row.va = sp.second.va
        seg_row.size_class = sp.second.size_class
        seg_row.size = sp.second.size
        seg_row.chunk_size = sp.second.chunk_size
        seg_row.mapped_chunks = sp.second.mapped_chunks
        seg_row.first_row = rows.size()
        b = sp.second.first
        while b != NULL:
            row.offset = b.addr - sp.second.va
            row.size = b.size
            row.state = b.state
            row.stream = b.stream
            # A claimed piece's bytes are all in use by its stitched allocation.
            row.used = b.requested if b.state == BLOCK_ALLOCATED else b.size if b.state == BLOCK_CLAIMED else 0
            rows.push_back(row)
            b = b.next
        seg_row.end_row = rows.size()
        segs.push_back(seg_row)


cdef void _count_spares(Allocator self, Spares* n) noexcept nogil:
    cdef ScopedLock held
    held.acquire(self.mutex)
    n.blocks = self.frees.spare_blocks.held()
    n.free_index_nodes = self.frees.index_nodes.held()
    n.address_nodes = self.frees.addr_nodes.held()
    n.live_nodes = self.live_nodes.held()
    n.events = self.streams.spare_events.size()


cdef void _copy_stats(Allocator self, StatsCopy* c) noexcept nogil:
    cdef ScopedLock held
    cdef size_t i
    held.acquire(self.mutex)
    c.st = self.st
    c.cached = self.sblock_cache.cached()
    c.pending = self.streams.pending.size()
    c.orphans = self.orphans.count()
    c.measure = self.libraries
    c.room_kept = _reserve_kept(self)
    c.orphan_bytes = 0
    for i in range(self.orphans.chunks.size()):
        c.orphan_bytes += self.orphans.chunks[i].size


cdef void _reset_peaks(Allocator self) noexcept nogil:
    cdef ScopedLock held
    held.acquire(self.mutex)
    self.st.peak_allocated = self.st.allocated
    self.st.peak_requested = self.st.requested
    self.st.peak_reserved = self.st.reserved
    self.st.peak_active = self.st.active
    self.st.peak_sblock_va = self.st.sblock_va


cdef void _set_tracing(Allocator self, bint on, size_t kept) noexcept nogil:
    cdef ScopedLock held
    held.acquire(self.mutex)
    self.tracing = on
    if on:
        self.trace_max = kept
        if self.trace.size() > self.trace_max:
            self.trace.clear()
            self.trace_next = 0


cdef size_t _copy_history(Allocator self, vector[TraceEntry]& copy) noexcept nogil:
    """The history ring, copied; returns where its oldest entry is."""
    cdef ScopedLock held
    held.acquire(self.mutex)
    copy = self.trace
    return self.trace_next if self.trace.size() == self.trace_max else 0


# Note [Sharing a block's units]: to share a live block with another process, the receiver maps the physical units
# under it (whole chunks, or the slots of a chunk mapped in slots) back to back into a range of its own, each
# exported as a file descriptor (Note [Exporting a chunk]), and finds the block `offset` bytes in. A primitive block's
# units are those its segment maps under it; a stitched block's are its sBlock's, in the order the sBlock maps them,
# so one block over several segments' chunks is one range in the receiver as well. Units are mapped only whole, so
# the receiver may also see bytes of the block's neighbours in the first and last unit, as a receiver of PyTorch's
# expandable segments sees its neighbours in the shared pages. Units need not be one size (a slotted chunk's slots
# beside whole chunks). Keeping the block from reuse while a receiver holds it is the sharing layer's task.
cdef bint _copy_units(Allocator self, uintptr_t ptr, vector[pair[uint64_t, size_t]]& units, size_t* offset,
                      size_t* size) noexcept nogil:
    """share_units' rows (Note [Sharing a block's units] above): the handle and bytes of each unit under the live block
    at `ptr`, in the order its range maps them, and where the block starts in them; False where none is live."""
    cdef ScopedLock held
    cdef Block* b
    cdef Segment* seg
    cdef size_t c, end, i
    held.acquire(self.mutex)
    it = self.live.find(ptr)
    if it == self.live.end():
        return False
    b = deref(it).second
    size[0] = b.size
    if b.sblock != NULL:                  # stitched: its sBlock's range maps its units back to back
        offset[0] = b.addr - b.sblock.va
        for i in range(b.sblock.chunks.size()):
            units.push_back(pair[uint64_t, size_t](
                _unit_handle(self, b.sblock.chunks[i].seg, b.sblock.chunks[i].offset), b.sblock.chunks[i].size))
        return True
    seg = b.seg
    c = _unit_floor(self, seg, b.addr - seg.va)
    end = b.addr + b.size - seg.va
    offset[0] = b.addr - seg.va - c
    while c < end:
        units.push_back(pair[uint64_t, size_t](_unit_handle(self, seg, c), _unit_at(self, seg, c)))
        c += _unit_at(self, seg, c)
    return True
