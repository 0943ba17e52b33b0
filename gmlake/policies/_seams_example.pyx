# cython: language_level=3
"""Seams and growth decided in Cython: examples of the Cython path (docs/policies.md, "The Cython path").

A research policy subclasses `Seams` in its own .pyx, built against gmlake's installed .pxd files exactly as this
module is, overrides the nogil methods of the seams it decides and sets their bits in `overridden`; its policy's
`cython_seams()` returns an instance. The core then calls those methods through the vtable, without the GIL. How
new memory grows is one more such interface: a policy's `cython_growth()` returns a subclass of a built-in Growth.
"""
from libc.stdint cimport int64_t
from gmlake.core._allocator cimport (Allocator, Failure, Seams, Block, SBlock, FreeIndex, SEAM_PLACE, ANY_STREAM,
                                ChunkGrowth, free_index, largest_free)


cdef class WorstFitSeams(Seams):
    """Placement by worst fit, as gmlake.policies.examples.WorstFit decides it in Python (same choices, tested),
    without the GIL: the largest free block of the request's stream, or of no stream if that one is larger; a
    cached sBlock where the built-in chose one."""

    def __cinit__(self):
        self.overridden = SEAM_PLACE

    cdef void place(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream, Block** b,
                    SBlock** sb) noexcept nogil:
        cdef FreeIndex* index = free_index(a, size_class)
        cdef Block* own
        cdef Block* anyb
        if sb != NULL and sb[0] != NULL:
            return
        own = largest_free(index, stream, size)
        anyb = largest_free(index, ANY_STREAM, size)
        b[0] = anyb if own == NULL or (anyb != NULL and anyb.size > own.size) else own


cdef class StitchOnlyFreeMemory(ChunkGrowth):
    """The paper's chunks, but a stitch only where free pieces cover the whole request: a shortfall is never worth
    new chunks, so a request that free memory cannot cover grows whole (one segment) instead of stitching."""

    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil:
        return shortfall == 0
