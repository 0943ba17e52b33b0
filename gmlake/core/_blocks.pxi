# The allocator core, room "blocks": the free index (best fit by stream, size, segment, offset), unmapped holes, and
# block surgery: split, merge, take.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _insert_free, _erase_free, _holes, _insert_hole, _erase_hole, _peek_fit, _best_free, _carve_hole, _split,
#   _absorb_next, _coalesce, _take, _containing, _release_block, _free_clock, _first_block, _forget_blocks
#
# Owns Allocator.frees (FreeRoom, _structs.h): the default pool's free index, the holes, every pBlock by address,
# the free clock and the spares the hot path reuses. Only the functions here write it; other rooms call them (a
# private pool's free index is the pools room's, but its blocks enter and leave it here, through _index_of).


cdef void _insert_free(Allocator self, Block* b) noexcept nogil:
    self.frees.index_nodes.put(_index_of(self, b)[0], key_of(b), b)


cdef void _erase_free(Allocator self, Block* b) noexcept nogil:
    self.frees.index_nodes.take(_index_of(self, b)[0], key_of(b))


cdef FreeIndex* _holes(Allocator self, int size_class) noexcept nogil:
    return &self.frees.holes_small if size_class == SIZE_SMALL else &self.frees.holes_large


cdef void _insert_hole(Allocator self, Block* b) noexcept nogil:
    cdef FreeKey key = key_of(b)
    key.size = 0
    _holes(self, b.seg.size_class).insert(FreeEntry(key, b))


cdef void _erase_hole(Allocator self, Block* b) noexcept nogil:
    cdef FreeKey key = key_of(b)
    key.size = 0
    _holes(self, b.seg.size_class).erase(key)


cdef Block* _merge_holes(Allocator self, Block* b) noexcept nogil:
    """Merge unmapped, unindexed b with unmapped neighbours. Returns the merged hole, unindexed."""
    cdef Block* p = b.prev
    cdef Block* n
    if p != NULL and p.state == BLOCK_UNMAPPED:
        _erase_hole(self, p)
        _absorb_next(self, p)
        b = p
    n = b.next
    if n != NULL and n.state == BLOCK_UNMAPPED:
        _erase_hole(self, n)
        _absorb_next(self, b)
    return b


cdef Block* _peek_fit(Allocator self, FreeIndex* index, size_t size, int64_t stream) noexcept nogil:
    cdef FreeIndex.iterator it = index.lower_bound(free_key(stream, size))
    cdef FreeIndex.iterator nxt
    cdef Block* b
    if it == index.end() or deref(it).first.stream != stream:
        return NULL
    if self.k.fit_counts_unmapped:
        # As PyTorch's expandable segments do: a block that can grow into the unmapped space after it counts as
        # that large, so a later block that fits more snugly is preferred.
        nxt = it
        inc(nxt)
        while nxt != index.end() and deref(nxt).first.stream == stream and \
                expandable_size(deref(nxt).second) < expandable_size(deref(it).second):
            it = nxt
            inc(nxt)
    b = deref(it).second
    if self.k.max_split_size:
        # PyTorch's rules for blocks of max_split_size or more: never split them for a smaller request, and
        # round a request up into one only within max_non_split_rounding.
        if size < self.k.max_split_size and b.size >= self.k.max_split_size:
            return NULL
        if size >= self.k.max_split_size and b.size >= size + self.k.max_non_split_rounding:
            return NULL
    return b


cdef Block* _best_free(Allocator self, int size_class, size_t size, int64_t stream) noexcept nogil:
    """Smallest free pBlock >= size of `stream` or of no stream; stays in the index."""
    cdef FreeIndex* index = free_index(self, size_class)
    cdef Block* own = _peek_fit(self, index, size, stream)
    cdef Block* anyb = _peek_fit(self, index, size, ANY_STREAM)
    if own == NULL:
        return anyb
    if anyb != NULL and anyb.size < own.size:
        return anyb
    return own


cdef Block* _carve_hole(Allocator self, Block* b, uintptr_t lo, uintptr_t hi) noexcept nogil:
    """Make [lo, hi) of free, indexed b an unmapped hole, merged with unmapped neighbours and indexed; what b held
    before lo and after hi stays free and indexed. Returns the hole, which is its segment's stream's: b may be of
    no stream (freed under pressure), and a hole of no stream is one no growth would ever map again."""
    cdef Block* hole = b
    _erase_free(self, b)
    if lo > b.addr:
        hole = _split(self, b, lo - b.addr)
        _insert_free(self, b)
    if hole.addr + hole.size > hi:
        _insert_free(self, _split(self, hole, hi - hole.addr))
    hole.state = BLOCK_UNMAPPED
    hole.stream = hole.seg.stream
    hole = _merge_holes(self, hole)
    _insert_hole(self, hole)
    return hole


cdef Block* _split(Allocator self, Block* b, size_t size) noexcept nogil:
    """Cut b after `size` bytes; b keeps the head. Returns the tail (same state, not indexed)."""
    cdef Block* tail = self.frees.spare_blocks.make()
    tail.addr = b.addr + size
    tail.size = b.size - size
    tail.stream = b.stream
    tail.free_seq = b.free_seq
    tail.state = b.state
    tail.seg = b.seg
    tail.prev = b
    tail.next = b.next
    if b.next != NULL:
        b.next.prev = tail
    b.next = tail
    b.size = size
    self.frees.addr_nodes.put(self.frees.by_addr, tail.addr, tail)
    return tail


cdef void _absorb_next(Allocator self, Block* b) noexcept nogil:
    """Merge b's next neighbour into b (the neighbour is unindexed by the caller first)."""
    cdef Block* n = b.next
    self.frees.addr_nodes.take(self.frees.by_addr, n.addr)
    b.size += n.size
    b.next = n.next
    if n.next != NULL:
        n.next.prev = b
    if n.free_seq > b.free_seq:
        b.free_seq = n.free_seq
    self.frees.spare_blocks.drop(n)


cdef Block* _coalesce(Allocator self, Block* b) noexcept nogil:
    """Merge free, unindexed b with free neighbours of the same stream. Returns the merged block, unindexed."""
    cdef Block* p = b.prev
    cdef Block* n
    if p != NULL and p.state == BLOCK_FREE and p.stream == b.stream:
        _erase_free(self, p)
        _absorb_next(self, p)
        b = p
    n = b.next
    if n != NULL and n.state == BLOCK_FREE and n.stream == b.stream:
        _erase_free(self, n)
        _absorb_next(self, b)
    return b


cdef bint _should_split(Allocator self, Failure* why, Block* b, size_t size) noexcept nogil:
    cdef size_t remaining = b.size - size
    cdef bint split
    if remaining == 0:
        return False
    if b.seg.size_class == SIZE_SMALL:
        split = remaining >= self.k.round_to
    else:
        split = remaining > self.k.large_split_min and (self.k.max_split_size == 0 or size < self.k.max_split_size)
    if self.k.hook_split:
        split = self.seams.split(self, why, b, size, split)
    return split


cdef Block* _take(Allocator self, Failure* why, Block* b, size_t size, int64_t stream) noexcept nogil:
    """Allocate the head of free, unindexed b; the rest stays free if the policy splits it."""
    if _should_split(self, why, b, size):
        _insert_free(self, _split(self, b, size))
    b.state = BLOCK_ALLOCATED
    b.stream = stream
    return b


cdef Block* _containing(Allocator self, uintptr_t addr) noexcept nogil:
    cdef cmap[uintptr_t, Block*].iterator it = self.frees.by_addr.upper_bound(addr)
    if it == self.frees.by_addr.begin():
        return NULL
    dec(it)
    cdef Block* b = deref(it).second
    return b if addr < b.addr + b.size else NULL


cdef void _release_block(Allocator self, Block* b) noexcept nogil:
    """A block returns to the free index: stamped, merged, indexed."""
    self.frees.seq += 1
    b.state = BLOCK_FREE
    b.sblock = NULL
    b.free_seq = self.frees.seq
    _insert_free(self, _coalesce(self, b))


cdef inline uint64_t _free_clock(Allocator self) noexcept nogil:
    """The free clock: the free_seq of the latest free (a fence covers the frees up to it)."""
    return self.frees.seq


cdef Block* _first_block(Allocator self, Segment* seg, int64_t stream, bint mapped) noexcept nogil:
    """A new segment's one block, spanning it: free (not yet indexed: the caller takes or indexes it) or, if not
    `mapped`, an unmapped hole, indexed."""
    cdef Block* b = new Block()
    b.addr = seg.va
    b.size = seg.size
    b.stream = stream
    b.state = BLOCK_FREE if mapped else BLOCK_UNMAPPED
    b.seg = seg
    seg.first = b
    self.frees.by_addr[b.addr] = b
    if not mapped:
        _insert_hole(self, b)
    return b


cdef void _forget_blocks(Allocator self, Segment* seg) noexcept nogil:
    """A dropped segment's blocks (unmapped holes, once all its chunks are released): out of the holes and the
    address map, and deleted."""
    cdef Block* b = seg.first
    cdef Block* nxt
    while b != NULL:
        nxt = b.next
        if b.state == BLOCK_UNMAPPED:
            _erase_hole(self, b)
        self.frees.by_addr.erase(b.addr)
        del b
        b = nxt
    seg.first = NULL
