# cython: language_level=3
"""Cython seams that answer out of range on purpose, one way per `mode`: the core must refuse each (tests/
test_seam_answers.py builds this against the installed gmlake's .pxd files, as a researcher's own .pyx is built)."""
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libcpp.vector cimport vector
from libcpp.pair cimport pair
from cython.operator cimport dereference as deref, preincrement as inc
from gmlake.core._allocator cimport (Allocator, Failure, Seams, Block, SBlock, Piece, FreeIndex, SEAM_PLACE, SEAM_STITCH,
                                SEAM_LAYOUT, SEAM_EVICT, SEAM_PRESSURE, SIZE_SMALL, SIZE_LARGE, free_index)

cdef enum:
    # place modes
    LIVE_BLOCK = 1
    OTHER_STREAM
    TOO_SMALL
    OTHER_POOL
    SBLOCK_IN_USE
    # stitch modes
    OUTSIDE = 1
    NOT_ADDING_UP
    ONE_BLOCK_TWICE
    MISALIGNED

MODES = {"LIVE_BLOCK": LIVE_BLOCK, "OTHER_STREAM": OTHER_STREAM, "TOO_SMALL": TOO_SMALL, "OTHER_POOL": OTHER_POOL,
         "SBLOCK_IN_USE": SBLOCK_IN_USE, "OUTSIDE": OUTSIDE, "NOT_ADDING_UP": NOT_ADDING_UP,
         "ONE_BLOCK_TWICE": ONE_BLOCK_TWICE, "MISALIGNED": MISALIGNED}


cdef Block* first_free(FreeIndex* index, bint (*wanted)(Block*, size_t, int64_t) noexcept nogil, size_t size,
                       int64_t stream) noexcept nogil:
    cdef FreeIndex.iterator it = index.begin()
    while it != index.end():
        if wanted(deref(it).second, size, stream):
            return deref(it).second
        inc(it)
    return NULL


cdef bint of_another_stream(Block* b, size_t size, int64_t stream) noexcept nogil:
    return b.stream != stream and b.stream != -1 and b.size >= size


cdef bint too_small(Block* b, size_t size, int64_t stream) noexcept nogil:
    return b.size < size


cdef bint any_block(Block* b, size_t size, int64_t stream) noexcept nogil:
    return True


cdef SBlock* sblock_in_use(Allocator a) noexcept nogil:
    cdef pair[uint64_t, SBlock*] entry
    for entry in a.sblock_cache.all:
        if entry.second.alloc != NULL:
            return entry.second
    return NULL


cdef class BadSeams(Seams):
    """Answers the seams `bits` names badly as `mode` says: a layout of (seg, handle), a pressure action `action`."""
    cdef public int mode
    cdef public size_t seg, handle
    cdef public int action
    cdef public size_t calls
    cdef public bint armed          # answers badly only while armed (the default answer otherwise)

    def __init__(self, int bits, int mode=0, size_t seg=0, size_t handle=0, int action=0):
        self.overridden = bits
        self.mode = mode
        self.seg = seg
        self.handle = handle
        self.action = action

    cdef void place(self, Allocator a, Failure* why, int pool, size_t size, int64_t stream, Block** b,
                    SBlock** sb) noexcept nogil:
        cdef FreeIndex* own = free_index(a, pool)
        cdef FreeIndex* other = free_index(a, SIZE_LARGE if pool == SIZE_SMALL else SIZE_SMALL)
        cdef pair[uintptr_t, Block*] live
        if not self.armed:
            return
        self.calls += 1
        if self.mode == LIVE_BLOCK:
            for live in a.live:
                b[0] = live.second
                break
        elif self.mode == OTHER_STREAM:
            b[0] = first_free(own, of_another_stream, size, stream)
        elif self.mode == TOO_SMALL:
            b[0] = first_free(own, too_small, size, stream)
        elif self.mode == OTHER_POOL:
            b[0] = first_free(other, any_block, size, stream)
        elif self.mode == SBLOCK_IN_USE and sb != NULL:
            sb[0] = sblock_in_use(a)

    cdef void layout(self, Allocator a, Failure* why, int pool, size_t size, int64_t stream, size_t* segment_size,
                     size_t* handle_size) noexcept nogil:
        if not self.armed:
            return
        self.calls += 1
        segment_size[0] = self.seg
        handle_size[0] = self.handle

    cdef int pressure(self, Allocator a, Failure* why, size_t size, int64_t stream, int pool, int attempt,
                      int default) noexcept nogil:
        if not self.armed:
            return default
        self.calls += 1
        return self.action

    cdef SBlock* evict(self, Allocator a, Failure* why, SBlock* lru_victim, int reason) noexcept nogil:
        if not self.armed:
            return lru_victim
        self.calls += 1
        return sblock_in_use(a)

    cdef void stitch(self, Allocator a, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                     vector[Piece]& pieces, size_t* remaining) noexcept nogil:
        cdef pair[uintptr_t, Block*] live
        if not self.armed:
            return
        self.calls += 1
        if pieces.empty():
            return
        if self.mode == OUTSIDE:
            for live in a.live:
                pieces[0].addr = live.second.addr
                break
        elif self.mode == NOT_ADDING_UP:
            remaining[0] += 4096
        elif self.mode == ONE_BLOCK_TWICE and pieces.size() >= 2:
            pieces[1] = pieces[0]
        elif self.mode == MISALIGNED and pieces.size() >= 2:
            pieces[1].addr += 4096
            pieces[1].size -= 4096
            remaining[0] += 4096
