# The allocator core: small functions over the vocabulary (_structs.h) that every room uses: rounding, peaks, a
# call's failure cleared, the keys that order free blocks and sBlocks. Included into _allocator.pyx, first.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   round_up, peak_update, no_failure, min_size, key_of, expandable_size, free_for, sblock_key


cdef inline size_t round_up(size_t n, size_t m) noexcept nogil:
    return ((n + m - 1) // m) * m


cdef inline void peak_update(size_t* peak, size_t current) noexcept nogil:
    """The one place a peak statistic follows its current value."""
    if current > peak[0]:
        peak[0] = current


cdef inline void no_failure(Failure* why) noexcept nogil:
    """A call's failure, cleared at its start.

    Note [A call's failure]: every call into the core that can fail (malloc, empty_cache, release_pool, ...) keeps
    a Failure on its own stack and passes a pointer to it down to every function on its path; the driver-call funnel
    (_call, room vmm) writes the first driver error there, the request's decisions write ERR_OOM, ERR_CAPTURE and
    the like, and the entry point hands a copy to its caller (_report). Nothing about a failure is kept in the
    allocator between calls, so no call can see, or overwrite, another's. That holds for a policy hook's failure too:
    the seams receive the Failure and mark it (hook_failed); only the exception object, which needs the GIL, waits
    in the calling thread's hook_errors until failure() turns it into the call's PolicyError."""
    why.err = ERR_NONE
    why.hook_failed = False
    why.request = NULL
    why.code = 0
    why.call = 0
    why.reserved = 0
    why.allocated = 0
    why.limit = NO_LIMIT


cdef inline size_t min_size(size_t a, size_t b) noexcept nogil:
    return a if a < b else b


cdef inline FreeKey key_of(Block* b) noexcept nogil:
    cdef FreeKey key
    key.stream = b.stream
    key.size = b.size
    key.serial = b.seg.serial
    key.offset = b.addr - b.seg.va
    return key


cdef inline size_t expandable_size(Block* b) noexcept nogil:
    return b.size + (b.next.size if b.next != NULL and b.next.state == BLOCK_UNMAPPED else 0)


cdef inline bint free_for(Block* b, int64_t stream) noexcept nogil:
    """Is b free and safe for `stream` (freed on it, or on a stream whose work is known done)?"""
    return b.state == BLOCK_FREE and (b.stream == stream or b.stream == ANY_STREAM)


cdef inline SBlockKey sblock_key(SBlock* sb) noexcept nogil:
    cdef SBlockKey key
    key.capacity = sb.capacity
    key.serial = sb.serial
    return key
