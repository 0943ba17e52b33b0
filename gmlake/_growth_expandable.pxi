# The allocator core, growth strategy "expandable" (ExpandableGrowth): PyTorch's expandable segments. One VA range
# per stream and size class, reserved once, grown by mapping chunks ("pages", in PyTorch's and the knobs' words) at
# the lowest address with room; best fit counts the unmapped room after a free block. A stitch's shortfall is new
# chunks mapped at the lowest hole with room. Included into _allocator.pyx (see _growth.pxi).


cdef Block* _map_pages(Allocator self, Failure* why, Block* hole, size_t size) noexcept nogil:
    """Map new chunks over the first `size` bytes (rounded up to whole chunks) of an unmapped hole. The mapped
    part becomes free, merged with its free neighbours and indexed; it is returned. NULL with why.err set on
    failure, leaving the hole as it was."""
    cdef Segment* seg = hole.seg
    cdef size_t C = seg.chunk_size
    cdef size_t n = min_size((size + C - 1) // C, hole.size // C)
    cdef size_t first = (hole.addr - seg.va) // C
    cdef size_t i
    cdef vector[uint64_t] handles
    if self.limit_bytes and self.st.reserved + n * C > self.limit_bytes:
        why.err = ERR_OOM
        return NULL
    if _refuse_unannounced_capture(self, why):
        return NULL
    # The hole's VA belongs to the segment: a failure unmaps only (the segment frees its reservation).
    if _map_new_chunks(self, why, hole.addr, n, C, handles, n * C, False) != DRIVER_OK:
        return NULL
    for i in range(n):
        seg.handles[first + i] = handles[i]
    seg.mapped_chunks += n
    self._record(TRACE_SEGMENT_MAP, hole.addr, n * C, hole.stream)
    self.st.reserved += n * C
    peak_update(&self.st.peak_reserved, self.st.reserved)
    _erase_hole(self, hole)
    if hole.size > n * C:
        _insert_hole(self, _split(self, hole, n * C))
    hole.state = BLOCK_FREE
    hole.free_seq = 0
    cdef Block* b = _coalesce(self, hole)
    _insert_free(self, b)
    return b


cdef inline size_t _page(Allocator self, int size_class) noexcept nogil:
    """The page a new expandable range of `size_class` maps.

    Note [Finer pages under a cap]: a handle maps only whole, so the free space left inside pages that also hold
    live blocks is out of reach of growth and stitching alike; at 20 MiB pages that is what keeps a capped run
    from fitting where PyTorch's expandable segments fit, whose releases under pressure repack their ranges
    (Note [Releasing before the cap binds]). Finer pages cost driver time (cuMemSetAccess is priced per handle),
    which a run with no cap should not pay, but under a cap memory is what binds. Replayed under caps (`gmlake
    replay --smallest-cap`, `python -m bench cap search` checks it on the GPU), 4 MiB pages fit every trace in
    less than the expandable model where 20 MiB pages needed more, at several times their driver time.
    A cap at or above the device's memory is none. A range made before the cap was set keeps its pages and what it
    has mapped, but grows no more (_coarser_range): growth goes to a range of this page, so a cap set after the
    model was loaded still gets finer pages for what comes after.

    Why from the moment the cap is set, and not once the headroom under it runs low: what a page strands is
    decided when the blocks beside it are placed, mostly in the first step, long before the limit is near (on a
    recomputation trace, a gap of a few MiB that each layer leaves between its checkpoints, none a whole 20 MiB
    page). Finer pages only once the headroom fell below 5-60 % of the cap, or only after a growth first found no
    memory, needed 0.4-4 % of the peak allocated more than finer pages from the start on those traces, where
    these pages cost up to 8x the expandable model's priced driver time under a cap (`python -m bench edge` measures
    a policy's fit and price per trace). For the same reason the device itself, when it is the limit, gets no
    finer pages: the allocator cannot tell in time that it will be."""
    if size_class == SIZE_SMALL:
        return self.k.expandable_page_small
    if _cap_binds(self):
        return self.k.capped_page_large
    return self.k.expandable_page_large


cdef inline bint _cap_binds(Allocator self) noexcept nogil:
    """Whether a cap below the device's memory is set (a cap at or above it is none)."""
    return self.limit_bytes != 0 and (self.driver.capacity == 0 or self.limit_bytes < self.driver.capacity)


cdef inline bint _coarser_range(Allocator self, Segment* seg, size_t page) noexcept nogil:
    """Whether a range made before a cap was set maps pages coarser than `page`, the page its size class grows by under
    the cap now: it takes no more growth (Note [Finer pages under a cap])."""
    return seg.chunk_size > page and not seg.under_cap and _cap_binds(self)


cdef Block* _lowest_room(Allocator self, int size_class, size_t size, int64_t stream, size_t* unmapped) noexcept nogil:
    """The hole walk, written once: the start of the lowest run of `stream`'s free and unmapped space in a range of
    `size_class` with `size` bytes in a row (the free block before a hole, or the hole), and in `unmapped` the bytes
    of it that growth would map; NULL where no range has room. Ranges of a released private pool, and ranges coarser than
    the pages a cap asks for, take no growth."""
    cdef FreeIndex* holes = _holes(self, size_class)
    cdef FreeIndex.iterator it = holes.lower_bound(free_key(stream, 0))
    cdef Block* c
    cdef Block* b
    cdef size_t room
    cdef size_t page = _page(self, size_class)
    while it != holes.end() and deref(it).first.stream == stream:
        c = deref(it).second
        # a released pool's segment, part unmapped, is never the default pool's; a coarser range grows no more
        if c.seg.owner != NULL or _coarser_range(self, c.seg, page):
            inc(it)
            continue
        if c.prev != NULL and free_for(c.prev, stream):
            c = c.prev
        room = 0
        unmapped[0] = 0
        b = c
        while room < size and b != NULL and (free_for(b, stream) or b.state == BLOCK_UNMAPPED):
            if b.state == BLOCK_UNMAPPED:
                unmapped[0] += min_size(b.size, round_up(size - room, page))
            room += b.size
            b = b.next
        if room >= size:
            return c
        inc(it)
    return NULL


cdef Block* _find_expandable(Allocator self, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil:
    """The lowest hole of `stream` (with the free block before it) that has `size` bytes of free or unmapped
    space in a row, or a new expandable segment's hole."""
    cdef size_t unmapped
    cdef Block* c = _lowest_room(self, size_class, size, stream, &unmapped)
    if c != NULL:
        return c
    cdef size_t page = _page(self, size_class)
    cdef size_t reserve = round_up(self.k.expandable_reserve, page)
    cdef Segment* seg
    if self.k.hook_layout:          # growth seam: the new range's size and page
        _ask_layout(self, why, size_class, size, stream, &reserve, &page)
    if reserve < size:
        why.err = ERR_OOM
        return NULL
    seg = _new_segment(self, why, size_class, reserve, page, stream, False)
    return seg.first if seg != NULL else NULL


cdef size_t _growth_bytes(Allocator self, int size_class, size_t size, int64_t stream) noexcept nogil:
    """New bytes an expandable segment would map to serve `size` bytes: the unmapped part of the lowest run of
    free and unmapped space with room (as _find_expandable picks it), or all of it in a new segment."""
    cdef size_t unmapped
    if _lowest_room(self, size_class, size, stream, &unmapped) != NULL:
        return unmapped
    return round_up(size, _page(self, size_class))


cdef bint _request_over_cap(Allocator self, Failure* why, int size_class, size_t size) noexcept nogil:
    """With cap_counts_request, whether a request that needs new memory would pass the cap counted whole; then
    why.err is ERR_OOM, so that pressure is relieved before any page is mapped.

    Note [Releasing before the cap binds]: PyTorch's alloc_block refuses new memory while reserved + the whole
    request (get_allocation_size) passes the cap, even under expandable segments, where only the pages missing at
    the end of a range are mapped. That stricter check makes PyTorch release every free page (release_cached_blocks)
    whenever a large request arrives near the cap, long before the cap binds: the free space of the range's tail
    goes back, and the next growth maps into the lowest hole with room, packing later blocks into the holes of
    earlier ones. Counting only the pages mapped, the range keeps its free tail until the cap binds, by then in
    pieces that no growth can join. On the GPU (`python -m bench cap search`) expandable segments fit under lower
    caps than the exact count replays, and inside the GPU's brackets with this check (tests/test_training_traces.py)."""
    if not (self.k.cap_counts_request and self.limit_bytes) or \
            self.st.reserved + _pytorch_alloc_size(self, size_class, size) <= self.limit_bytes:
        return False
    why.err = ERR_OOM
    return True


cdef Block* _alloc_expandable(Allocator self, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil:
    """Grow an expandable segment by mapping pages until `size` bytes in a row are free, then take them."""
    cdef Block* c = _find_expandable(self, why, size_class, size, stream)
    cdef Block* m
    cdef Segment* seg
    if c == NULL:
        return NULL
    if c.state == BLOCK_UNMAPPED:
        seg = c.seg
        c = _map_pages(self, why, c, min_size(c.size, size))
        if c == NULL:
            if seg.mapped_chunks == 0:
                _drop_segment(self, why, seg)     # a segment with nothing mapped holds only VA: give it back
            return NULL
    while c.size < size:
        # _find_expandable counts a free block of another stream tag (-1) as room, but coalescing does not join it:
        # growth stops there as out of memory (pressure is then relieved) instead of mapping over a mapped block.
        if c.next == NULL or c.next.state != BLOCK_UNMAPPED:
            why.err = ERR_OOM
            return NULL
        m = _map_pages(self, why, c.next, min_size(size - c.size, c.next.size))
        if m == NULL:
            return NULL
        c = m
    _erase_free(self, c)
    return _take(self, why, c, size, stream)


cdef class ExpandableGrowth(Growth):
    """Ranges grown in place by chunks mapped where a stream has room; a stitch where it maps fewer new chunks."""

    def __cinit__(self):
        self.stitches = True
        self.fit_counts_unmapped = True

    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil:
        return _alloc_expandable(a, why, size_class, size, stream)

    cdef bint refuses(self, Allocator a, Failure* why, int size_class, size_t size) noexcept nogil:
        return _request_over_cap(a, why, size_class, size)

    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil:
        # Stitch where that maps at least `min_saved_chunks` fewer new pages than growing the range would.
        cdef size_t page = _page(a, SIZE_LARGE)
        return round_up(shortfall, page) + a.k.min_saved_chunks * page <= _growth_bytes(a, SIZE_LARGE, size, stream)

    cdef bint new_piece(self, Allocator a, Failure* why, size_t shortfall, int64_t stream, Piece* piece,
                        Segment** undo) noexcept nogil:
        # The shortfall as new pages at the lowest hole with room, stitched last.
        cdef size_t fresh = round_up(shortfall, _page(a, SIZE_LARGE))
        cdef Block* hole = _find_expandable(a, why, SIZE_LARGE, fresh, stream)
        cdef Segment* seg
        if hole == NULL:
            return False
        while hole.state != BLOCK_UNMAPPED:
            hole = hole.next
        if hole.size < fresh:
            return False                # no error: grow the range instead
        piece.addr = hole.addr
        piece.size = shortfall
        seg = hole.seg
        if _map_pages(a, why, hole, fresh) == NULL:
            if seg.mapped_chunks == 0:
                _drop_segment(a, why, seg)     # a segment with nothing mapped holds only VA: give it back
            return False
        return True

