# Debug checks of the allocator core: every invariant and statistic verified against the structures (Allocator.check,
# and after every operation with debug_checks on, as mimalloc's debug builds check inside the allocator). Included by
# _allocator.pyx; module-level functions, as every room of the core.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _check_invariants, _verify_after_operation


def _check_invariants(Allocator self) -> None:
    """Verify every internal invariant and statistic against the structures; raises InvariantError (an
    AssertionError that `python -O` does not strip) naming the first one broken. For tests."""
    cdef pair[uint64_t, Segment*] sp
    cdef pair[uint64_t, SBlock*] bp
    cdef pair[FreeKey, Block*] fp
    cdef pair[uintptr_t, Block*] lp
    cdef Segment* seg
    cdef Block* b
    cdef SBlock* sb
    cdef size_t reserved = 0, allocated = 0, requested = 0, active = 0, free_count = 0, hole_count = 0
    cdef size_t sblock_va = 0, i, j, c, unit, mapped_slots
    cdef FreeKey key
    cdef uintptr_t at
    cdef vector[int] maps
    cdef pair[uint64_t, PrivatePool*] pp
    cdef PrivatePool* owner
    cdef size_t index_count = self.frees.small.size() + self.frees.large.size()
    pending_blocks = set()
    per_stream: dict[int, int] = {}
    cdef PendingFree* pend
    for i in range(self.streams.pending.size()):
        pend = &self.streams.pending[i]
        pending_blocks.add(<uintptr_t>pend.block)
        active += pend.block.size
        if pend.events.empty() or pend.events.size() != pend.streams.size():
            raise InvariantError("a pending free waits for no event, or its events and streams disagree")
        for j in range(pend.streams.size()):
            per_stream[pend.streams[j]] = per_stream.get(pend.streams[j], 0) + 1
    if per_stream != {entry.first: entry.second for entry in self.streams.pending_per_stream}:
        raise InvariantError("the count of pending events per stream disagrees with the pending frees")
    # Note [Reusing events]: a spare is an event nothing queries or waits on; one still in use would be recorded
    # again under its waiter.
    in_use = {self.streams.pending[i].events[j] for i in range(self.streams.pending.size())
              for j in range(self.streams.pending[i].events.size())}
    in_use.update(entry.second.event for entry in self.streams.fences)
    spares = [self.streams.spare_events[i] for i in range(self.streams.spare_events.size())]
    if len(spares) > MAX_SPARE_EVENTS or len(set(spares)) != len(spares) or not in_use.isdisjoint(spares) \
            or 0 in spares:
        raise InvariantError("a spare event is held twice, or is still in use, or the spares pass their bound")
    for i in range(self.pools.deferred_frees.size()):
        if not self.pools.capturing or self.pools.deferred_frees[i].block.state == BLOCK_FREE:
            raise InvariantError("a free waits for a capture to end, but none is running, or its block is free")
        pending_blocks.add(<uintptr_t>self.pools.deferred_frees[i].block)
        active += self.pools.deferred_frees[i].block.size
    _check_private_pools(self)
    for lp in self.live:
        if lp.second.addr != lp.first or lp.second.state != BLOCK_ALLOCATED:
            raise InvariantError(f"live pointer 0x{lp.first:x} maps to a block that is not its allocation")
        if lp.second.requested > lp.second.size:
            raise InvariantError(f"live block 0x{lp.first:x} holds {lp.second.size} bytes for a request of "
                                 f"{lp.second.requested}")
        allocated += lp.second.size
        requested += lp.second.requested
        active += lp.second.size
    for sp in self.segments.by_serial:
        seg = sp.second
        if seg.handles.size() != seg.size // seg.chunk_size:
            raise InvariantError(f"segment {seg.serial}: chunk count")
        c = 0
        for i in range(seg.handles.size()):
            if seg.handles[i] != 0:
                c += 1
                reserved += seg.chunk_size
                if _slotted(seg, i):
                    raise InvariantError(f"segment {seg.serial} chunk {i}: mapped whole and re-backed in slots")
            elif _slotted(seg, i):
                if seg.slots[i].size() * self.k.slot != seg.chunk_size or seg.chunk_size <= self.k.slot:
                    raise InvariantError(f"segment {seg.serial} chunk {i}: {seg.slots[i].size()} slots")
                mapped_slots = sum(1 for h in seg.slots[i] if h != 0)
                c += mapped_slots != 0
                reserved += mapped_slots * self.k.slot
        if seg.slots.size() and (seg.owner != NULL or seg.size_class != SIZE_LARGE):
            raise InvariantError(f"segment {seg.serial}: re-backed chunks outside the default pool's large class")
        if c != seg.mapped_chunks or c == 0:
            raise InvariantError(f"segment {seg.serial}: mapped chunk count {seg.mapped_chunks}, {c} handles")
        at = seg.va
        b = seg.first
        if b == NULL or b.prev != NULL:
            raise InvariantError(f"segment {seg.serial}: first block")
        while b != NULL:
            if b.addr != at or b.size == 0 or b.seg != seg:
                raise InvariantError(f"blocks do not tile segment {seg.serial} at offset {at - seg.va}")
            if self.frees.by_addr.count(b.addr) == 0 or self.frees.by_addr[b.addr] != b:
                raise InvariantError(f"address index misses the block at 0x{b.addr:x}")
            if b.next != NULL and b.next.prev != b:
                raise InvariantError(f"block links broken at 0x{b.addr:x}")
            if b.state == BLOCK_FREE:
                free_count += 1
                if _index_of(self, b).count(key_of(b)) == 0:
                    raise InvariantError(f"free block at 0x{b.addr:x} is not indexed")
                if b.next != NULL and b.next.state == BLOCK_FREE and b.next.stream == b.stream:
                    raise InvariantError(f"free neighbours of stream {b.stream} at 0x{b.addr:x} are not merged")
            elif b.state == BLOCK_ALLOCATED:
                if self.live.count(b.addr):
                    if self.live[b.addr] != b:
                        raise InvariantError(f"allocated block at 0x{b.addr:x} is not the live one")
                elif <uintptr_t>b not in pending_blocks:
                    raise InvariantError(f"allocated block at 0x{b.addr:x} is neither live nor pending")
            elif b.state == BLOCK_CLAIMED:
                if b.sblock == NULL or b.sblock.alloc == NULL:
                    raise InvariantError(f"claimed block at 0x{b.addr:x} has no sBlock in use")
            elif b.state == BLOCK_UNMAPPED:
                hole_count += 1
                key = key_of(b)
                key.size = 0
                if _holes(self, seg.size_class).count(key) == 0:
                    raise InvariantError(f"hole at 0x{b.addr:x} is not indexed")
                if b.next != NULL and b.next.state == BLOCK_UNMAPPED:
                    raise InvariantError(f"neighbouring holes at 0x{b.addr:x} are not merged")
            unit = _unit_floor(self, seg, b.addr - seg.va)
            while unit < b.addr + b.size - seg.va:
                if (b.state == BLOCK_UNMAPPED) != (_unit_handle(self, seg, unit) == 0):
                    raise InvariantError(f"segment {seg.serial} at offset {unit}: block state {b.state} over "
                                         f"{'a released' if _unit_handle(self, seg, unit) == 0 else 'a live'} unit")
                if b.state == BLOCK_UNMAPPED and (unit < b.addr - seg.va or
                                                  unit + _unit_at(self, seg, unit) > b.addr + b.size - seg.va):
                    raise InvariantError(f"hole at 0x{b.addr:x} does not cover whole units")
                unit += _unit_at(self, seg, unit)
            at += b.size
            b = b.next
        if at != seg.va + seg.size:
            raise InvariantError(f"blocks do not cover segment {seg.serial}")
    for pp in self.pools.by_id:
        index_count += pp.second.free_small.size() + pp.second.free_large.size()
    if index_count != free_count:
        raise InvariantError("free index holds blocks that are not free")
    if self.frees.holes_small.size() + self.frees.holes_large.size() != hole_count:
        raise InvariantError("hole index does not hold exactly the holes")
    for fp in self.frees.large:
        if fp.second.seg.size_class != SIZE_LARGE or fp.second.state != BLOCK_FREE:
            raise InvariantError("large free index holds a block that is not a free large-pool block")
    for fp in self.frees.small:
        if fp.second.seg.owner != NULL:
            raise InvariantError(f"the default free index holds block 0x{fp.second.addr:x} of private pool "
                                 f"{fp.second.seg.owner.id}")
    for fp in self.frees.large:
        if fp.second.seg.owner != NULL:
            raise InvariantError(f"the default free index holds block 0x{fp.second.addr:x} of private pool "
                                 f"{fp.second.seg.owner.id}")
    for sp in self.segments.by_serial:
        maps.assign(sp.second.sblock_maps.size(), 0)
        for bp in self.sblock_cache.all:
            for i in range(bp.second.chunks.size()):
                if bp.second.chunks[i].seg == sp.second:
                    maps[bp.second.chunks[i].index] += 1
        for i in range(maps.size()):
            if maps[i] != sp.second.sblock_maps[i]:
                raise InvariantError(f"segment {sp.second.serial} chunk {i}: {sp.second.sblock_maps[i]} sBlock "
                                     f"maps counted, {maps[i]} sBlocks map it")
    c = 0
    for bp in self.sblock_cache.all:
        sb = bp.second
        sblock_va += sb.va_size
        j = 0
        for i in range(sb.chunks.size()):
            j += sb.chunks[i].size
        if j != sb.va_size:
            raise InvariantError(f"sBlock {sb.serial}: VA of {sb.va_size} bytes maps {j} bytes of chunks")
        j = 0
        for i in range(sb.pieces.size()):
            j += sb.pieces[i].size
        if j != sb.capacity or sb.offset + sb.capacity > sb.va_size:
            raise InvariantError(f"sBlock {sb.serial}: capacity {sb.capacity} against pieces of {j} bytes")
        if sb.alloc == NULL:
            c += 1
            if sb.claimed.size() != 0:
                raise InvariantError(f"cached sBlock {sb.serial} claims blocks")
            if self.sblock_cache.by_fit.count(sblock_key(sb)) == 0 or self.sblock_cache.by_age.count(sb.last_use) == 0:
                raise InvariantError(f"cached sBlock {sb.serial} is not indexed")
        else:
            if not (self.live.count(sb.alloc.addr) or <uintptr_t>sb.alloc in pending_blocks):
                raise InvariantError(f"sBlock {sb.serial} in use by an allocation neither live nor pending")
            j = 0
            for i in range(sb.claimed.size()):
                if sb.claimed[i].state != BLOCK_CLAIMED or sb.claimed[i].sblock != sb:
                    raise InvariantError(f"sBlock {sb.serial} lists a block it does not claim")
                j += sb.claimed[i].size
            if j != sb.alloc.size:
                raise InvariantError(f"sBlock {sb.serial}: claimed {j} bytes for an allocation of {sb.alloc.size}")
    if not (c == self.sblock_cache.by_fit.size() == self.sblock_cache.by_age.size()):
        raise InvariantError(f"cached sBlocks: {c} counted, {self.sblock_cache.by_fit.size()} indexed, "
                             f"{self.sblock_cache.by_age.size()} in LRU")
    # Every statistic against the structures, and every peak at least its current value.
    counted = (("reserved", self.st.reserved, reserved), ("allocated", self.st.allocated, allocated),
               ("requested", self.st.requested, requested), ("active", self.st.active, active),
               ("sblock_va", self.st.sblock_va, sblock_va), ("live_blocks", self.st.live_blocks, self.live.size()))
    for name, stat, actual in counted:
        if stat != actual:
            raise InvariantError(f"statistic {name} is {stat}, but the structures hold {actual}")
    peaks = (("allocated", self.st.allocated, self.st.peak_allocated),
             ("requested", self.st.requested, self.st.peak_requested),
             ("reserved", self.st.reserved, self.st.peak_reserved),
             ("active", self.st.active, self.st.peak_active),
             ("sblock_va", self.st.sblock_va, self.st.peak_sblock_va))
    for name, current, peak in peaks:
        if peak < current:
            raise InvariantError(f"peak {name} {peak} is below its current value {current}")
    if not (self.st.requested <= self.st.allocated <= self.st.active <= self.st.reserved):
        raise InvariantError(f"requested {self.st.requested} <= allocated {self.st.allocated} <= active "
                             f"{self.st.active} <= reserved {self.st.reserved} does not hold")


def _check_private_pools(Allocator self) -> None:
    """_check_invariants' part for private pools: Note [Private pools] as invariants."""
    cdef pair[uint64_t, PrivatePool*] pp
    cdef pair[uint64_t, Segment*] sp
    cdef pair[FreeKey, Block*] fp
    cdef PrivatePool* p
    cdef Segment* seg
    cdef Block* b
    cdef size_t i, capturing = 0, active = 0
    counts = {}
    for sp in self.segments.by_serial:
        seg = sp.second
        if seg.owner == NULL:
            if seg.free_index != free_index(self, seg.size_class):
                raise InvariantError(f"segment {seg.serial} of the default pool indexes its free blocks elsewhere")
            continue
        p = seg.owner
        if seg.free_index != (&p.free_small if seg.size_class == SIZE_SMALL else &p.free_large):
            raise InvariantError(f"segment {seg.serial} of private pool {p.id} indexes its free blocks elsewhere")
        if self.pools.by_id.count(p.id) == 0 or self.pools.by_id[p.id] != p:
            raise InvariantError(f"segment {seg.serial} belongs to a private pool that is not known")
        n, r = counts.get(p.id, (0, 0))
        counts[p.id] = (n + 1, r + seg.size)
        if seg.mapped_chunks * seg.chunk_size != seg.size:
            raise InvariantError(f"segment {seg.serial} of private pool {p.id} is unmapped in part")
        for i in range(seg.sblock_maps.size()):
            if seg.sblock_maps[i]:
                raise InvariantError(f"segment {seg.serial} of private pool {p.id} is stitched into an sBlock")
    for pp in self.pools.by_id:
        p = pp.second
        if p.id != pp.first or p.use_count < 0:
            raise InvariantError(f"private pool {pp.first}: id {p.id}, use count {p.use_count}")
        if (p.segments, p.reserved) != counts.get(p.id, (0, 0)):
            raise InvariantError(f"private pool {p.id} counts {p.segments} segments of {p.reserved} bytes; it "
                                 f"owns {counts.get(p.id, (0, 0))}")
        if p.use_count == 0 and (p.segments == 0 or p.active):
            raise InvariantError(f"released private pool {p.id} is still kept (no segments, or active)")
        if p.capturing and not p.active:
            raise InvariantError(f"private pool {p.id} is capturing but not active")
        active += p.active
        capturing += p.capturing
        for fp in p.free_small:
            if fp.second.seg.owner != p or fp.second.seg.size_class != SIZE_SMALL or fp.second.state != BLOCK_FREE:
                raise InvariantError(f"private pool {p.id}'s small free index holds a block not its own free one")
        for fp in p.free_large:
            if fp.second.seg.owner != p or fp.second.seg.size_class != SIZE_LARGE or fp.second.state != BLOCK_FREE:
                raise InvariantError(f"private pool {p.id}'s large free index holds a block not its own free one")
    if active != self.pools.active.size() or capturing != self.pools.capturing:
        raise InvariantError(f"{self.pools.active.size()} pools listed active, {active} marked; {self.pools.capturing} "
                             f"capturing counted, {capturing} marked")
    for i in range(self.pools.active.size()):
        if not self.pools.active[i].active:
            raise InvariantError(f"private pool {self.pools.active[i].id} is listed active but is not")


cdef void _verify_after_operation(Allocator self) noexcept with gil:
    """Note [Invariant checks inside the allocator]: with debug_checks on (always in a GMLAKE_DEBUG build), every
    operation ends by verifying every invariant, as mimalloc's debug mode does, so a bug is caught at the
    operation that made it, whichever path (Python, replay, torch) called. A debug build aborts with the broken
    invariant's name: an allocator that has corrupted its own state must not hand out more memory. Switched on
    from Python, the error is raised by the next Python call instead, for tests.

    The Python work lives here, a `with gil` function that the nogil Allocator._debug_check calls: a nogil
    function that holds Python objects takes the GIL on every call (to release them), which doubled the cost of a
    cache hit; the nogil Allocator._debug_check holds none."""
    if self.invariant_error is not None:
        return
    self.checks_run += 1
    try:
        self.check()
    except BaseException as exc:
        if GMLAKE_DEBUG:
            message = f"gmlake: invariant broken: {exc}\n".encode()
            fprintf(stderr, "%s", <const char*>message)
            abort()
        self.invariant_error = exc
