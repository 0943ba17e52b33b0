# The allocator core: what the Python API reports, built into Python objects: statistics, the history, segments,
# spares, and the exception for a call that failed. Included into _allocator.pyx. Each Allocator method (its
# signature and docstring) calls its _api_* function here, which copies what it reports under the lock through
# _api_steps.pxi and builds Python objects after the lock is let go.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _api_stats, _api_history, _api_segments_info, _api_spares, _api_failure, _api_share_units


cdef dict _api_stats(Allocator self):
    cdef StatsCopy c
    cdef Stats s
    cdef size_t i
    with nogil:
        _copy_stats(self, &c)
    s = c.st
    # the planner's counters (Note [A plan learned from the run]), read beside the copy (plain integers that only the
    # lock holder writes; a report may be a request behind), with the driver calls as the copy counted them
    plan = self.planner.report(sum(s.calls[i] for i in range(len(CALL_NAMES))))
    return {
        "allocated_bytes": s.allocated,
        "peak_allocated_bytes": s.peak_allocated,
        "requested_bytes": s.requested,
        "peak_requested_bytes": s.peak_requested,
        "reserved_bytes": s.reserved,
        "peak_reserved_bytes": s.peak_reserved,
        "active_bytes": s.active,
        "peak_active_bytes": s.peak_active,
        "sblock_va_bytes": s.sblock_va,
        "peak_sblock_va_bytes": s.peak_sblock_va,
        "live_blocks": s.live_blocks,
        "pending_frees": c.pending,
        "orphans": c.orphans,
        "orphan_chunk_bytes": c.orphan_bytes,
        "cached_sblocks": c.cached,
        "allocs": s.allocs,
        "frees": s.frees,
        "stitches": s.stitches,
        "stitched_handles": s.stitched_handles,
        "sblock_reuses": s.sblock_reuses,
        "sblock_evictions": s.sblock_evictions,
        "segments_created": s.segments_created,
        "chunks_released": s.chunks_released,
        "ooms": s.ooms,
        "stream_migrations": s.stream_migrations,
        "stream_waits": s.stream_waits,
        "capture_queries": s.capture_queries,
        "rebacked_chunks": s.rebacked_chunks,
        "copied_bytes": s.copied_bytes,
        "tails_cut_at_reuse": s.tails_cut_at_reuse,
        # Note [Leaving the libraries room]: the reserve kept for the libraries now, and what it was measured from
        "libraries_reserve_bytes": c.room_kept,
        "libraries_largest_rise_bytes": c.measure.largest_rise,
        "libraries_rises": c.measure.rises,
        "device_asks": c.measure.asks,
        "calls": {name: s.calls[i] for i, name in enumerate(CALL_NAMES)},
        "handles": {name: s.handles[i] for i, name in enumerate(CALL_NAMES)},
        "plan": plan,
    }


cdef list _api_history(Allocator self):
    cdef vector[TraceEntry] copy
    cdef size_t start, i, n
    with nogil:
        start = _copy_history(self, copy)
    names = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
             "segment_unmap", "oom")
    n = copy.size()
    out = []
    for i in range(n):
        e = copy[(start + i) % n]
        # An oom entry's addr holds the device's free bytes, which PyTorch's snapshot names device_free.
        out.append({"action": names[e.action], "device_free" if e.action == TRACE_OOM else "addr": e.addr,
                    "size": e.size, "stream": e.stream, "time_us": e.time_us, "frames": []})
    return out


cdef list _api_segments_info(Allocator self):
    cdef vector[SegmentRow] segs
    cdef vector[BlockRow] rows
    cdef size_t i, j
    with nogil:
        _copy_segments(self, segs, rows)
    names = ("free", "allocated", "claimed", "unmapped")
    out = []
    for i in range(segs.size()):
        blocks = [(rows[j].offset, rows[j].size, names[rows[j].state], rows[j].stream, rows[j].used)
                  for j in range(segs[i].first_row, segs[i].end_row)]
        out.append({"serial": segs[i].serial, "va": segs[i].va,
                    "pool": "small" if segs[i].size_class == SIZE_SMALL else "large",
                    "size": segs[i].size, "chunk_size": segs[i].chunk_size,
                    "mapped_chunks": segs[i].mapped_chunks, "private_pool": segs[i].private_pool,
                    "blocks": blocks})
    return out


cdef dict _api_spares(Allocator self):
    cdef Spares n
    with nogil:
        _count_spares(self, &n)
    return {"blocks": n.blocks, "free_index_nodes": n.free_index_nodes, "address_nodes": n.address_nodes,
            "live_nodes": n.live_nodes, "events": n.events}


cdef object _api_failure(Allocator self, size_t size, Failure* why, int64_t request):
    if why.err == ERR_POLICY:
        return _policy_error(self, size, request)
    if why.err == ERR_DRIVER:
        return DriverError(CALL_NAMES[why.call], why.code, self.driver.describe_error(why.code))
    if why.err == ERR_RAW_CAPTURE:
        return GraphCaptureError(
            f"gmlake: cannot allocate {size} bytes: the stream is being captured into a CUDA graph that the "
            f"allocator was not told of (cudaStreamBeginCapture called outside torch.cuda.graph / "
            f"begin_allocate_to_pool), and the request needs new memory from the driver, which would break the "
            f"capture or hand the graph's memory out again. Capture with torch.cuda.graph (or call "
            f"begin_allocate_to_pool first), or allocate this memory before capturing.")
    if why.err == ERR_CAPTURE and size == 0:
        return GraphCaptureError("gmlake: empty_cache during CUDA graph capture: it must synchronize the device, "
                                 "which stream capture forbids; call it after end_allocate_to_pool")
    if why.err == ERR_CAPTURE:
        return CaptureOutOfMemoryError(
            requested=size, reserved=why.reserved, allocated=why.allocated, cached=why.reserved - why.allocated,
            limit=None if why.limit == NO_LIMIT else why.limit, capacity=self.driver.capacity)
    return OutOfMemoryError(
        requested=size, reserved=why.reserved, allocated=why.allocated, cached=why.reserved - why.allocated,
        limit=None if why.limit == NO_LIMIT else why.limit, capacity=self.driver.capacity)


cdef tuple _api_share_units(Allocator self, uintptr_t ptr):
    cdef vector[pair[uint64_t, size_t]] units
    cdef size_t offset = 0, size = 0
    cdef bint found
    with nogil:
        found = _copy_units(self, ptr, units, &offset, &size)
    if not found:
        raise ValueError(f"gmlake: {ptr:#x} is not a live allocation of this allocator")
    return offset, size, [(units[i].first, units[i].second) for i in range(units.size())]
