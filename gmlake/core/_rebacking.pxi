# The allocator core, room "segments", continued: taking the free slots of partly used chunks back at the edge.
# Included into _allocator.pyx; every function takes the Allocator whose lock its caller holds and the call's Failure
# (Note [A call's failure]). Writes only what the segments room owns (a segment's handles and slots) and asks the
# blocks room to carve the holes (_carve_hole).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _reback_chunks
#
# Note [Taking slots back at the edge]: a handle maps only whole, so the free bytes inside a chunk that also holds a
# live block are out of reach of growth and stitching alike: at the edge of memory, on a device or under a cap
# barely larger than the peak, they are what keeps a request from fitting where 2 MiB chunks would fit
# (docs/benchmarks.md, "At the edge of memory"). Finer chunks from the start would reach them, but the driver
# charges per handle, so every run would pay for a packing that only the runs at their limit need. A policy that
# sets `reback_slot` keeps its coarse chunks and, as the last pressure stage (PRESSURE_REBACK, after every free
# chunk went back), re-backs each partly used chunk of the default pool that no sBlock maps: its live slots (reback_slot bytes each)
# are copied to the host, the chunk is unmapped, one new handle per live slot is mapped at the same addresses and
# the bytes copied back, and the chunk's handle is released. Pointers stay valid; the free slots become unmapped
# holes that growth fills slot by slot from then on (the chunk stays re-backed, so the next step finds its slots
# where the last one left them and nothing is copied twice). The new handles are created before the chunk is
# released where the limit leaves room for them (so a failure leaves the chunk as it was), else after.
#
# It runs only after a device-wide synchronize (the live bytes must be final before they are copied), never during
# a graph capture, and only in the default pool: a private pool's memory belongs to a CUDA graph (or a MemPool)
# whose replays touch it with no request in sight, so it is never copied or unmapped (tests/test_edge_rules.py).
# A run that never reaches its limit makes none of these calls.
#
# The hazard, and why it is off by default (`reback_slot=0` in every built-in policy): a handle maps only whole and
# at its offset 0, so the slots cannot be mapped over the chunk while it is mapped, and the chunk cannot be unmapped
# in part; the live bytes are therefore unmapped from the unmap to the copy back. The synchronize covers only work
# launched before it: a kernel that another thread launches on a live tensor in that window reads or writes an
# unmapped address: an illegal memory access, which loses the CUDA context and the job with it
# (tests/gpu_scripts/concurrent_writer.py runs that scenario). No CUDA call closes the window: the tensors' addresses must stay, so the new slots cannot be mapped elsewhere
# first, and nothing in the driver API blocks other threads' launches. PyTorch's allocators never move or unmap
# memory a live tensor uses; the default does not either, and gives up the free bytes inside partly used chunks
# at the edge instead. A process whose work one thread launches (and no other library launches on its tensors)
# may turn it on. What it buys at the edge, and what its copies cost, is measured in docs/benchmarks.md ("At the edge
# of memory"; `python -m bench edge`).


cdef size_t _reback_chunks(Allocator self, Failure* why) noexcept nogil:
    """Re-back every partly used chunk of the default pool's large class that no sBlock maps, the ones with the
    most free slots first. Returns the bytes given back to the driver."""
    cdef size_t S = self.k.reback_slot
    cdef vector[pair[size_t, pair[uint64_t, size_t]]] order     # (-free slots, (segment serial, chunk))
    cdef pair[uint64_t, Segment*] entry
    cdef Segment* seg
    cdef vector[bint] live
    cdef vector[char] staging
    cdef size_t i, free_slots, released = 0
    if S == 0 or _capturing(self) or _unannounced_capture(self, why):
        return 0
    for entry in self.segments.by_serial:
        seg = entry.second
        if seg.size_class != SIZE_LARGE or seg.owner != NULL or seg.chunk_size <= S or seg.chunk_size % S:
            continue
        for i in range(seg.handles.size()):
            if seg.handles[i] == 0 or seg.sblock_maps[i] != 0:
                continue
            free_slots = _live_slots(self, seg, i, live)
            if free_slots:
                order.push_back(pair[size_t, pair[uint64_t, size_t]](
                    <size_t>0 - free_slots, pair[uint64_t, size_t](seg.serial, i)))
    if order.empty():
        return 0
    sort(order.begin(), order.end())
    if _sync(self, why) != DRIVER_OK:
        return 0
    for i in range(order.size()):
        seg = self.segments.by_serial[order[i].second.first]
        released += _reback_chunk(self, why, seg, order[i].second.second, live, staging)
        if why.err != ERR_NONE:
            break
    return released


cdef size_t _live_slots(Allocator self, Segment* seg, size_t chunk, vector[bint]& live) noexcept nogil:
    """Mark which slots of a mapped chunk hold any byte not in a free block; returns how many are wholly free."""
    cdef size_t S = self.k.reback_slot
    cdef size_t C = seg.chunk_size
    cdef uintptr_t lo = seg.va + chunk * C
    cdef uintptr_t hi = lo + C
    cdef uintptr_t a, z
    cdef size_t first, end, j, free_slots = 0
    cdef Block* b = _containing(self, lo)
    live.assign(C // S, True)
    while b != NULL and b.addr < hi:
        if b.state == BLOCK_FREE:
            a = b.addr if b.addr > lo else lo
            z = b.addr + b.size if b.addr + b.size < hi else hi
            first = (a - lo + S - 1) // S
            end = (z - lo) // S
            for j in range(first, end):
                live[j] = False
                free_slots += 1
        b = b.next
    return free_slots if free_slots < C // S else 0     # a wholly free chunk is released, not re-backed


cdef size_t _reback_chunk(Allocator self, Failure* why, Segment* seg, size_t chunk, vector[bint]& live,
                          vector[char]& staging) noexcept nogil:
    """Re-back one chunk (Note [Taking slots back at the edge]). Returns the bytes given back; 0 with why.err set
    where a driver call failed (the chunk then stays as it was, unless the failure came after its handle was
    released)."""
    cdef size_t S = self.k.reback_slot
    cdef size_t C = seg.chunk_size
    cdef uintptr_t lo = seg.va + chunk * C
    cdef size_t k, j, n, run, copied, live_count, at
    cdef uint64_t old = seg.handles[chunk]
    cdef vector[uint64_t] fresh
    cdef bint early
    cdef int rc = DRIVER_OK
    if _live_slots(self, seg, chunk, live) == 0:
        return 0
    k = C // S
    live_count = 0
    for j in range(k):
        live_count += live[j]
    staging.resize(live_count * S)
    # 1. the live slots' bytes to the host, run by run
    copied = live_count * S
    if _copy_runs(self, why, lo, live, staging, True) != DRIVER_OK:
        return 0
    # 2. the new handles, before the chunk goes where the limit leaves room for both
    early = not (self.st.reserved + copied > self.limit_bytes)
    if early and _create_slots(self, why, live_count, fresh) != DRIVER_OK:
        if why.err != ERR_NONE:
            return 0
        early = False               # the device has no room for both: release the chunk first
    rc = _call(self, why, CALL_UNMAP, self.driver.unmap(lo, C), 1)
    if rc != DRIVER_OK:
        for j in range(fresh.size()):
            _release_handle(self, why, fresh[j], S)
        return 0
    if not early:
        _release_handle(self, why, old, C)
        if _create_slots(self, why, live_count, fresh) != DRIVER_OK:
            _restore_chunk(self, why, seg, chunk, live, staging, fresh)
            return 0
    # 3. the new handles at the live slots' addresses, one access grant per run, and the bytes back
    seg.handles[chunk] = 0
    seg.slots[chunk].assign(k, 0)
    n = 0
    j = _run_start(live, 0, True)
    while j < k and rc == DRIVER_OK:
        run = _run_end(live, j, True)
        for at in range(j, run):
            rc = _call(self, why, CALL_MAP, self.driver.map(lo + at * S, S, fresh[n]), 1)
            if rc != DRIVER_OK:
                break
            seg.slots[chunk][at] = fresh[n]
            n += 1
        if rc == DRIVER_OK:
            rc = _call(self, why, CALL_SET_ACCESS, self.driver.set_access(lo + j * S, (run - j) * S), run - j)
        j = _run_start(live, run, True)
    if rc == DRIVER_OK:
        rc = _copy_runs(self, why, lo, live, staging, False)
    if rc != DRIVER_OK:
        _restore_chunk(self, why, seg, chunk, live, staging, fresh)
        if early:
            _release_handle(self, why, old, C)
        return 0
    if early:
        _release_handle(self, why, old, C)
    self.st.reserved -= C - live_count * S
    self.st.rebacked_chunks += 1
    self.st.chunks_released += 1
    self.st.copied_bytes += copied
    # 4. the free slots become holes (merged with the holes beside them)
    j = _run_start(live, 0, False)
    while j < k:
        run = _run_end(live, j, False)
        _carve_hole(self, _containing(self, lo + j * S), lo + j * S, lo + run * S)
        self._record(TRACE_SEGMENT_UNMAP, lo + j * S, (run - j) * S, ANY_STREAM)
        j = _run_start(live, run, False)
    return (k - live_count) * S


cdef void _restore_chunk(Allocator self, Failure* why, Segment* seg, size_t chunk, vector[bint]& live,
                         vector[char]& staging, vector[uint64_t]& fresh) noexcept nogil:
    """A re-back that failed after its chunk was unmapped: unmap and give back the slots mapped so far and the new
    handles, map one new whole handle at the chunk and copy the live slots back, so the chunk is as it was (the
    call's failure says what failed). Only if that fails too are the chunk's bytes lost: its handle is then 0 and
    why.err says so."""
    cdef size_t S = self.k.reback_slot
    cdef size_t C = seg.chunk_size
    cdef uintptr_t lo = seg.va + chunk * C
    cdef size_t k = C // S, j
    cdef vector[uint64_t] whole
    cdef int rc
    if _slotted(seg, chunk):
        for j in range(k):
            if seg.slots[chunk][j] != 0:
                _call(self, why, CALL_UNMAP, self.driver.unmap(lo + j * S, S), 1)
        seg.slots.erase(chunk)
    for j in range(fresh.size()):
        _release_handle(self, why, fresh[j], S)
    fresh.clear()
    seg.handles[chunk] = 0
    rc = _map_new_chunks(self, why, lo, 1, C, whole, C, False, True)
    if rc == DRIVER_OK:
        rc = _copy_runs(self, why, lo, live, staging, False)
    if rc == DRIVER_OK:
        seg.handles[chunk] = whole[0]
    elif why.err == ERR_NONE:
        why.err = ERR_DRIVER
        why.code = rc
        why.call = CALL_CREATE


cdef inline size_t _run_start(vector[bint]& live, size_t j, bint value) noexcept nogil:
    """The first slot at or after j whose liveness is `value` (live.size() where none is)."""
    while j < live.size() and live[j] != value:
        j += 1
    return j


cdef inline size_t _run_end(vector[bint]& live, size_t j, bint value) noexcept nogil:
    """The end of the run of slots from j whose liveness is `value`."""
    while j < live.size() and live[j] == value:
        j += 1
    return j


cdef int _copy_runs(Allocator self, Failure* why, uintptr_t lo, vector[bint]& live, vector[char]& staging,
                    bint out) noexcept nogil:
    """Copy the live slots of the chunk at `lo` to `staging`, packed in order (`out`), or back from it: one copy per
    run of live slots. Returns the driver's code."""
    cdef size_t S = self.k.reback_slot
    cdef size_t at = 0, run, bytes_
    cdef size_t j = _run_start(live, 0, True)
    cdef int rc = DRIVER_OK
    while j < live.size() and rc == DRIVER_OK:
        run = _run_end(live, j, True)
        bytes_ = (run - j) * S
        if out:
            rc = _call(self, why, CALL_COPY_OUT, self.driver.copy_out(&staging[at], lo + j * S, bytes_), 0)
        else:
            rc = _call(self, why, CALL_COPY_IN, self.driver.copy_in(lo + j * S, &staging[at], bytes_), 0)
        at += bytes_
        j = _run_start(live, run, True)
    return rc


cdef int _create_slots(Allocator self, Failure* why, size_t n, vector[uint64_t]& fresh) noexcept nogil:
    """Create `n` handles of one slot each into `fresh`; on failure none is kept. Returns the driver's code."""
    cdef uint64_t handle = 0
    cdef size_t i
    cdef int rc = DRIVER_OK
    fresh.clear()
    for i in range(n):
        rc = _call(self, why, CALL_CREATE, self.driver.create_chunk(self.k.reback_slot, &handle), 1)
        if rc != DRIVER_OK:
            break
        fresh.push_back(handle)
    if rc != DRIVER_OK:
        for i in range(fresh.size()):
            _release_handle(self, why, fresh[i], self.k.reback_slot)
        fresh.clear()
    return rc
