# The allocator core, room "segments": segments and their handles: create (with rollback), release free chunks, drop;
# memory pressure.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds and, where it can
# fail, the call's Failure (Note [A call's failure]).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _new_segment, _new_serial, _slotted, _unit_at, _unit_floor, _unit_ceil, _unit_handle, _set_unit, _unmap_units,
#   _whole_again, _units_in, _release_chunks, _drop_segment, _release_free, _relieve
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
    if mapped and self.st.reserved + size > self.limit_bytes:
        why.err = ERR_OOM
        return NULL
    if _refuse_unannounced_capture(self, why):
        return NULL
    rc = _call(self, why, CALL_RESERVE, self.driver.reserve(size, self.driver.granularity, &va), 0)
    if rc != DRIVER_OK:
        if rc == DRIVER_OOM:
            why.err = ERR_OOM
        return NULL
    if _map_new_chunks(self, why, va, n, chunk_size, handles, size, True, False) != DRIVER_OK:
        return NULL                 # the reservation is freed too
    cdef Segment* seg = new Segment()
    seg.serial = _new_serial(self)
    seg.va = va
    seg.size = size
    seg.chunk_size = chunk_size
    seg.size_class = size_class
    seg.stream = stream
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
    _note_most_reserved(self)
    return seg


cdef inline uint64_t _new_serial(Allocator self) noexcept nogil:
    """The next serial of the creation order segments and sBlocks share (it orders free blocks the same way on
    every driver)."""
    cdef uint64_t serial = self.segments.next_serial
    self.segments.next_serial += 1
    return serial


# A segment's memory is mapped in units: a whole chunk (one handle), or, in a chunk mapped in parts, a slot of
# `slot` bytes (one handle each): a chunk re-backed at the edge (Note [Taking slots back at the edge],
# _rebacking.pxi), or the chunk a block's tail only partly covers when it was mapped (Note [Fine pages at a block's
# tail], _growth_expandable.pxi). Growth maps, and release unmaps, whole units; the functions below are the only
# ones that read a unit's handle. A chunk whose slots are all unmapped again is a whole chunk again.

cdef inline bint _slotted(Segment* seg, size_t chunk) noexcept nogil:
    """Was chunk `chunk` of seg re-backed in slots?"""
    return not seg.slots.empty() and seg.slots.count(chunk) != 0


cdef inline size_t _unit_at(Allocator self, Segment* seg, size_t offset) noexcept nogil:
    """The size of the unit at `offset` (a unit boundary) of seg."""
    return self.k.slot if _slotted(seg, offset // seg.chunk_size) else seg.chunk_size


cdef inline size_t _unit_floor(Allocator self, Segment* seg, size_t offset) noexcept nogil:
    """The start of the unit that holds `offset`."""
    cdef size_t C = seg.chunk_size
    if _slotted(seg, offset // C):
        return offset - offset % self.k.slot
    return offset - offset % C


cdef inline size_t _unit_ceil(Allocator self, Segment* seg, size_t offset) noexcept nogil:
    """The first unit boundary at or after `offset`."""
    cdef size_t floor = _unit_floor(self, seg, offset)
    return offset if floor == offset else floor + _unit_at(self, seg, floor)


cdef inline uint64_t _unit_handle(Allocator self, Segment* seg, size_t offset) noexcept nogil:
    """The handle mapped at the unit starting at `offset` (0: unmapped)."""
    cdef size_t C = seg.chunk_size
    if _slotted(seg, offset // C):
        return seg.slots[offset // C][(offset % C) // self.k.slot]
    return seg.handles[offset // C]


cdef void _set_unit(Allocator self, Segment* seg, size_t offset, uint64_t handle) noexcept nogil:
    """Record the handle now mapped at the unit starting at `offset` (0: none), keeping mapped_chunks: the chunks
    with anything mapped."""
    cdef size_t C = seg.chunk_size
    cdef size_t chunk = offset // C
    cdef bint before, after
    cdef vector[uint64_t]* slots
    if _slotted(seg, chunk):
        slots = &seg.slots[chunk]
        before = _any_slot_mapped(slots[0])
        slots[0][(offset % C) // self.k.slot] = handle
        after = _any_slot_mapped(slots[0])
    else:
        before = seg.handles[chunk] != 0
        seg.handles[chunk] = handle
        after = handle != 0
    if after and not before:
        seg.mapped_chunks += 1
    elif before and not after:
        seg.mapped_chunks -= 1


cdef inline bint _any_slot_mapped(vector[uint64_t]& slots) noexcept nogil:
    cdef size_t i
    for i in range(slots.size()):
        if slots[i] != 0:
            return True
    return False


cdef int _unmap_units(Allocator self, Failure* why, Segment* seg, size_t lo, size_t hi, size_t units) noexcept nogil:
    """Unmap the `units` units of seg in [lo, hi) (offsets) in one call and give their handles back. Returns the
    unmap's code (on failure nothing changed)."""
    cdef size_t at = lo, size
    cdef int rc = _call(self, why, CALL_UNMAP, self.driver.unmap(seg.va + lo, hi - lo), units)
    if rc != DRIVER_OK:
        return rc
    while at < hi:
        size = _unit_at(self, seg, at)
        _release_handle(self, why, _unit_handle(self, seg, at), size)
        _set_unit(self, seg, at, 0)
        self.st.chunks_released += 1
        at += size
    if not seg.slots.empty():
        for at in range(lo // seg.chunk_size, (hi - 1) // seg.chunk_size + 1):
            _whole_again(seg, at)
    return DRIVER_OK


cdef inline void _whole_again(Segment* seg, size_t chunk) noexcept nogil:
    """A chunk mapped in slots, none of them mapped now, maps whole again."""
    if _slotted(seg, chunk) and not _any_slot_mapped(seg.slots[chunk]):
        seg.slots.erase(chunk)


cdef size_t _units_in(Allocator self, Segment* seg, size_t lo, size_t hi) noexcept nogil:
    """How many units tile [lo, hi) (unit boundaries) of seg."""
    cdef size_t n = 0
    while lo < hi:
        lo += _unit_at(self, seg, lo)
        n += 1
    return n


cdef size_t _release_chunks(Allocator self, Failure* why, Segment* seg, size_t wanted) noexcept nogil:
    """Return to the driver the units of seg (whole chunks, or slots of re-backed ones) that lie wholly in free
    blocks and that no sBlock maps, until `wanted` bytes are released (0: all). The caller has synchronized.
    Returns the bytes released."""
    cdef size_t C = seg.chunk_size
    cdef size_t released = 0
    cdef size_t lo, hi, end, units
    cdef Block* b = seg.first
    cdef Block* nxt
    while b != NULL and (wanted == 0 or released < wanted):
        nxt = b.next
        if b.state == BLOCK_FREE:
            end = b.addr + b.size - seg.va
            lo = _unit_ceil(self, seg, b.addr - seg.va)
            while lo < end:
                # the first run of whole units in b that no sBlock maps
                while lo < end and lo + _unit_at(self, seg, lo) <= end and seg.sblock_maps[lo // C] != 0:
                    lo += _unit_at(self, seg, lo)
                hi = lo
                units = 0
                while hi < end and hi + _unit_at(self, seg, hi) <= end and seg.sblock_maps[hi // C] == 0:
                    hi += _unit_at(self, seg, hi)
                    units += 1
                if units == 0:
                    break
                if _unmap_units(self, why, seg, lo, hi, units) != DRIVER_OK:
                    return released
                self._record(TRACE_SEGMENT_UNMAP, seg.va + lo, hi - lo, b.stream)
                self.st.reserved -= hi - lo
                released += hi - lo
                nxt = _carve_hole(self, b, seg.va + lo, seg.va + hi).next   # continue after the hole
                break
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
    "release_other_pool" then returns what the other size class holds free, "release_all" everything free, "reback"
    everything free and then the free slots of partly used chunks (Note [Taking slots back at the edge]). True if
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
    elif action == PRESSURE_REBACK:
        # what is free first, as release_all (a policy may ask for this stage first), then the partly used chunks
        changed += _release_free(self, why, SIZE_SMALL, 0, EVICT_PRESSURE)
        changed += _release_free(self, why, SIZE_LARGE, 0, EVICT_PRESSURE)
        if why.err == ERR_NONE:
            changed += _reback_chunks(self, why)
    return changed > 0 and why.err == ERR_NONE
