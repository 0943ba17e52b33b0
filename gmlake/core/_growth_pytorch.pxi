# The allocator core, growth strategy "pytorch" (PyTorchGrowth): PyTorch's native allocator. A new segment is one
# chunk, sized as its get_allocation_size sizes it (_pytorch_alloc_size); nothing is stitched. Included into
# _allocator.pyx (see _growth.pxi).
#
# API (what the rest of the core calls; every other function here is this file's own):
#   PyTorchGrowth


cdef class PyTorchGrowth(Growth):
    """One chunk per segment, of PyTorch's sizes; no stitch."""

    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil:
        cdef size_t alloc_size = _pytorch_alloc_size(a, size_class, size)
        cdef Segment* seg = _laid_out_segment(a, why, size_class, size, alloc_size, alloc_size, stream)
        return _take(a, why, seg.first, size, stream) if seg != NULL else NULL
