# The policy seams (included by _allocator.pyx): how the core asks a policy that overrides a decision.
# Seams is what the core calls at every overridden seam; its base asks the Python hooks below (slow, with the GIL,
# under the allocator's lock), and a subclass in a researcher's own .pyx decides nogil (docs/policies.md).
# A hook's exception or bad answer is noted in the call's Failure (_note_hook_failure) and fails only that request.


cdef void _note_hook_failure(Allocator self, Failure* why, object exc, str hook):
    """Fail the call in progress with the exception `hook` raised, or with its bad answer; the first in a call
    wins. The exception waits in this thread's hook_errors until failure() makes it the call's PolicyError."""
    if not why.hook_failed:
        why.hook_failed = True
        self.hook_errors.exc = exc
        self.hook_errors.hook = hook


cdef bint _hook_split(Allocator self, Failure* why, size_t block_size, size_t size, int pool, bint default) noexcept:
    try:
        return bool(self.policy.should_split(block_size, size, "small" if pool == SIZE_SMALL else "large",
                                             default))
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "should_split")
        return default


cdef bint _hook_allow_stitch(Allocator self, Failure* why, size_t size, int64_t stream, vector[Piece]& pieces,
                             size_t remaining) noexcept:
    cdef size_t i
    try:
        sizes = [pieces[i].size for i in range(pieces.size())]
        return bool(self.policy.allow_stitch(size, stream, sizes, remaining))
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "allow_stitch")
        return True


cdef SBlock* _hook_evict(Allocator self, Failure* why, SBlock* lru_victim, int reason) noexcept:
    """Eviction seam: ask the policy which cached sBlock to evict (they are listed oldest first); NULL: it
    declined."""
    cdef vector[SBlock*] order
    cdef pair[uint64_t, SBlock*] entry
    cdef size_t i
    for entry in self.sblock_cache.by_age:
        order.push_back(entry.second)
    try:
        cached = [_cached_view(self, order[i]) for i in range(order.size())]
        index = _with_state(self, why, lru_victim.stream, self.policy.evict_victim,
                            (cached, EVICT_REASONS[reason]))
        if index is None:
            return NULL
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cached):
            raise ValueError(f"evict_victim returned {index!r}, not None or an index into {len(cached)} cached "
                             f"sBlocks")
        return order[index]
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "evict_victim")
        return lru_victim


cdef void _hook_place(Allocator self, Failure* why, int pool, size_t size, int64_t stream, Block** b,
                      SBlock** sb) noexcept:
    """Placement seam: the policy picks among the free blocks and cached sBlocks that fit (or none); `b` and
    `sb` hold the built-in choice on entry and the policy's on return (unchanged if the hook fails)."""
    cdef vector[Block*] blocks
    cdef vector[SBlock*] sblocks
    cdef cmap[SBlockKey, SBlock*].iterator it
    cdef SBlockKey key
    cdef size_t i
    try:
        candidates = _free_blocks(self, pool, size, stream, &blocks)
        if sb != NULL:
            key.capacity = size
            key.serial = 0
            it = self.sblock_cache.by_fit.lower_bound(key)
            while it != self.sblock_cache.by_fit.end():
                if _sblock_fits(self, deref(it).second, size, stream):
                    sblocks.push_back(deref(it).second)
                    candidates.append(_cached_view(self, deref(it).second))
                inc(it)
        default = None
        for i in range(blocks.size()):
            if b[0] == blocks[i]:
                default = i
        for i in range(sblocks.size()):
            if sb != NULL and sb[0] == sblocks[i]:
                default = blocks.size() + i
        answer = _with_state(self, why, stream, self.policy.choose_block,
                             (size, stream, SIZE_CLASS_NAMES[pool], candidates, default))
        if answer is not None and (not isinstance(answer, int) or isinstance(answer, bool)
                                   or not 0 <= answer < len(candidates)):
            raise ValueError(f"choose_block returned {answer!r}, not None or an index into {len(candidates)} "
                             f"candidates")
        b[0] = NULL
        if sb != NULL:
            sb[0] = NULL
        if answer is None:
            return
        if answer < <Py_ssize_t>blocks.size():
            b[0] = blocks[answer]
        else:
            sb[0] = sblocks[answer - blocks.size()]
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "choose_block")


cdef void _hook_stitch(Allocator self, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                       vector[Piece]& pieces, size_t* remaining) noexcept:
    """Stitching seam: the policy picks which of `blocks` to stitch, in order; pieces are cut from them as the
    built-in cuts its own (see _cut_pieces). `pieces` and `remaining` hold the built-in choice on entry."""
    cdef vector[Block*] chosen
    cdef size_t i, j
    try:
        free = [FreeBlock(blocks[i].addr, blocks[i].size, blocks[i].stream, blocks[i].seg.serial,
                          blocks[i].addr - blocks[i].seg.va) for i in range(blocks.size())]
        default = []
        for i in range(pieces.size()):
            for j in range(blocks.size()):
                if blocks[j].addr <= pieces[i].addr < blocks[j].addr + blocks[j].size:
                    default.append(j)
                    break
        answer = _with_state(self, why, stream, self.policy.choose_stitch, (size, stream, free, default))
        if not isinstance(answer, (list, tuple)):
            raise TypeError(f"choose_stitch returned {answer!r}, not a list of indices into {len(free)} blocks")
        if len(set(answer)) != len(answer) or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x < len(free) for x in answer):
            raise ValueError(f"choose_stitch returned {answer!r}, not distinct indices into {len(free)} blocks")
        for x in answer:
            chosen.push_back(blocks[<size_t>x])
        pieces.clear()
        remaining[0] = _cut_pieces(self, chosen, size, pieces)
        if pieces.empty():
            remaining[0] = size
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "choose_stitch")


cdef void _hook_layout(Allocator self, Failure* why, int pool, size_t size, int64_t stream, size_t* segment_size,
                       size_t* handle_size) noexcept:
    """Growth seam: the policy lays out a new segment for `size` bytes as (segment bytes, handle bytes)."""
    cdef size_t gran = self.driver.granularity
    cdef size_t bound = max(self.max_request, segment_size[0])     # an expandable range may exceed the device
    try:
        answer = _with_state(self, why, stream, self.policy.segment_layout,
                             (size, stream, SIZE_CLASS_NAMES[pool], (segment_size[0], handle_size[0])))
        if not isinstance(answer, tuple) or len(answer) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in answer):
            raise TypeError(f"segment_layout returned {answer!r}, not a tuple (segment bytes, handle bytes)")
        seg_bytes, handle_bytes = answer
        if handle_bytes <= 0 or handle_bytes % gran or seg_bytes < size or seg_bytes % handle_bytes \
                or seg_bytes > bound:
            raise ValueError(f"segment_layout returned {answer!r} for {size} bytes: the segment must hold them "
                             f"(at most {bound}), in whole handles of a multiple of {gran} bytes")
        segment_size[0] = seg_bytes
        handle_size[0] = handle_bytes
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "segment_layout")


cdef int _hook_pressure(Allocator self, Failure* why, size_t size, int64_t stream, int pool, int attempt,
                        int default) noexcept:
    """Release-under-pressure seam: the policy names the next action (PRESSURE_ACTIONS), or None to give up."""
    try:
        builtin = None if default == PRESSURE_GIVE_UP else PRESSURE_ACTIONS[default - 1]
        answer = _with_state(self, why, stream, self.policy.relieve_pressure,
                             (size, stream, SIZE_CLASS_NAMES[pool], attempt, builtin))
        if answer is None:
            return PRESSURE_GIVE_UP
        if answer not in PRESSURE_ACTIONS:
            raise ValueError(f"relieve_pressure returned {answer!r}, not None or one of "
                             f"{', '.join(PRESSURE_ACTIONS)}")
        return PRESSURE_ACTIONS.index(answer) + 1
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "relieve_pressure")
        return default


cdef list _free_blocks(Allocator self, int pool, size_t at_least, int64_t stream, vector[Block*]* out):
    """Free blocks of `pool` of at least `at_least` bytes that `stream` may use (its own, then those of no
    stream, each in best-fit order), as FreeBlocks; their pointers go to `out` where given."""
    cdef FreeIndex* index = free_index(self, pool)
    cdef FreeIndex.iterator it
    cdef Block* b
    cdef int64_t s
    found = []
    for s in (stream, ANY_STREAM):
        if s == ANY_STREAM and stream == ANY_STREAM and found:
            break
        it = index.lower_bound(free_key(s, at_least))
        while it != index.end() and deref(it).first.stream == s:
            b = deref(it).second
            found.append(FreeBlock(b.addr, b.size, b.stream, b.seg.serial, b.addr - b.seg.va))
            if out != NULL:
                out.push_back(b)
            inc(it)
    return found


cdef object _cached_view(Allocator self, SBlock* sb):
    cdef size_t i
    return CachedSBlock(sb.serial, sb.va, sb.va_size, sb.capacity,
                        tuple([(sb.pieces[i].addr, sb.pieces[i].size) for i in range(sb.pieces.size())]),
                        sb.chunks.size(), sb.stream, self.sblock_cache.tick - sb.last_use if sb.alloc == NULL else 0,
                        _sblock_all_free(self, sb))


cdef class _FreeBlockWalk:
    """The walk behind AllocatorState.free_blocks, run on its first read (inside the hook, the lock held)."""
    cdef Allocator a
    cdef int64_t stream

    def __call__(self):
        return tuple(_free_blocks(self.a, SIZE_SMALL, 0, self.stream, NULL)
                     + _free_blocks(self.a, SIZE_LARGE, 0, self.stream, NULL))


cdef object _with_state(Allocator self, Failure* why, int64_t stream, object hook, tuple args):
    """hook(*args, state): the read-only view a hook receives (built only when a hook is called; the caller holds
    the lock). Its free_blocks are walked only if the hook reads them, and cannot be after it returns."""
    cdef _FreeBlockWalk walk = _FreeBlockWalk.__new__(_FreeBlockWalk)
    walk.a = self
    walk.stream = stream
    blocks = FreeBlocks(walk)
    state = AllocatorState(self.st.reserved, self.st.allocated, self.st.active, self.limit_bytes,
                           self.driver.capacity, self.sblock_cache.cached(), stream, blocks,
                           why.request.target.id if why.request != NULL and why.request.target != NULL else 0)
    try:
        return hook(*args, state)
    finally:
        blocks._expire()


cdef class Seams:
    """The seams as the core asks them: this base asks the policy's Python hooks (see _allocator.pxd). Subclass it
    in Cython to decide a seam at C speed; docs/policies.md has the recipe, gmlake/_seams_example.pyx an example."""

    cdef void place(self, Allocator a, Failure* why, int pool, size_t size, int64_t stream, Block** b,
                    SBlock** sb) noexcept nogil:
        with gil:
            _hook_place(a, why, pool, size, stream, b, sb)

    cdef bint split(self, Allocator a, Failure* why, Block* b, size_t size, bint default) noexcept nogil:
        with gil:
            return _hook_split(a, why, b.size, size, b.seg.size_class, default)

    cdef void stitch(self, Allocator a, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                     vector[Piece]& pieces, size_t* remaining) noexcept nogil:
        with gil:
            _hook_stitch(a, why, size, stream, blocks, pieces, remaining)

    cdef bint allow_stitch(self, Allocator a, Failure* why, size_t size, int64_t stream, vector[Piece]& pieces,
                           size_t remaining) noexcept nogil:
        with gil:
            return _hook_allow_stitch(a, why, size, stream, pieces, remaining)

    cdef void layout(self, Allocator a, Failure* why, int pool, size_t size, int64_t stream, size_t* segment_size,
                     size_t* handle_size) noexcept nogil:
        with gil:
            _hook_layout(a, why, pool, size, stream, segment_size, handle_size)

    cdef SBlock* evict(self, Allocator a, Failure* why, SBlock* lru_victim, int reason) noexcept nogil:
        with gil:
            return _hook_evict(a, why, lru_victim, reason)

    cdef int pressure(self, Allocator a, Failure* why, size_t size, int64_t stream, int pool, int attempt,
                      int default) noexcept nogil:
        with gil:
            return _hook_pressure(a, why, size, stream, pool, attempt, default)
