# The allocator core, growth strategy "expandable" (ExpandableGrowth): PyTorch's expandable segments. One VA range
# per stream and size class, reserved once, grown by mapping chunks ("pages", in PyTorch's and the knobs' words) at
# the lowest address with room; best fit counts the unmapped room after a free block. A stitch's shortfall is new
# chunks mapped at the lowest hole with room. Included into _allocator.pyx (see _growth.pxi).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _note_most_reserved, _cut_tail_at_reuse, _cap_binds, _room, ExpandableGrowth


cdef Block* _map_pages(Allocator self, Failure* why, Block* hole, size_t size) noexcept nogil:
    """Map new chunks over the first `size` bytes (rounded up to whole units: chunks, or slots where the chunk was
    re-backed) of an unmapped hole. The mapped part becomes free, merged with its free neighbours and indexed; it is
    returned. NULL with why.err set on failure, leaving the hole as it was."""
    cdef Segment* seg = hole.seg
    cdef size_t start = hole.addr - seg.va
    cdef size_t end = start
    cdef size_t at, unit, run, n, i
    cdef size_t cut = <size_t>-1          # the chunk cut into slots for the tail here, if any
    cdef vector[uint64_t] handles
    while end < start + hole.size and end - start < size:
        if _cuts_tail(self, seg, end, size - (end - start)):
            cut = end // seg.chunk_size
            seg.slots[cut].assign(seg.chunk_size // self.k.slot, 0)
        end += _unit_at(self, seg, end)
    cdef bint over = self.st.reserved + (end - start) > self.limit_bytes
    if over:
        why.err = ERR_OOM
    if over or _refuse_unannounced_capture(self, why):
        if cut != <size_t>-1:
            _whole_again(seg, cut)
        return NULL
    # Runs of units of one size, each created and mapped with one cuMemSetAccess; a failure gives back the runs
    # mapped before it. The hole's VA belongs to the segment: a failure unmaps only (the segment frees its
    # reservation). Each run counts as reserved once mapped, before the next run's growth asks the device what is
    # free: else the libraries' measure would read the bytes just mapped as taken by someone else (Note [Leaving
    # the libraries room]).
    at = start
    while at < end:
        unit = _unit_at(self, seg, at)
        run = at
        n = 0
        while run < end and _unit_at(self, seg, run) == unit:
            run += unit
            n += 1
        if _map_new_chunks(self, why, seg.va + at, n, unit, handles, n * unit, False, False) != DRIVER_OK:
            if at > start and _unmap_units(self, why, seg, start, at, _units_in(self, seg, start, at)) == DRIVER_OK:
                self.st.reserved -= at - start
            if cut != <size_t>-1:
                _whole_again(seg, cut)
            return NULL
        for i in range(n):
            _set_unit(self, seg, at + i * unit, handles[i])
        self.st.reserved += run - at
        at = run
    self._record(TRACE_SEGMENT_MAP, hole.addr, end - start, hole.stream)
    peak_update(&self.st.peak_reserved, self.st.reserved)
    _note_most_reserved(self)
    _erase_hole(self, hole)
    if hole.size > end - start:
        _insert_hole(self, _split(self, hole, end - start))
    hole.state = BLOCK_FREE
    hole.free_seq = 0
    cdef Block* b = _coalesce(self, hole)
    _insert_free(self, b)
    return b


cdef inline bint _cuts_tail(Allocator self, Segment* seg, size_t at, size_t need) noexcept nogil:
    """Whether growth maps the whole chunk at offset `at` of seg, of which it needs only `need` bytes, in slots
    instead.

    Note [Fine pages at a block's tail]: a handle maps only whole, so where a block ends inside a page the rest of the
    page is a free run that shares the page with the block's live bytes; when the block stays and its neighbour
    goes, those bytes are out of reach of growth, and at the edge of memory they are what the default lacked
    (docs/benchmarks.md, "At the edge of memory"). Pages fine everywhere reach them, at ten times the handles on
    every growth and every stitch. With `tail_page` set, growth maps the bulk of a large block in whole pages and
    only the last page it partly covers in pages of `tail_page` bytes, as many as the block needs; the rest of that
    page stays unmapped, and the next block grown there maps its slots one by one. A free run inside such a page
    is given back slot by slot under pressure, as a re-backed chunk's is, and growth maps it again; a stitch maps
    its slots, one handle each. Only the default pool's large class: a private pool's memory belongs to a CUDA
    graph."""
    cdef size_t C = seg.chunk_size
    cdef size_t S = self.k.tail_page
    return S != 0 and not self.edge_pages and seg.owner == NULL and seg.size_class == SIZE_LARGE and C > S and \
        at % C == 0 and round_up(need, S) < C and not _slotted(seg, at // C) and _plan_fine_tail(self, need, C)


cdef inline void _note_most_reserved(Allocator self) noexcept nogil:
    """Growth just mapped memory: remember when reserved memory last reached a new high (Note [Fine pages at
    reuse])."""
    if self.st.reserved > self.most_reserved:
        self.most_reserved = self.st.reserved
        self.most_reserved_at = self.st.allocs
        _plan_new_high(self)


cdef inline bint _laying_out(Allocator self) noexcept nogil:
    """Whether the run still lays out its memory: the requests since reserved memory last reached a new high are
    at most `cut_at_reuse` percent of those before (Note [Fine pages at reuse])."""
    return self.st.allocs - self.most_reserved_at <= self.most_reserved_at * self.k.cut_at_reuse // 100


# Note [A cut under another thread's capture]: a cut synchronizes the device (cuCtxSynchronize), which CUDA forbids
# while any stream of the context is captured, whichever thread captures and in whatever mode: the call fails and
# the capture is invalidated, so another thread's torch.cuda.graph would fail at its end. So no cut is made while
# a capture is announced (_capturing(): torch.cuda.graph begins its pool before cudaStreamBeginCapture and ends it
# after cudaStreamEndCapture, so its capture lies inside the announcement), nor where the request's own stream
# captures unannounced (Note [Unannounced capture]); the block serves uncut, as without the knob. The check and
# the synchronize run under the allocator's lock, which begin_allocate_to_pool takes too: a capture cannot be
# announced between them, its begin waits until the request is served, and the capture starts after the begin.
# Releasing the lock around the synchronize, to let other threads allocate while it waits, would open that window.
# A capture on another thread that nobody announced cannot be seen (CUDA has no call that asks whether some stream
# captures): there the synchronize fails and breaks that capture, as any synchronize during it would (empty_cache,
# PyTorch's own); the cut is given up and the request served from the block uncut, never failed, since a cut only
# improves the layout. Growth (cuMemCreate, cuMemMap) is no synchronize, but global mode forbids it on other threads
# too: a request that finds a pool active runs in relaxed mode (malloc_nogil), as the bridge's routed requests do,
# which also covers one that the bridge let through unrouted just before the pool began.
cdef Block* _cut_tail_at_reuse(Allocator self, Failure* why, Block* b, size_t size, int64_t stream) noexcept nogil:
    """Before `stream` takes `size` bytes from the head of free, indexed b: where the block would end inside a whole
    page that lies wholly in b, remap that page in slots (Note [Fine pages at reuse]). Returns the free, indexed
    block to take the bytes from (b, or its head merged with the slots), or NULL with why.err set where a driver
    call failed.

    Note [Fine pages at reuse]: growth cuts only the tails it maps (Note [Fine pages at a block's tail]); a block
    placed by reuse in a free run of whole pages ends inside one, and when it stays and its neighbours go, the rest
    of that page is out of reach at the edge: what tail pages alone still lack there (docs/benchmarks.md, "Fine
    pages at reuse"). With `cut_at_reuse` set, such a page, free as a whole, is unmapped and mapped again in
    `tail_page` slots, all of them, so the free run stays one run (only the slots the block needs would leave a
    hole that splits it, and a large request then grows past it). Its bytes are free, but work queued before their
    block was freed may still use them, so the device is synchronized first unless the block is of no stream; live
    memory is never unmapped or moved. A cut costs a synchronize and ten times a page's handles, so it is made only
    while the run lays out its memory: while the requests since reserved memory last reached a new high are at most
    `cut_at_reuse` percent of those before. The layout made then is the one later steps reuse; a run whose memory
    stopped growing cuts nothing, and one that grows again cuts for a while. Not while a graph is captured, and
    only in the default pool's large class."""
    cdef Segment* seg = b.seg
    cdef size_t C = seg.chunk_size
    cdef size_t S = self.k.tail_page
    cdef size_t base = b.addr - seg.va
    cdef size_t end = base + size
    cdef size_t lo = end - end % C
    cdef uintptr_t addr = b.addr
    cdef Block* hole
    cdef Block* m
    if end % C == 0 or seg.owner != NULL or seg.size_class != SIZE_LARGE or C <= S:
        return b
    if lo < base or lo + C > base + b.size or _slotted(seg, lo // C) or seg.handles[lo // C] == 0 or \
            seg.sblock_maps[lo // C] != 0 or round_up(end - lo, S) >= C:
        return b
    if lo == base and b.prev != NULL and b.prev.state == BLOCK_UNMAPPED:
        return b        # the page's hole would merge with the one before it, and mapping would start there
    # The check and the synchronize are under the allocator's lock: Note [A cut under another thread's capture].
    if not _laying_out(self) or _capturing(self) or _unannounced_capture(self, why):
        return b
    if b.stream != ANY_STREAM and _sync(self, why) != DRIVER_OK:
        why.err = ERR_NONE          # no cut: b serves as it is
        return b
    if _unmap_units(self, why, seg, lo, lo + C, 1) != DRIVER_OK:
        return NULL
    self.st.reserved -= C
    self._record(TRACE_SEGMENT_UNMAP, seg.va + lo, C, seg.stream)
    hole = _carve_hole(self, b, seg.va + lo, seg.va + lo + C)
    seg.slots[lo // C].assign(C // S, 0)
    m = _map_pages(self, why, hole, C)
    if m == NULL:
        _whole_again(seg, lo // C)
        return NULL
    self.st.tails_cut_at_reuse += 1
    # The slots are the range's stream's, b's head and tail b's: the request's stream takes both. Safe though b
    # may be of another stream (cross_stream): the slots are new, and the head was of no stream or synchronized.
    _claim_for(self, m, stream)
    m = _claim_for(self, _containing(self, addr), stream)
    if m.addr != addr or m.size < size:
        why.err = ERR_OOM       # never seen: the head and the slots did not merge
        return NULL
    return m


cdef inline size_t _grown_bytes(Allocator self, int size_class, size_t need, size_t page) noexcept nogil:
    """The bytes growth maps for `need` bytes from a page boundary: whole pages, or, where the last page is cut
    (Note [Fine pages at a block's tail]), whole pages and the slots the tail needs."""
    cdef size_t S = self.k.tail_page
    cdef size_t whole = need - need % page
    if need == whole:
        return need
    if S != 0 and size_class == SIZE_LARGE and page > S and round_up(need - whole, S) < page and \
            _plan_fine_tail(self, need - whole, page):
        return whole + round_up(need - whole, S)
    return whole + page


cdef inline size_t _page(Allocator self, int size_class) noexcept nogil:
    """The page a new expandable range of `size_class` maps.

    Note [Finer pages under a cap]: `capped_page_large` (0: the uncapped page) is the page of a large-pool range
    made while a cap below the device's memory is set; a range made before the cap keeps its pages and what it has
    mapped, but grows no more (_coarser_range), so a cap set after the model was loaded still gets that page for
    what comes after. A cap at or above the device's memory is none.

    Finer pages reach the free space inside pages that also hold live blocks, but the driver charges per handle, and
    a range made under a cap pays that price from the moment the cap is set, whether the cap ever binds or not; so
    the default keeps its uncapped page under a cap, and the knob stays for research. What each page size costs and
    buys at the edge is measured in docs/benchmarks.md, "At the edge of memory" (`python -m bench edge`)."""
    if size_class == SIZE_SMALL:
        return self.k.expandable_page_small
    if self.edge_pages:
        return self.k.edge_page
    if _cap_binds(self):
        return self.k.capped_page_large
    return self.k.expandable_page_large


cdef inline bint _cap_binds(Allocator self) noexcept nogil:
    """Whether a cap below the device's memory is set (a cap at or above it is none)."""
    return self.limit_bytes != NO_LIMIT and (self.driver.capacity == 0 or self.limit_bytes < self.driver.capacity)


cdef size_t _room(Allocator self) noexcept nogil:
    """The bytes growth may still map: under a cap, the cap less reserved; else the device's free bytes, less the
    device reserve while it is closed (SIZE_MAX where the driver cannot say)."""
    cdef size_t free = 0
    if _cap_binds(self):
        return self.limit_bytes - self.st.reserved if self.st.reserved < self.limit_bytes else 0
    if _ask_device(self, &free) != DRIVER_OK:
        return <size_t>-1
    return free - _reserve_kept(self) if free > _reserve_kept(self) else 0


cdef inline size_t _edge_shortfall(Allocator self, size_t shortfall) noexcept nogil:
    """At the edge, the new bytes a stitch's shortfall maps: whole pages of its range where they fit under the limit,
    else edge pages.

    Note [Stitching at the edge]: a request that relief is retrying (_malloc_under_pressure) is at the edge
    of memory: growth has failed, and what can still serve it is what the allocator holds free. Two rules keep
    stitches rare elsewhere, for speed, where growing is the other way to serve a request: `min_saved_chunks` (a
    stitch must save that many pages) and `restitch_limit` (a size that keeps stitching again grows instead). At the
    edge either rule turns a request that the cached free bytes can serve into an out-of-memory error. With
    `edge_page` set, a request at the edge stitches wherever that maps fewer new bytes than growing would, whatever
    its size's stitching history, and the stitch's shortfall maps whole pages of the range where they fit under the
    limit (the cap less reserved, or the device's free bytes less the closed device reserve: _room), else pages of
    `edge_page` bytes in a range of such pages, so that rounding the shortfall up to a 20 MiB page does not fail a
    request the limit has room for. Nothing live moves or is unmapped: a stitch maps the free pieces' handles at a
    new address, as every stitch does, and the edge pages are new memory. Off the edge nothing changes, so a run that
    never reaches its limit makes the same calls with or without a cap.

    Finer pages chosen earlier, once the room under the limit falls under a threshold, do not reach this space: the
    free bytes a capped run lacks lie in pages mapped long before the limit came near, between live blocks that stay
    (docs/benchmarks.md, "Finer pages by headroom, and stitching at the edge")."""
    cdef size_t coarse = round_up(shortfall, _page(self, SIZE_LARGE))
    return coarse if coarse <= _room(self) else round_up(shortfall, self.k.edge_page)


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
        # a released pool's segment, part unmapped, is never the default pool's; a coarser range grows no more;
        # edge pages go only to a range of edge pages
        if c.seg.owner != NULL or _coarser_range(self, c.seg, page) or (self.edge_pages and c.seg.chunk_size != page):
            inc(it)
            continue
        if c.prev != NULL and free_for(c.prev, stream):
            c = c.prev
        room = 0
        unmapped[0] = 0
        b = c
        while room < size and b != NULL and (free_for(b, stream) or b.state == BLOCK_UNMAPPED):
            if b.state == BLOCK_UNMAPPED:
                unmapped[0] += min_size(b.size, _grown_bytes(self, size_class, size - room, page))
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
    return _grown_bytes(self, size_class, size, _page(self, size_class))


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
    if not (self.k.cap_counts_request and self.limit_bytes != NO_LIMIT) or \
            self.st.reserved + _pytorch_alloc_size(self, size_class, size) <= self.limit_bytes:
        return False
    why.err = ERR_OOM
    return True


cdef Block* _claim_for(Allocator self, Block* b, int64_t stream) noexcept nogil:
    """Free, indexed b (of `stream` or of no stream) as `stream`'s, merged with its free neighbours of that stream;
    returns the merged block, indexed. A block of no stream is safe for any stream, so this only narrows who may
    use it, for the request about to take it."""
    if b.stream == stream:
        return b
    _erase_free(self, b)
    b.stream = stream
    b = _coalesce(self, b)
    _insert_free(self, b)
    return b


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
    c = _claim_for(self, c, stream)
    while c.size < size:
        # _lowest_room counts a free block of no stream (-1) as room: it joins the run as the stream's (pressure
        # makes every free block so, and pages mapped after it carry the stream's tag, which coalescing needs)
        if c.next != NULL and c.next.state == BLOCK_FREE and c.next.stream == ANY_STREAM:
            c = _claim_for(self, c.next, stream)
            continue
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

    cdef size_t whole_pages(self, Allocator a, size_t room, bint binds) noexcept nogil:
        # the knobs' capped_page_large is expandable_page_large where the policy left it 0 (Knobs.core_knobs)
        cdef size_t page = a.k.capped_page_large if binds and a.k.capped_page_large else a.k.expandable_page_large
        return room - room % page if page else room

    def page(self, policy, bint binds=False):
        return policy.capped_page_large if binds and policy.capped_page_large else policy.expandable_page_large

    def oom_pages(self, policy):
        return policy.expandable_page_large, policy.capped_page_large or None, policy.tail_page

    cdef bint refuses(self, Allocator a, Failure* why, int size_class, size_t size) noexcept nogil:
        return _request_over_cap(a, why, size_class, size)

    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil:
        # Stitch where that maps at least `min_saved_chunks` fewer new pages than growing the range would; at the
        # edge, wherever it maps fewer new bytes (Note [Stitching at the edge]).
        cdef size_t page = _page(a, SIZE_LARGE)
        if a.at_edge:
            return _edge_shortfall(a, shortfall) <= _growth_bytes(a, SIZE_LARGE, size, stream)
        return round_up(shortfall, page) + a.k.min_saved_chunks * page <= _growth_bytes(a, SIZE_LARGE, size, stream)

    cdef bint new_piece(self, Allocator a, Failure* why, size_t shortfall, int64_t stream, Piece* piece,
                        Segment** undo) noexcept nogil:
        # The shortfall as new pages at the lowest hole with room, stitched last; at the edge, edge pages in a range
        # of their own where whole pages of the range would not fit under the limit.
        cdef size_t fresh
        cdef Block* hole
        cdef Segment* seg
        a.edge_pages = a.at_edge and _edge_shortfall(a, shortfall) < round_up(shortfall, _page(a, SIZE_LARGE))
        fresh = round_up(shortfall, _page(a, SIZE_LARGE))
        hole = _find_expandable(a, why, SIZE_LARGE, fresh, stream)
        a.edge_pages = False
        if hole == NULL:
            return False
        while hole.state != BLOCK_UNMAPPED:
            hole = hole.next
        if hole.size < fresh:
            return False                # no error: grow the range instead
        piece.addr = hole.addr
        piece.size = shortfall
        seg = hole.seg
        # whole pages, and slots for the tail where tail_page cuts it (Note [Fine pages at a block's tail])
        if _map_pages(a, why, hole, shortfall) == NULL:
            if seg.mapped_chunks == 0:
                _drop_segment(a, why, seg)     # a segment with nothing mapped holds only VA: give it back
            return False
        return True

