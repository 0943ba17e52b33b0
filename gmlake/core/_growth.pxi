# The allocator core, room "growth": how new memory is laid out when no free block fits, as one interface (Growth,
# declared in _allocator.pxd) chosen once when the allocator is made. Its strategies, one file each:
#   _growth_chunks.pxi      ChunkGrowth: the paper's design, a request's shortfall in whole chunks, stitched
#   _growth_pytorch.pxi     PyTorchGrowth: PyTorch's native sizes, one chunk per segment, no stitch
#   _growth_expandable.pxi  ExpandableGrowth: one range per stream and size class, grown by chunks mapped in place
# Stitch-or-grow (_sblocks.pxi) and the pressure loop (_requests.pxi) are written once, over this interface; no room
# asks which strategy is in use, and what a report or hint needs to know of it (the page a request maps, what fits
# under a bound) it asks the growth (whole_pages, page, oom_pages). The core knows no growth by name: the table of
# growths (gmlake/policies/growths.py) names each built-in class. Included into _allocator.pyx; every function takes the Allocator whose lock its
# caller holds and, where it can fail, the call's Failure (Note [A call's failure]).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _laid_out_segment, _pytorch_alloc_size, _growth_of


cdef Segment* _laid_out_segment(Allocator self, Failure* why, int size_class, size_t size, size_t segment_size,
                                size_t handle_size, int64_t stream) noexcept nogil:
    """Growth seam: a new mapped segment for `size` bytes, `segment_size` bytes in chunks of `handle_size` unless
    the policy's segment_layout lays it out otherwise."""
    if self.k.hook_layout:
        _ask_layout(self, why, size_class, size, stream, &segment_size, &handle_size)
    return _new_segment(self, why, size_class, segment_size, handle_size, stream, True)


cdef size_t _pytorch_alloc_size(Allocator self, int size_class, size_t size) noexcept nogil:
    """PyTorch's segment sizing, the one place it is written: the bytes its get_allocation_size asks the device for
    to serve `size`: a small segment, a large segment for requests under min_large_alloc, else the request rounded
    up to round_large."""
    if size_class == SIZE_SMALL:
        return self.k.small_segment_size
    return self.k.large_segment_size if size < self.k.min_large_alloc else round_up(size, self.k.round_large)


cdef class Growth:
    """How new memory is laid out (see _allocator.pxd). This base grows nothing: a subclass (a built-in strategy, or
    a research policy's own, from Policy.cython_growth()) says how. A subclass in another module subclasses one of
    the built-ins and overrides what it changes, compiled against gmlake's .pxd files as a Seams subclass is."""

    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil:
        why.err = ERR_OOM
        return NULL

    cdef bint refuses(self, Allocator a, Failure* why, int size_class, size_t size) noexcept nogil:
        return False

    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil:
        return False

    cdef bint new_piece(self, Allocator a, Failure* why, size_t shortfall, int64_t stream, Piece* piece,
                        Segment** undo) noexcept nogil:
        return False

    cdef void private_layout(self, Allocator a, int size_class, size_t size, size_t* segment_size,
                             size_t* handle_size) noexcept nogil:
        segment_size[0] = handle_size[0] = _pytorch_alloc_size(a, size_class, size)

    cdef int pressure_stage(self, Allocator a, int attempt) noexcept nogil:
        """The built-in stages: with blocks shared across streams, release what the other size class holds free,
        then everything; with blocks kept per stream (PyTorch's rule), everything, twice; then, where the policy
        sets reback_slot, re-back partly used chunks (Note [Taking slots back at the edge]); then give up. Every
        action first waits for all streams."""
        if attempt == 2 and a.k.reback_slot:
            return PRESSURE_REBACK
        if attempt >= 2:
            return PRESSURE_GIVE_UP
        if attempt == 0 and a.k.cross_stream:
            return PRESSURE_RELEASE_OTHER
        return PRESSURE_RELEASE_ALL

    cdef Segment* new_segment(self, Allocator a, Failure* why, int size_class, size_t size, size_t segment_size,
                              size_t handle_size, int64_t stream) noexcept nogil:
        return _laid_out_segment(a, why, size_class, size, segment_size, handle_size, stream)

    cdef Block* take(self, Allocator a, Failure* why, Block* b, size_t size, int64_t stream) noexcept nogil:
        return _take(a, why, b, size, stream)

    cdef size_t whole_pages(self, Allocator a, size_t room, bint binds) noexcept nogil:
        # PyTorch's sizing: `room` in round_large steps, none where a request that small would take a whole
        # large_segment_size segment instead.
        if a.k.round_large:
            room -= room % a.k.round_large
        if room < a.k.min_large_alloc and room < a.k.large_segment_size:
            room = 0
        return room

    def page(self, policy, bint binds=False):
        """The large page a request's new memory maps in under this growth with `policy`'s knobs, where a cap below
        the device's memory binds or not: 0 where new memory is a segment sized to the request (no page)."""
        return 0

    def oom_pages(self, policy):
        """What the out-of-memory hint may suggest refining (gmlake.core.errors.OutOfMemory.torch_message): the large
        pages of ranges this growth maps in place, those it maps while a cap binds, and its tail pages; None each
        where it maps no such range."""
        return None, None, None


cdef Growth _growth_of(policy):
    """The growth a policy chose: its cython_growth(), else the class of the built-in its segment_rule names (the
    table of growths, gmlake/policies/growths.py, through Policy.growth_class)."""
    growth = policy.cython_growth()
    if growth is None:
        return policy.growth_class()()
    if not isinstance(growth, Growth):
        raise TypeError(f"gmlake: policy {policy.name}: cython_growth() must return a gmlake.core._allocator.Growth or "
                        f"None, got {type(growth).__name__}")
    return growth
