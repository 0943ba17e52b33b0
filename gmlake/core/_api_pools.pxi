# The allocator core: the Python API's methods for private pools (Note [Private pools], _pools.pxi), their bodies.
# Included into _allocator.pyx. Each Allocator method (its signature and docstring) calls its _api_* function here,
# which checks the arguments, runs the method's locked step (_api_steps.pxi) without the GIL and raises for the
# status it returns.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _api_begin_pool, _api_retain_pool, _api_end_pool, _api_release_pool, _api_pools_info


cdef object _api_begin_pool(Allocator self, object pool_id, object streams, object capturing):
    pid = self._pool_id(pool_id)
    cdef vector[int64_t] chosen
    cdef bint every = streams is None
    if not every:
        for s in streams:
            if not isinstance(s, int) or isinstance(s, bool) or s < 0:
                raise ValueError(f"gmlake: begin_allocate_to_pool: streams must be ints >= 0, got {s!r}")
            chosen.push_back(s)
    cdef uint64_t p = pid
    cdef bint cap = bool(capturing)
    cdef int rc
    with nogil:
        rc = _begin_pool_nogil(self, p, chosen, every, cap)
    self._raise_invariant_error()
    if rc == POOL_ALREADY_ACTIVE:
        raise ValueError(f"gmlake: private pool {pid} is already active; end_allocate_to_pool({pid}) first")
    if rc == POOL_RELEASED:
        raise ValueError(f"gmlake: private pool {pid} was released and still holds memory of live blocks; "
                         f"it cannot be begun again until they are freed and empty_cache returns it")


cdef object _api_retain_pool(Allocator self, object pool_id):
    pid = self._pool_id(pool_id)
    cdef uint64_t p = pid
    cdef int rc
    with nogil:
        rc = _retain_pool_nogil(self, p)
    if rc == POOL_NOT_ACTIVE:
        raise ValueError(f"gmlake: retain_pool: private pool {pid} is not active")


cdef object _api_end_pool(Allocator self, object pool_id):
    pid = self._pool_id(pool_id)
    cdef uint64_t p = pid
    cdef int rc
    cdef Failure why                    # the deferred frees' events: one that fails waits for the device
    no_failure(&why)
    with nogil:
        rc = _end_pool_nogil(self, &why, p)
    self._raise_invariant_error()
    if rc == POOL_NOT_ACTIVE:
        raise ValueError(f"gmlake: end_allocate_to_pool: private pool {pid} is not active")


cdef object _api_release_pool(Allocator self, object pool_id):
    pid = self._pool_id(pool_id)
    cdef uint64_t p = pid
    cdef size_t released = 0
    cdef int rc
    cdef Failure why
    no_failure(&why)
    with nogil:
        rc = _release_pool_nogil(self, &why, p, &released)
    self._raise_invariant_error()
    if rc == POOL_UNKNOWN:
        raise ValueError(f"gmlake: release_pool: private pool {pid} has no use to release (never begun, or "
                         f"already released)")
    if rc == POOL_STILL_ACTIVE:
        raise ValueError(f"gmlake: release_pool: private pool {pid} is active; end_allocate_to_pool({pid}) "
                         f"first")
    if rc == POOL_SYNC_FAILED:
        raise self.failure(0, &why)
    return released


cdef list _api_pools_info(Allocator self):
    cdef vector[PoolRow] pools
    cdef vector[int64_t] streams
    cdef size_t i, j
    with nogil:
        _copy_pools(self, pools, streams)
    out = []
    for i in range(pools.size()):
        chosen = None
        if pools[i].active and not pools[i].all_streams:
            chosen = [streams[j] for j in range(pools[i].first_stream, pools[i].end_stream)]
        out.append({"id": pools[i].id, "use_count": pools[i].use_count, "active": pools[i].active,
                    "capturing": pools[i].capturing, "streams": chosen, "segments": pools[i].segments,
                    "reserved_bytes": pools[i].reserved, "allocated_bytes": pools[i].allocated})
    return out
