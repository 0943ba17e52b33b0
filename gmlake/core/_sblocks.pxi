# The allocator core, room "sblocks": stitching and the sBlock cache: which pieces, the stitch itself, reuse,
# eviction.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds and, where it can
# fail, the call's Failure (Note [A call's failure]).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _sblock_fits, _claim, _release_stitched, _best_cached, _evict_lru, _sblock_all_free, _cut_pieces, _stitch_or_grow
#
# Owns Allocator.sblock_cache (SBlockCache, _structs.h), changed only by its own methods, called only from here
# (_claim, _release_stitched, _stitch, _evict); other rooms read it.


cdef bint _sblock_fits(Allocator self, SBlock* sb, size_t size, int64_t stream) noexcept nogil:
    """Are the first `size` bytes of sb's pieces free for `stream`?"""
    cdef size_t remaining = size
    cdef size_t take, i
    cdef Block* b
    for i in range(sb.pieces.size()):
        take = min_size(sb.pieces[i].size, remaining)
        b = _containing(self, sb.pieces[i].addr)
        if b == NULL or b.state != BLOCK_FREE or (b.stream != stream and b.stream != ANY_STREAM):
            return False
        if b.addr + b.size < sb.pieces[i].addr + take:
            return False
        remaining -= take
        if remaining == 0:
            return True
    return remaining == 0


cdef Block* _claim(Allocator self, SBlock* sb, size_t size, int64_t stream) noexcept nogil:
    """Serve `size` bytes through cached sb: claim the pBlocks under its first `size` bytes."""
    cdef size_t remaining = size
    cdef size_t take, i
    cdef Block* b
    cdef Block* piece
    self.sblock_cache.uncache(sb)
    for i in range(sb.pieces.size()):
        if remaining == 0:
            break
        take = min_size(sb.pieces[i].size, remaining)
        b = _containing(self, sb.pieces[i].addr)
        _erase_free(self, b)
        piece = b
        if b.addr < sb.pieces[i].addr:
            piece = _split(self, b, sb.pieces[i].addr - b.addr)
            _insert_free(self, b)
        if piece.size > take:
            _insert_free(self, _split(self, piece, take))
        piece.state = BLOCK_CLAIMED
        piece.sblock = sb
        piece.stream = stream
        sb.claimed.push_back(piece)
        remaining -= take
    cdef Block* a = new Block()
    a.addr = sb.va + sb.offset
    a.size = size
    a.stream = stream
    a.state = BLOCK_ALLOCATED
    a.sblock = sb
    sb.alloc = a
    return a


cdef inline void _release_stitched(Allocator self, Block* a) noexcept nogil:
    """A stitched allocation freed: its claimed pieces return to the free index (as its stream's), its sBlock is
    cached, and the allocation's Block is deleted."""
    cdef SBlock* sb = a.sblock
    cdef size_t i
    for i in range(sb.claimed.size()):
        sb.claimed[i].stream = a.stream
        _release_block(self, sb.claimed[i])
    sb.claimed.clear()
    sb.alloc = NULL
    self.sblock_cache.cache(sb)
    del a


cdef SBlock* _best_cached(Allocator self, size_t size, size_t below, int64_t stream) noexcept nogil:
    """Smallest cached sBlock with capacity in [size, below) whose first `size` bytes are free.

    Note [Searching the sBlock cache]: the cache is indexed by capacity (by_fit), so the search starts at the
    smallest sBlock that could carry the request and stops at the first one too large (`below`: the best free
    block's size, where one fits) or whose pieces are free. Every sBlock in that window is examined unless the
    policy bounds the search (`sblock_search_depth`, 0: no bound, the default): a bound of 8 left a fitting sBlock
    behind eight whose pieces other blocks held unfound, and the request stitched or grew instead. The cost stays
    bounded without one: the window holds at most `max_cached_sblocks` sBlocks, an sBlock whose pieces are held
    fails at its first held piece (one lookup), and the search runs only on a miss (Note [sBlocks only where no
    free block fits]), where the alternative is a stitch or growth that calls the driver."""
    cdef cmap[SBlockKey, SBlock*].iterator it
    cdef SBlockKey key
    key.capacity = size
    key.serial = 0
    it = self.sblock_cache.by_fit.lower_bound(key)
    cdef size_t tried = 0
    while it != self.sblock_cache.by_fit.end() and (self.k.sblock_search_depth == 0 or
                                                    tried < self.k.sblock_search_depth):
        if deref(it).first.capacity >= below:
            return NULL
        if _sblock_fits(self, deref(it).second, size, stream):
            return deref(it).second
        tried += 1
        inc(it)
    return NULL


cdef int _evict(Allocator self, Failure* why, SBlock* sb) noexcept nogil:
    """Unmap a cached sBlock and free its VA. The caller has synchronized."""
    cdef size_t i
    cdef int rc = _call(self, why, CALL_UNMAP, self.driver.unmap(sb.va, sb.va_size), sb.chunks.size())
    if rc != DRIVER_OK:
        return rc
    _discard_range(self, why, sb.va, sb.va_size, 0, 0, True)
    for i in range(sb.chunks.size()):
        sb.chunks[i].seg.sblock_maps[sb.chunks[i].index] -= 1
    self.sblock_cache.forget(sb)
    self.st.sblock_va -= sb.va_size
    self.st.sblock_evictions += 1
    del sb
    return DRIVER_OK


cdef int _evict_lru(Allocator self, Failure* why, size_t keep, bint synced, int reason) noexcept nogil:
    """Evict cached sBlocks until at most `keep` remain: the least recently used first, or the policy's choice (its
    evict_victim hook, asked over the bound and under pressure, one victim at a time; it may decline, which stops
    the eviction here). Synchronizes first unless the caller has (queued kernels may still use a freed sBlock's
    range)."""
    cdef int rc
    cdef SBlock* victim
    while self.sblock_cache.cached() > keep:
        if not synced:
            rc = _sync(self, why)
            if rc != DRIVER_OK:
                return rc
            synced = True
        victim = self.sblock_cache.oldest()
        if self.k.hook_evict and reason != EVICT_ALL:
            victim = _ask_evict(self, why, victim, reason)
            if victim == NULL:          # the policy declined: keep the rest
                return DRIVER_OK
        rc = _evict(self, why, victim)
        if rc != DRIVER_OK:
            return rc
    return DRIVER_OK


cdef bint _sblock_all_free(Allocator self, SBlock* sb) noexcept nogil:
    """Do all of a cached sBlock's pieces lie in free blocks (of any stream)?"""
    cdef size_t i
    cdef Block* b
    for i in range(sb.pieces.size()):
        b = _containing(self, sb.pieces[i].addr)
        if b == NULL or b.state != BLOCK_FREE or b.addr + b.size < sb.pieces[i].addr + sb.pieces[i].size:
            return False
    return True


cdef Block* _stitch(Allocator self, Failure* why, vector[Piece]& pieces, size_t size, int64_t stream) noexcept nogil:
    """Map the chunks under `pieces` (in order) into one new VA range and serve `size` bytes through it."""
    cdef SBlock* sb
    cdef vector[ChunkRef] chunks
    cdef ChunkRef ref
    cdef Block* b
    cdef Segment* seg
    cdef size_t i, c, c_end, va_size = 0, mapped = 0, capacity = 0, unit
    cdef uintptr_t va = 0, at
    cdef int rc
    if _refuse_unannounced_capture(self, why):
        return NULL
    # Trimming the cache synchronizes, which graph capture forbids: the cache may exceed its bound until it ends.
    if self.k.max_cached_sblocks and self.sblock_cache.cached() >= self.k.max_cached_sblocks and \
            not _capturing(self):
        if _evict_lru(self, why, self.k.max_cached_sblocks - 1, False, EVICT_BOUND) != DRIVER_OK:
            return NULL
    for i in range(pieces.size()):
        b = _containing(self, pieces[i].addr)
        seg = b.seg
        # the units under the piece, whole chunks or slots (Note [Fine pages at a block's tail])
        c = _unit_floor(self, seg, pieces[i].addr - seg.va)
        c_end = pieces[i].addr + pieces[i].size - seg.va
        while c < c_end:
            unit = _unit_at(self, seg, c)
            ref.seg = seg
            ref.index = c // seg.chunk_size
            ref.offset = c
            ref.size = unit
            chunks.push_back(ref)
            va_size += unit
            c += unit
        capacity += pieces[i].size
    rc = _call(self, why, CALL_RESERVE, self.driver.reserve(va_size, self.driver.granularity, &va), 0)
    if rc != DRIVER_OK:
        if rc == DRIVER_OOM:
            why.err = ERR_OOM
        return NULL
    at = va
    for i in range(chunks.size()):
        rc = _call(self, why, CALL_MAP, self.driver.map(
            at, chunks[i].size, _unit_handle(self, chunks[i].seg, chunks[i].offset)), 1)
        if rc != DRIVER_OK:
            break
        at += chunks[i].size
        mapped += 1
    if rc == DRIVER_OK:
        rc = _call(self, why, CALL_SET_ACCESS, self.driver.set_access(va, va_size), chunks.size())
    if rc != DRIVER_OK:
        if rc == DRIVER_OOM and why.err == ERR_NONE:
            why.err = ERR_OOM
        _discard_range(self, why, va, va_size, at - va, mapped, True)
        return NULL
    sb = new SBlock()
    sb.serial = _new_serial(self)
    sb.va = va
    sb.va_size = va_size
    seg = chunks[0].seg
    sb.offset = pieces[0].addr - seg.va - chunks[0].offset
    sb.stream = stream
    sb.capacity = capacity
    sb.pieces = pieces
    sb.chunks = chunks
    for i in range(chunks.size()):
        chunks[i].seg.sblock_maps[chunks[i].index] += 1
    self.sblock_cache.add(sb)
    self.st.sblock_va += va_size
    peak_update(&self.st.peak_sblock_va, self.st.sblock_va)
    self.st.stitches += 1
    self.st.stitched_handles += chunks.size()
    return _claim(self, sb, size, stream)


cdef void _stitch_candidates(Allocator self, int64_t stream, vector[Block*]& out) noexcept nogil:
    """Free large pBlocks `stream` may stitch (its own and those of no stream), largest first."""
    cdef vector[Block*] own
    cdef vector[Block*] anyb
    cdef size_t i = 0, j = 0
    _descending(self, stream, own)
    _descending(self, ANY_STREAM, anyb)
    while i < own.size() or j < anyb.size():
        if j >= anyb.size() or (i < own.size() and own[i].size >= anyb[j].size):
            out.push_back(own[i])
            i += 1
        else:
            out.push_back(anyb[j])
            j += 1


cdef size_t _cut_pieces(Allocator self, vector[Block*]& blocks, size_t size, vector[Piece]& pieces) noexcept nogil:
    """Cut pieces for a `size`-byte stitch from `blocks`, in order, until the request is covered. Only the first
    piece may start inside a unit (a chunk, or a slot of a chunk mapped in slots); every piece but the last ends on
    a unit boundary (a handle maps only whole). Returns the bytes still missing."""
    cdef Piece piece
    cdef size_t remaining = size, usable, i
    cdef uintptr_t start, end, aligned_end
    cdef Block* b
    cdef Segment* seg
    for i in range(blocks.size()):
        if remaining == 0:
            break
        b = blocks[i]
        seg = b.seg
        start = b.addr if pieces.empty() else seg.va + _unit_ceil(self, seg, b.addr - seg.va)
        end = b.addr + b.size
        if end <= start:
            continue
        if end - start >= remaining:
            piece.addr = start
            piece.size = remaining
            pieces.push_back(piece)
            return 0
        aligned_end = seg.va + _unit_floor(self, seg, end - seg.va)
        if aligned_end <= start:
            continue
        usable = aligned_end - start
        piece.addr = start
        piece.size = usable
        pieces.push_back(piece)
        remaining -= usable
    return remaining


cdef size_t _collect_pieces(Allocator self, size_t size, int64_t stream, vector[Block*]& blocks,
                            vector[Piece]& pieces) noexcept nogil:
    """The built-in choice of pieces: free large pBlocks whose mapped chunks could carry `size` bytes when stitched,
    largest first (so the fewest pieces, and handles to map, cover the request). Fills `blocks` with every
    candidate (for the policy's choose_stitch). Returns the bytes still missing."""
    _stitch_candidates(self, stream, blocks)
    return _cut_pieces(self, blocks, size, pieces)


cdef void _choose_stitch(Allocator self, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                         vector[Piece]& pieces, size_t* remaining) noexcept nogil:
    """Stitching seam: the policy's choose_stitch, where it has one, replaces the built-in pieces (an empty
    choice: grow instead)."""
    if not self.k.hook_stitch:
        return
    if pieces.empty():
        remaining[0] = size
    _ask_stitch(self, why, size, stream, blocks, pieces, remaining)


cdef bint _stitch_allowed(Allocator self, Failure* why, size_t size, int64_t stream, vector[Piece]& pieces,
                          size_t remaining) noexcept nogil:
    """A stitch of `pieces` (plus `remaining` new bytes) may go ahead: there are pieces, and the policy's
    allow_stitch hook, where it has one, agrees."""
    if pieces.empty():
        return False
    if self.k.hook_allow_stitch:
        return self.seams.allow_stitch(self, why, size, stream, pieces, remaining)
    return True


cdef inline bint _room_is_short(Allocator self) noexcept nogil:
    """Whether the room under the limit (the cap, or the device's free memory: _room) is less than
    `restitch_room` percent of what is reserved (Note [Stitching a size again])."""
    cdef size_t room
    if not self.k.restitch_room:
        return False
    room = _room(self)
    return room != <size_t>-1 and room < self.st.reserved // 100 * self.k.restitch_room


cdef bint _may_stitch(Allocator self, size_t size, int64_t stream, SBlock** reusable) noexcept nogil:
    """Whether the built-in stitches a large request of `size` now: the one place its knobs decide that. It does
    where `stitch` is on and the request is at least `min_stitch_size`, unless `restitch_limit` cached sBlocks of
    this size (capacity from `size` to 2 MiB more) have pieces held by other blocks: the request grows instead of
    stitching again. At the edge of memory that limit is not asked: growth cannot serve the request there, and
    stitching again is what serves it (Note [Stitching at the edge], _growth_expandable.pxi). Whether a stitch
    saves enough is the growth's to say (Growth.stitch_saves), and the policy's hooks may still change the choice.

    The search for held sBlocks may meet one whose pieces are free for `stream` (past the reuse search's depth):
    it is put in `reusable` (else NULL), for the caller to claim, and the answer is then yes.

    Note [Stitching a size again]: a stitch saves memory only while its pieces are not needed elsewhere. Once its
    allocation is freed, best fit hands the pieces to smaller requests, and the next request of that size stitches
    other free runs again: a new VA range and a cuMemSetAccess per page, every time. Growing once instead leaves a
    free run of that size that serves the size from then on. Shapes that change every step (an encoder-decoder's
    attention) otherwise stitch one size again and again for little memory. A limit of 1 costs utilization where a
    size needs its second stitch each step (FSDP's gathered parameters, a language model's logits), so the default
    allows two. The limit trades memory for driver time, which is the right trade only while memory is plentiful:
    where the room under the limit (the cap, or the device's free memory) is less than `restitch_room` percent of
    what is reserved, it is not asked, and a size stitches again, since every page grown then brings the edge
    nearer, and the pages a repeated size grows stay partly used between live blocks, where no stitch can take
    them back once the edge comes (an encoder-decoder on a device just larger than its peak ran out of memory so,
    with more cached free bytes than it asked for). Far from any limit nothing changes. The device's free memory is asked
    (cuMemGetInfo) only where the limit would apply, instead of a growth that calls the driver more. What each limit
    and room costs and saves is measured in docs/benchmarks.md, "At the edge of memory" and "The device itself as
    the limit, libraries loading lazily".

    The limit is for sizes that stitch again "for little memory": a request of at least `restitch_share` percent of
    what is reserved is spared it. Growing such a request raises the peak by a fifth or more at once, for the sake of
    a stitch whose calls cost a few ms; on a GNN-like program whose multi-GiB blocks change size every step, the
    limit grew a 2.3 GiB request that free pieces could serve and the default reserved a quarter more than
    expandable segments (docs/benchmarks.md, "Replay on CPU"). A smaller share spends stitches on the
    encoder-decoder's recurring sizes for no memory; at a fifth no bundled or kept trace changes."""
    cdef cmap[SBlockKey, SBlock*].iterator it
    cdef SBlockKey key
    cdef size_t held = 0
    reusable[0] = NULL
    if not (self.k.stitch and size >= self.k.min_stitch_size):
        return False
    if not self.k.restitch_limit or not self.sblock_cache.cached() or self.at_edge:
        return True
    key.capacity = size
    key.serial = 0
    it = self.sblock_cache.by_fit.lower_bound(key)
    while it != self.sblock_cache.by_fit.end() and deref(it).first.capacity < size + (2 << 20):
        if _sblock_fits(self, deref(it).second, size, stream):
            reusable[0] = deref(it).second
            return True
        held += 1
        inc(it)
    return held < self.k.restitch_limit or _room_is_short(self) or (
        self.k.restitch_share != 0 and size * 100 >= self.st.reserved * self.k.restitch_share)


cdef Block* _stitch_or_grow(Allocator self, Failure* why, size_t size, int64_t stream) noexcept nogil:
    """Steps 3-4 of a large request no free block or cached sBlock serves, written once over the growth: stitch free
    pBlocks, plus new memory of the growth for the shortfall, where the knobs ask for it and the growth says that
    saves enough (Growth.stitch_saves; the policy's choose_stitch and allow_stitch may change the choice); else grow
    the whole request."""
    cdef vector[Piece] pieces
    cdef vector[Block*] blocks
    cdef Piece piece
    cdef Segment* undo = NULL
    cdef size_t remaining
    cdef Block* b
    cdef bint wanted
    cdef SBlock* sb
    if self.growth.refuses(self, why, SIZE_LARGE, size):
        return NULL
    _plan_request(self, size)
    wanted = _may_stitch(self, size, stream, &sb)
    if sb != NULL and not self.k.hook_place:     # a policy that places was offered the cached sBlocks already
        self.st.sblock_reuses += 1
        return _claim(self, sb, size, stream)
    if self.growth.stitches and (wanted or self.k.hook_stitch):
        remaining = _collect_pieces(self, size, stream, blocks, pieces)
        if not (wanted and self.growth.stitch_saves(self, size, remaining, stream)):
            pieces.clear()          # the built-in would grow; the policy's choose_stitch may still stitch
        _choose_stitch(self, why, size, stream, blocks, pieces, &remaining)
        if _stitch_allowed(self, why, size, stream, pieces, remaining):
            if remaining:
                if not self.growth.new_piece(self, why, remaining, stream, &piece, &undo):
                    if why.err != ERR_NONE:
                        return NULL
                    return self.growth.grow(self, why, SIZE_LARGE, size, stream)
                pieces.push_back(piece)
            b = _stitch(self, why, pieces, size, stream)
            if b != NULL:
                return b
            if undo != NULL:
                # Give back what this request took: its new chunks were never handed out, so no sync is owed.
                _release_chunks(self, why, undo, 0)
            if why.err != ERR_NONE:
                return NULL
    return self.growth.grow(self, why, SIZE_LARGE, size, stream)


cdef void _descending(Allocator self, int64_t stream, vector[Block*]& out) noexcept nogil:
    """Free large pBlocks of `stream`, largest first."""
    cdef FreeIndex* index = free_index(self, SIZE_LARGE)
    cdef FreeIndex.iterator it = index.lower_bound(free_key(stream + 1, 0))
    while it != index.begin():
        dec(it)
        if deref(it).first.stream != stream:
            break
        out.push_back(deref(it).second)
