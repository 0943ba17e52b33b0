# The allocator core, growth strategy "chunks" (ChunkGrowth): the paper's design. New memory is a segment of whole
# chunks of `chunk_size` bytes; a stitch's shortfall is such a segment too, stitched after the free pieces; the
# small size class grows by segments of `small_segment_size`. Included into _allocator.pyx (see _growth.pxi).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   ChunkGrowth


cdef class ChunkGrowth(Growth):
    """A request's new memory in whole chunks, stitched with free blocks where that saves chunks."""

    def __cinit__(self):
        self.stitches = True

    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil:
        cdef Segment* seg
        if size_class == SIZE_SMALL:
            seg = _laid_out_segment(a, why, SIZE_SMALL, size, a.k.small_segment_size, a.k.small_segment_size, stream)
        else:
            seg = _laid_out_segment(a, why, SIZE_LARGE, size, round_up(size, a.k.chunk_size), a.k.chunk_size, stream)
        return _take(a, why, seg.first, size, stream) if seg != NULL else NULL

    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil:
        # A stitch that needs new chunks anyway must save `min_saved_chunks` of them, or it only costs driver calls
        # (with 0 it also packs the new chunks after a free chunk tail, as one contiguous range would).
        cdef size_t C = a.k.chunk_size
        return shortfall == 0 or round_up(shortfall, C) + a.k.min_saved_chunks * C <= round_up(size, C)

    cdef bint new_piece(self, Allocator a, Failure* why, size_t shortfall, int64_t stream, Piece* piece,
                        Segment** undo) noexcept nogil:
        cdef Segment* seg = _laid_out_segment(a, why, SIZE_LARGE, shortfall, round_up(shortfall, a.k.chunk_size),
                                              a.k.chunk_size, stream)
        if seg == NULL:
            return False
        _insert_free(a, seg.first)
        piece.addr = seg.va
        piece.size = shortfall
        undo[0] = seg       # its chunks were never handed out: given back without a sync if the stitch fails
        return True

    cdef void private_layout(self, Allocator a, int size_class, size_t size, size_t* segment_size,
                             size_t* handle_size) noexcept nogil:
        if size_class == SIZE_SMALL:
            segment_size[0] = handle_size[0] = a.k.small_segment_size
        else:
            handle_size[0] = a.k.chunk_size             # the paper's design: the request in whole chunks
            segment_size[0] = round_up(size, a.k.chunk_size)

    cdef size_t whole_pages(self, Allocator a, size_t room, bint binds) noexcept nogil:
        return room - room % a.k.chunk_size if a.k.chunk_size else room

    def page(self, policy, bint binds=False):
        return policy.chunk_size
