# The allocator core: a request's path, steps 1-6 of _allocator.pyx's docstring, and a free's. Included into
# _allocator.pyx.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _malloc_try, _serve, _free_live, _free_retire
#
# malloc_nogil and malloc_in_pool_nogil take the lock and choose the request's target; _serve does the rest: it
# rounds the size, runs the steps below (_malloc_*) and counts the result. The steps ask the rooms (free index,
# sBlocks, growth, streams, pools, seams) and decide nothing of their own besides their order. free_nogil takes the
# lock and calls _free_live, which counts the free and returns the memory now (_free_retire) or once other streams'
# uses completed.

cdef inline Block* _malloc_small(Allocator self, Failure* why, size_t size, int64_t stream) noexcept nogil:
    cdef Block* b = _best_free(self, SIZE_SMALL, size, stream)
    cdef Segment* seg
    if b == NULL and _may_reclaim(self, why) and _reclaim_streams(self, why, stream, False):
        b = _best_free(self, SIZE_SMALL, size, stream)
    if b == NULL and self.k.cross_stream_wait and why.err == ERR_NONE and _may_reclaim(self, why):
        b = _wait_for_other_stream(self, why, SIZE_SMALL, size, stream)
    if self.k.hook_place and why.err == ERR_NONE:
        _ask_place(self, why, SIZE_SMALL, size, stream, &b, NULL)
    if b != NULL:
        _erase_free(self, b)
        return _take(self, why, b, size, stream)
    if why.err != ERR_NONE:
        return NULL
    if self.growth.refuses(self, why, SIZE_SMALL, size):
        return NULL
    return self.growth.grow(self, why, SIZE_SMALL, size, stream)


cdef inline Block* _malloc_large(Allocator self, Failure* why, size_t size, int64_t stream) noexcept nogil:
    # Steps 1-2, the cache hit (Note [The cache-hit path]): the best free block, split, unless a cached sBlock
    # may fit it tighter (sblock_first) or the policy places.
    cdef Block* b = _best_free(self, SIZE_LARGE, size, stream)
    if b != NULL and not self.k.hook_place and not (self.k.sblock_first and self.sblock_cache.cached()):
        return _take_reused(self, why, b, size, stream)
    return _malloc_large_miss(self, why, b, size, stream)


cdef inline Block* _take_reused(Allocator self, Failure* why, Block* b, size_t size, int64_t stream) noexcept nogil:
    """Serve a large request from free block b, first cutting the page it would end in where `cut_at_reuse` asks
    (Note [Fine pages at reuse]; not where the policy places)."""
    if unlikely(self.k.cut_at_reuse != 0) and not self.k.hook_place:
        b = _cut_tail_at_reuse(self, why, b, size, stream)
        if b == NULL:
            return NULL
    _erase_free(self, b)
    return _take(self, why, b, size, stream)


cdef inline Block* _malloc_large_miss(Allocator self, Failure* why, Block* b, size_t size,
                                      int64_t stream) noexcept nogil:
    """A large request the cache-hit path did not serve: another stream's blocks, cached sBlocks, the placement
    seam, then steps 3-4. `b` is the best free block found (or NULL)."""
    cdef SBlock* sb = NULL
    if b == NULL and _may_reclaim(self, why) and _reclaim_streams(self, why, stream, False):
        b = _best_free(self, SIZE_LARGE, size, stream)
    if b == NULL and self.k.cross_stream_wait and why.err == ERR_NONE and _may_reclaim(self, why):
        b = _wait_for_other_stream(self, why, SIZE_LARGE, size, stream)
    if why.err != ERR_NONE:
        return NULL
    # Note [sBlocks only where no free block fits]: with sblock_first off, a cached sBlock serves a request only
    # when no free block can. Checking whether an sBlock's pieces are free costs a lookup per piece, and an
    # expandable range's long free tail would otherwise send every request through that search.
    if self.sblock_cache.cached() and (b == NULL or self.k.sblock_first):
        sb = _best_cached(self, size, b.size if b != NULL else <size_t>-1, stream)
    if self.k.hook_place:       # placement seam: the policy may pick another block or sBlock, or none
        _ask_place(self, why, SIZE_LARGE, size, stream, &b, &sb)
    if sb != NULL:
        self.st.sblock_reuses += 1
        return _claim(self, sb, size, stream)
    if b != NULL:
        return _take_reused(self, why, b, size, stream)
    # Steps 3-4: stitch free pBlocks, adding new memory for the shortfall only, or grow.
    return _stitch_or_grow(self, why, size, stream)


cdef inline Block* _malloc_try(Allocator self, Failure* why, int size_class, size_t size,
                               int64_t stream) noexcept nogil:
    why.err = ERR_NONE
    if unlikely(why.request.target != NULL):
        return _alloc_in_pool(self, why, size_class, size, stream)
    if size_class == SIZE_SMALL:
        return _malloc_small(self, why, size, stream)
    return _malloc_large(self, why, size, stream)


cdef inline Block* _malloc_request(Allocator self, Failure* why, size_t size, int64_t stream) noexcept nogil:
    cdef int size_class = SIZE_SMALL if size <= self.k.small_size else SIZE_LARGE
    cdef Block* b = _malloc_try(self, why, size_class, size, stream)
    if b != NULL or why.err != ERR_OOM:
        return b
    if _capturing(self):
        # Every stage of relief synchronizes: Note [Pools and graph capture].
        why.err = ERR_CAPTURE
        return NULL
    if _refuse_unannounced_capture(self, why):
        return NULL
    return _malloc_under_pressure(self, why, size_class, size, stream)


cdef inline Block* _malloc_under_pressure(Allocator self, Failure* why, int size_class, size_t size,
                                          int64_t stream) noexcept nogil:
    """Step 5: relieve memory pressure, retrying the request after each attempt, until it is served or relief
    runs out. Each attempt takes the growth's built-in stage (Growth.pressure_stage) or
    what the policy's relieve_pressure chose instead, up to MAX_PRESSURE_ATTEMPTS; _relieve carries it out.
    While it runs the request is at the edge of memory, where a policy with `edge_page` stitches by its own rule
    (Note [Stitching at the edge], _growth_expandable.pxi)."""
    cdef Block* b
    self.at_edge = self.k.edge_page != 0
    b = _malloc_relieve_and_retry(self, why, size_class, size, stream)
    self.at_edge = False
    return b


cdef inline Block* _malloc_relieve_and_retry(Allocator self, Failure* why, int size_class, size_t size,
                                             int64_t stream) noexcept nogil:
    cdef Block* b
    cdef int attempt, action, default
    for attempt in range(MAX_PRESSURE_ATTEMPTS):
        action = default = self.growth.pressure_stage(self, attempt)
        if self.k.hook_pressure:
            action = _ask_pressure(self, why, size, stream, size_class, attempt, default)
        if action == PRESSURE_GIVE_UP:
            break
        # Retried after every stage that ran, whether or not it reports a change: its synchronize alone may have
        # completed other streams' work (pending frees, fences), and a retry that fails is cheap beside it.
        _relieve(self, why, size_class, size, action)
        if why.err != ERR_NONE:
            return NULL
        b = _malloc_try(self, why, size_class, size, stream)
        if b != NULL or why.err != ERR_OOM:
            return b
    if _reserve_kept(self):
        # relief ran out: the device reserve is the last memory a request may have (Note [Leaving the
        # libraries room], _vmm.pxi)
        b = _alloc_from_reserve(self, why, size_class, size, stream)
        if b != NULL or why.err != ERR_OOM:
            return b
    why.err = ERR_OOM
    return NULL


cdef void _count_oom(Allocator self, size_t size, int64_t stream) noexcept nogil:
    """An out-of-memory, counted (memory_stats' num_ooms) and, while tracing, recorded as PyTorch's snapshot records
    it: its entry holds the device's free bytes (asked only then, and never during a capture, which the query could
    disturb)."""
    cdef size_t free_bytes = 0
    self.st.ooms += 1
    if self.tracing and not _capturing(self) and self.driver.device_free(&free_bytes) != DRIVER_OK:
        free_bytes = 0
    self._record(TRACE_OOM, free_bytes, size, stream)


cdef inline uintptr_t _serve(Allocator self, Request* request, size_t size, Failure* out) noexcept nogil:
    """malloc once the lock is held and the request's target chosen (the caller's ScopedLock releases it). Note [A
    call's failure].

    Note [The cache-hit path]: a request that a free block serves, in one compilation unit, every step inline or
    a direct call, no Python, no driver call:
      malloc_nogil       a Request on the stack, the lock (ScopedLock.acquire), the private pool if any is active
                         (one size() check)
      _serve             pending frees polled only if any wait; the size rounded; the statistics below
      _malloc_request    the size class; _malloc_try: a private pool's request goes to _alloc_in_pool
      _malloc_large      _best_free: _peek_fit of the stream's own blocks and of those of no stream (one
                         lower_bound each), the smaller wins; _erase_free (a spare node kept), _take: _should_split,
                         _split (a spare Block) and _insert_free of the tail
      free_nogil         _free_live: the live map; _free_retire, _release_block: _coalesce with free neighbours,
                         _insert_free
    Anything else (no block fits, a cached sBlock may fit tighter, a hook places) leaves the path at
    _malloc_large_miss. `python -m bench micro --cache-hits` times it, callgrind counts it."""
    cdef size_t rounded
    cdef Block* b = NULL
    cdef int64_t stream = request.stream
    cdef Failure failure
    cdef Failure* why = &failure
    no_failure(why)
    why.request = request
    if _has_pending(self) and not _capturing(self) and not _unannounced_capture(self, why):
        _process_pending(self, why)
    why.err = ERR_NONE
    # A request no device (or cap) could hold fails at once and changes nothing but the out-of-memory count and
    # history: no loop over billions of chunks, no vector that large, no memory released for nothing.
    if size > self.max_request or round_up(size, self.k.round_to) > self.limit_bytes:
        why.err = ERR_OOM
        _count_oom(self, size, stream)
        self._report(why, out)
        return 0
    rounded = round_up(size, self.k.round_to)
    b = _malloc_request(self, why, rounded, stream)
    if b == NULL:
        if why.hook_failed:
            why.err = ERR_POLICY
        elif why.err == ERR_NONE:
            why.err = ERR_OOM
        if why.err == ERR_OOM or why.err == ERR_CAPTURE:
            _count_oom(self, size, stream)
        self._report(why, out)
        self._debug_check()
        return 0
    b.requested = size
    self._record(TRACE_ALLOC, b.addr, size, stream)
    self.live_nodes.put(self.live, b.addr, b)
    self.st.allocs += 1
    self.st.live_blocks += 1
    self.st.allocated += b.size
    self.st.requested += size
    self.st.active += b.size
    peak_update(&self.st.peak_allocated, self.st.allocated)
    peak_update(&self.st.peak_requested, self.st.requested)
    peak_update(&self.st.peak_active, self.st.active)
    if why.hook_failed:
        # A hook raised: the allocation completed with the built-in answer; undo it and fail the request.
        _free_live(self, why, b.addr)
        why.err = ERR_POLICY
        self._report(why, out)
        self._debug_check()
        return 0
    self._debug_check()
    return b.addr


cdef inline int _free_live(Allocator self, Failure* why, uintptr_t ptr) noexcept nogil:
    it = self.live.find(ptr)
    if it == self.live.end():
        return ERR_INVALID_FREE
    cdef Block* b = deref(it).second
    self.live_nodes.take_at(self.live, it)
    self._record(TRACE_FREE_REQUESTED, b.addr, b.requested, b.stream)
    self.st.frees += 1
    self.st.live_blocks -= 1
    self.st.allocated -= b.size
    self.st.requested -= b.requested
    if not _free_after_uses(self, why, b, ptr):
        _free_retire(self, b)
    return ERR_NONE


cdef inline void _free_retire(Allocator self, Block* b) noexcept nogil:
    """Return a freed allocation's memory: its pBlock, or its sBlock's claimed pieces (the sBlock is cached)."""
    self._record(TRACE_FREE_COMPLETED, b.addr, b.requested, b.stream)
    self.st.active -= b.size
    if b.seg != NULL:
        _release_block(self, b)
    else:
        _release_stitched(self, b)
