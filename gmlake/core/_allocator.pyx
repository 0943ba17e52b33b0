# cython: language_level=3, annotation_typing=False
"""The gmlake allocator core: GMLake's virtual memory stitching, over any Driver.

Vocabulary: gmlake/core/_structs.h (chunk, segment, block, sBlock, size class, pool, growth). The rooms, what each owns
and the path of one allocation: docs/design.md.

A request is served by the first step that succeeds (the policy's knobs and growth choose among the variants):
  1. best fit among free pBlocks of the request's stream (or of no stream), and cached sBlocks whose pieces are
     free (only where no free block fits, unless `sblock_first`);
  2. split the block found (requests are packed at `round_to` bytes);
  3. stitch free pBlocks whose chunks together cover the request, plus new memory for the shortfall, where the
     growth says that saves enough over growing (`min_saved_chunks`);
  4. grow, as the growth lays new memory out: an expandable range by chunks (the default), a segment of whole
     chunks, or PyTorch's native segment sizes (Growth, _growth.pxi);
  5. under memory pressure: wait for all streams, give back memory the other size class holds, then everything free,
     then (the default policy) the free slots of partly used chunks (_rebacking.pxi);
  6. fail with an out-of-memory error.

Rooms, one file each, included below as module-level functions over the Allocator's state (nogil, but for the Python
hooks and the Python API's bodies):
  _common.pxi    rounding, peaks, a call's Failure, sort keys   _vmm.pxi       driver calls, counted, orphans retried
  _requests.pxi  a request's path, the steps above; a free's
  _blocks.pxi    free index, holes, split and merge             _segments.pxi  segments and their chunks; pressure
  _growth*.pxi   the Growth interface, its strategies           _rebacking.pxi partly used chunks re-backed at the edge
  _sblocks.pxi   stitch-or-grow, the stitch, the sBlock cache   _streams.pxi   fences, deferred frees, events
  _pools.pxi     private pools (CUDA graphs) and capture rules  _debug.pxi     every invariant, checked
  _seams.pxi     a seam's answer checked; the Cython Seams      _hooks.pxi     the policy's Python hooks, and views
  _api_steps.pxi the Python API's locked steps: what its methods copy or change under the lock
Each room owns its state in one field of the Allocator (`frees`, `segments`, `sblock_cache`, `streams`, `pools`,
`orphans`: _structs.h), written only by its own functions. This file keeps the lock (a ScopedLock, acquired once per
entry point and released when the entry point returns), the entry points malloc/free/empty_cache, the live map, the
history ring and the Python API. The bodies of its longer methods are rooms too: _api_report.pxi (statistics,
history, segments, failures) and _api_pools.pxi (private pools), over the locked steps of _api_steps.pxi.

Every decision orders blocks by (stream, size, segment serial, offset), never by address, so the sim, host and cuda
drivers make the same choices for the same requests: a replayed trace predicts the GPU run.
"""
from libc.stdint cimport uint64_t, int64_t, uintptr_t
from libc.string cimport memset
from libc.stdio cimport fprintf, stderr
from libc.stdlib cimport abort

cdef extern from *:
    """
    #ifndef GMLAKE_DEBUG
    #define GMLAKE_DEBUG 0
    #endif
    """
    # Set at build time (GMLAKE_DEBUG=1 python setup.py build_ext): every allocator checks its invariants after
    # every operation and aborts on the first one broken.
    bint GMLAKE_DEBUG
    # Cython's own branch hint (__builtin_expect): the pool checks on the cache-hit path are cold.
    bint unlikely(bint) noexcept nogil
from libcpp.vector cimport vector
from libcpp.pair cimport pair
from libcpp.utility cimport move
from libcpp.algorithm cimport sort
from cython.operator cimport dereference as deref, preincrement as inc, predecrement as dec
from gmlake.core._driver cimport Driver, DRIVER_OK, DRIVER_OOM, EVENT_DONE, EVENT_PENDING

from gmlake.core.errors import (OutOfMemoryError, DriverError, InvalidPointerError, PolicyError, GraphCaptureError,
                           CaptureOutOfMemoryError, InvariantError)
from typing import Iterable
import threading
from gmlake.core.view import PRESSURE_ACTIONS, AllocatorState, CachedSBlock, FreeBlock, FreeBlocks

from gmlake.core._clock cimport timespec, clock_gettime, CLOCK_REALTIME

SIZE_CLASS_NAMES = ("small", "large")
EVICT_REASONS = ("all", "bound", "pressure")

CALL_NAMES = ("create_chunk", "release_chunk", "reserve", "free_va", "map", "unmap", "set_access", "synchronize",
              "event_record", "event_query", "event_destroy", "event_wait", "copy_out", "copy_in")


# The rooms of the core: module-level functions over the Allocator's state (see _allocator.pxd).
include "_common.pxi"
include "_requests.pxi"
include "_vmm.pxi"
include "_blocks.pxi"
include "_segments.pxi"
include "_rebacking.pxi"
include "_growth.pxi"
include "_growth_chunks.pxi"
include "_growth_pytorch.pxi"
include "_growth_expandable.pxi"
include "_sblocks.pxi"
include "_planner.pxi"
include "_streams.pxi"
include "_pools.pxi"
include "_hooks.pxi"
include "_seams.pxi"
include "_debug.pxi"
include "_api_steps.pxi"
include "_api_report.pxi"
include "_api_pools.pxi"


# The policy an Allocator made without one gets. gmlake.policies sets it when imported (set_default_policy): the
# core imports no policy, so the arrow runs from policies to the core and never back.
_default_policy = None


def set_default_policy(factory) -> None:
    """Make `factory()` the policy of an Allocator made without one (gmlake.policies sets GMLakePolicy)."""
    global _default_policy
    _default_policy = factory


cdef class Allocator:
    """Allocator(driver, policy=None, *, limit=None)
--

    A stitching allocator for one device.

    Args:
        driver: where physical memory and address space come from (SimDriver, HostDriver, CudaDriver).
        policy: the placement policy (a gmlake.policies.Policy); defaults to `gmlake.policies.GMLakePolicy()`.
        limit: a hard cap on physical memory held, in bytes (None: none besides the device's own).
    """

    def __init__(self, Driver driver not None, policy=None, *, limit: int | None = None):
        if policy is None:
            if _default_policy is None:
                raise TypeError("Allocator(driver, policy): no policy given, and gmlake.policies (which supplies the "
                                "default) is not imported")
            policy = _default_policy()
        if not callable(getattr(policy, "core_knobs", None)):
            raise TypeError(f"policy must be a gmlake.policies.Policy, got {type(policy).__name__}")
        gran = driver.granularity
        if gran == 0:
            raise ValueError(f"{driver.name} reports granularity 0; is it initialised?")
        policy.validate(gran)
        self.driver = driver
        self.policy = policy
        # Every knob the core reads, as the policy derives it (Policy.core_knobs: each rule lives there), copied by
        # name into its C struct. How memory grows is chosen here, once; the rooms read only what the growth says.
        self.growth = _growth_of(policy)
        self.planner = _planner_of(policy)
        knobs = dict(policy.core_knobs(driver.capacity))
        knobs["fit_counts_unmapped"] = self.growth.fit_counts_unmapped
        self.seams = _seams_of(policy, knobs)
        self.k = knobs
        self.hook_errors = threading.local()
        # The largest request worth trying: the device's memory, or 4 TiB (the largest device a replay models, as
        # trace.MAX_DEVICE_MEMORY) where the driver models no bound, so no request loops over millions of chunks.
        self.max_request = driver.capacity if driver.capacity else (<size_t>1 << 42)
        self.set_limit(limit)
        self.checking = GMLAKE_DEBUG

    def __dealloc__(self):
        # Bookkeeping only: driver resources are returned by close(); an allocator dropped with live memory leaks
        # it on purpose rather than unmapping memory that tensors may still use.
        # The one place outside the rooms that reaches into their state: each holds Blocks, sBlocks, segments and
        # pools by pointer, deleted here; the room structs' own destructors then free their containers.
        cdef pair[uint64_t, Segment*] sp
        cdef pair[uint64_t, SBlock*] bp
        cdef Block* b
        cdef Block* nxt
        cdef pair[uintptr_t, Block*] lp
        cdef size_t i
        for lp in self.live:
            if lp.second.seg == NULL:
                del lp.second
        cdef pair[uint64_t, PrivatePool*] pp
        for i in range(self.streams.pending.size()):
            if self.streams.pending[i].block.seg == NULL:
                del self.streams.pending[i].block
        for i in range(self.pools.deferred_frees.size()):
            if self.pools.deferred_frees[i].block.seg == NULL:
                del self.pools.deferred_frees[i].block
        for pp in self.pools.by_id:
            del pp.second
        for bp in self.sblock_cache.all:
            del bp.second
        for sp in self.segments.by_serial:
            b = sp.second.first
            while b != NULL:
                nxt = b.next
                del b
                b = nxt
            del sp.second

    # ------------------------------------------------------------------ driver calls, counted

    cdef void _record(self, int action, uintptr_t addr, size_t size, int64_t stream) noexcept nogil:
        """Append to the history (a ring of trace_max entries) while tracing."""
        cdef TraceEntry e
        cdef timespec ts
        if not self.tracing:
            return
        clock_gettime(CLOCK_REALTIME, &ts)
        e.action = action
        e.addr = addr
        e.size = size
        e.stream = stream
        e.time_us = ts.tv_sec * 1000000 + ts.tv_nsec // 1000
        if self.trace.size() < self.trace_max:
            self.trace.push_back(e)
        else:
            self.trace[self.trace_next] = e
            self.trace_next = (self.trace_next + 1) % self.trace_max

    # ------------------------------------------------------------------ malloc: a request's steps (_requests.pxi)

    cdef uintptr_t malloc_nogil(self, size_t size, int64_t stream, Failure* out) noexcept nogil:
        """Allocate `size` bytes for `stream`. Returns 0 on failure and, if `out` is given, says why there."""
        cdef ScopedLock held
        cdef Request request
        request.stream = stream
        request.target = NULL
        request.capture_check = CAPTURE_UNCHECKED
        cdef int mode = 2                   # CU_STREAM_CAPTURE_MODE_RELAXED
        cdef uintptr_t ptr
        cdef bint relaxed
        held.acquire(self.mutex)
        if not unlikely(_any_pool_active(self)):
            return _serve(self, &request, size, out)
        # A pool may capture on another thread: growth runs in relaxed mode (Note [A cut under another thread's
        # capture]), whether or not the caller (the torch bridge, before this lock) saw the pool begin.
        request.target = _pool_for(self, stream)
        relaxed = self.driver.exchange_capture_mode(&mode) == DRIVER_OK
        ptr = _serve(self, &request, size, out)
        if relaxed:
            self.driver.exchange_capture_mode(&mode)
        return ptr

    cdef uintptr_t malloc_in_pool_nogil(self, size_t size, int64_t stream, uint64_t pool_id,
                                        Failure* out) noexcept nogil:
        """Allocate from active private pool `pool_id` whatever the stream (0: the default pool), for a caller that
        routes requests itself, as the torch bridge does with PyTorch's stream filters."""
        cdef ScopedLock held
        cdef Failure why
        cdef Request request
        request.stream = stream
        request.target = NULL
        request.capture_check = CAPTURE_UNCHECKED
        held.acquire(self.mutex)
        if pool_id != 0:
            request.target = _active_pool(self, pool_id)
            if request.target == NULL:
                no_failure(&why)
                why.err = ERR_NO_POOL
                self._report(&why, out)
                return 0
        return _serve(self, &request, size, out)

    cdef void _report(self, Failure* why, Failure* out) noexcept nogil:
        """Hand a call's failure to its caller (`out`, if given), with the byte counts at this moment. Under the
        lock, at the end of the call."""
        if out == NULL:
            return
        why.reserved = self.st.reserved
        why.allocated = self.st.allocated
        why.limit = self.limit_bytes
        out[0] = why[0]
        out.request = NULL                  # the request lives on this call's stack, not the caller's

    # ------------------------------------------------------------------ free

    cdef int free_nogil(self, uintptr_t ptr) noexcept nogil:
        """Free an allocation; ERR_INVALID_FREE (state untouched) if ptr is not live. If other streams used it
        (record_stream), its memory returns only once events recorded on them now have completed."""
        cdef ScopedLock held
        cdef Failure why                    # a driver error while freeing leaves an orphan to retry, not a failure
        no_failure(&why)
        held.acquire(self.mutex)
        cdef int rc = _free_live(self, &why, ptr)
        self._debug_check()
        return rc

    cdef void _debug_check(self) noexcept nogil:
        """Every invariant, checked after the operation with debug_checks on (Note [Invariant checks inside the
        allocator], _debug.pxi)."""
        if self.checking:
            _verify_after_operation(self)

    def _raise_invariant_error(self) -> None:
        exc = self.invariant_error
        if exc is not None:
            self.invariant_error = None
            raise exc

    @property
    def debug_checks(self) -> bool:
        """Whether every operation ends by checking every invariant (see Note [Invariant checks inside the
        allocator]); slow, for tests and debugging. A GMLAKE_DEBUG build starts with it on."""
        return self.checking

    @debug_checks.setter
    def debug_checks(self, on: bool) -> None:
        self.checking = bool(on)

    @property
    def debug_checks_run(self) -> int:
        """How many operations ended with a full invariant check."""
        return self.checks_run

    @property
    def spares(self) -> dict:
        """How many spare Blocks and container nodes the hot path holds for its next requests (Note [Reusing nodes
        on the hot path]): at most 64 of each, freed with the allocator; and how many events it keeps to record
        again (Note [Reusing events]): at most 1,024, destroyed by empty_cache."""
        return _api_spares(self)

    cdef size_t block_size_nogil(self, uintptr_t ptr) noexcept nogil:
        """Bytes held by the live allocation at ptr; 0 if ptr is not one."""
        cdef ScopedLock held
        held.acquire(self.mutex)
        it = self.live.find(ptr)
        return deref(it).second.size if it != self.live.end() else 0

    cdef size_t device_room_nogil(self, size_t free) noexcept nogil:
        """Of `free` bytes the device has, those growth may take now: less the reserve kept for the libraries
        (Note [Leaving the libraries room]). Under the caller's lock."""
        cdef size_t kept = _reserve_kept(self)
        return free - kept if free > kept else 0

    cdef int record_stream_nogil(self, uintptr_t ptr, int64_t stream) noexcept nogil:
        """Note that `stream` uses the live allocation at ptr: its free will wait for that stream's work."""
        cdef ScopedLock held
        held.acquire(self.mutex)
        return _note_stream_use(self, ptr, stream)

    cdef int empty_cache_nogil(self, Failure* out) noexcept nogil:
        """Return every cached sBlock range and every fully free chunk to the driver."""
        cdef ScopedLock held
        cdef Failure failure
        cdef Failure* why = &failure
        no_failure(why)
        held.acquire(self.mutex)
        if _capturing(self):
            why.err = ERR_CAPTURE          # it synchronizes: Note [Pools and graph capture]
        else:
            # Wait for all streams, so every free block serves any stream and merges with its free neighbours.
            _reclaim_streams(self, why, ANY_STREAM, True)
            _destroy_spare_events(self, why)
            _retry_orphans(self, why)
            if why.err == ERR_NONE:
                _release_free(self, why, SIZE_SMALL, 0, EVICT_ALL)
                _release_free(self, why, SIZE_LARGE, 0, EVICT_ALL)
            self._debug_check()
        self._report(why, out)
        return why.err

    cdef void set_limit_nogil(self, size_t limit) noexcept nogil:
        """Cap the physical memory held at `limit` bytes, under the lock: NO_LIMIT for none, and 0 refuses every
        request, as PyTorch's allocator does under set_per_process_memory_fraction(0) (Note [No limit])."""
        cdef ScopedLock held
        held.acquire(self.mutex)
        self.limit_bytes = limit

    # ------------------------------------------------------------------ Python API

    def set_limit(self, limit: int | None) -> None:
        """Cap the physical memory this allocator may hold, in bytes (None: no cap; 0: nothing fits)."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
                                  or limit >= NO_LIMIT):
            raise ValueError(f"gmlake: limit must be None or an int >= 0, got {limit!r}")
        cdef size_t n = NO_LIMIT if limit is None else limit
        with nogil:
            self.set_limit_nogil(n)

    @property
    def capturing(self) -> int:
        """How many active private pools are under graph capture (Note [Pools and graph capture])."""
        return self.pools.capturing

    @property
    def limit(self) -> int | None:
        """The cap on physical memory held, in bytes (None: none)."""
        return None if self.limit_bytes == NO_LIMIT else self.limit_bytes

    def malloc(self, size: int, stream: int = 0, *, pool: int | None = None) -> int:
        """Allocate `size` bytes for use on `stream`; returns the address. `pool` (an active private pool's id, or
        0 for the default pool) overrides the routing of begin_allocate_to_pool's streams.

        Raises ValueError for a size <= 0 or a pool that is not active, and OutOfMemoryError when the memory cannot
        be found.
        """
        if not isinstance(size, int) or isinstance(size, bool):
            raise TypeError(f"size must be an int, got {type(size).__name__}")
        if size <= 0:
            raise ValueError(f"gmlake: cannot allocate {size} bytes: size must be positive")
        if size >= (1 << 62):
            raise ValueError(f"gmlake: cannot allocate {size} bytes: larger than any device")
        if stream < 0:
            raise ValueError(f"gmlake: stream must be >= 0, got {stream}")
        cdef size_t n = size
        cdef int64_t s = stream
        cdef uintptr_t ptr
        cdef Failure why
        cdef uint64_t pid
        if pool is None:
            with nogil:
                ptr = self.malloc_nogil(n, s, &why)
        else:
            pid = 0 if pool == 0 else self._pool_id(pool)
            with nogil:
                ptr = self.malloc_in_pool_nogil(n, s, pid, &why)
            if ptr == 0 and why.err == ERR_NO_POOL:
                raise ValueError(f"gmlake: malloc: private pool {pool} is not active")
        self._raise_invariant_error()
        if ptr == 0:
            raise self.failure(n, &why)
        return ptr

    def free(self, ptr: int) -> None:
        """Free an address malloc returned. Raises InvalidPointerError (state unchanged) for any other address."""
        if not isinstance(ptr, int) or ptr <= 0 or ptr >= (1 << 64):
            raise InvalidPointerError(f"gmlake: cannot free {ptr!r}: not an address this allocator returned")
        cdef uintptr_t p = ptr
        cdef int rc
        with nogil:
            rc = self.free_nogil(p)
        self._raise_invariant_error()
        if rc == ERR_INVALID_FREE:
            raise InvalidPointerError(
                f"gmlake: cannot free 0x{ptr:x}: not a live allocation (double free, or never returned by malloc)")

    def record_history(self, enabled: bool = True, max_entries: int = 10_000_000) -> None:
        """Start (or stop) recording allocator events, keeping the last `max_entries`."""
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        cdef size_t kept = max_entries
        cdef bint on = bool(enabled)
        with nogil:
            _set_tracing(self, on, kept)

    def history(self) -> list:
        """The recorded events, oldest first, as PyTorch snapshot trace entries (dicts)."""
        return _api_history(self)

    def record_stream(self, ptr: int, stream: int) -> None:
        """Note that `stream` uses the allocation at ptr, so its free waits for the work queued there (as
        Tensor.record_stream does)."""
        cdef uintptr_t p = ptr
        cdef int64_t s = stream
        cdef int rc
        with nogil:
            rc = self.record_stream_nogil(p, s)
        if rc == ERR_INVALID_FREE:
            raise InvalidPointerError(f"gmlake: record_stream on 0x{ptr:x}, which is not a live allocation")

    def empty_cache(self) -> None:
        """Return every fully free chunk and every cached sBlock to the driver."""
        cdef int rc
        cdef Failure why
        with nogil:
            rc = self.empty_cache_nogil(&why)
        self._raise_invariant_error()
        if rc == ERR_DRIVER or rc == ERR_CAPTURE:
            raise self.failure(0, &why)

    def _malloc_holding_gil(self, size: int, stream: int = 0) -> int:
        """malloc as torch's allocator calls it from a Python thread: the GIL stays held. For tests of Note [Waiting
        for the lock without the GIL]."""
        cdef Failure why
        cdef uintptr_t ptr = self.malloc_nogil(size, stream, &why)
        if ptr == 0:
            raise self.failure(size, &why)
        return ptr

    def block_size(self, ptr: int) -> int:
        """Bytes held by the live allocation at ptr (its request rounded up)."""
        cdef uintptr_t p = ptr
        cdef size_t n
        with nogil:
            n = self.block_size_nogil(p)
        if n == 0:
            raise InvalidPointerError(f"gmlake: 0x{ptr:x} is not a live allocation")
        return n

    def reset_peak_stats(self) -> None:
        """Reset every peak to the current value."""
        with nogil:
            _reset_peaks(self)

    def stats(self) -> dict:
        """Byte counts with their peaks, event counts, and driver calls (and handles touched) by kind."""
        return _api_stats(self)

    cdef object failure(self, size_t size, Failure* why, int64_t request=-1):
        """The exception for a call that failed as `why` says: PolicyError (with the hook's exception, from this
        thread; `request`: the request's index, where the caller numbers them), DriverError naming the driver call,
        or OutOfMemoryError with the figures at the failure."""
        return _api_failure(self, size, why, request)

    def close(self) -> None:
        """Release everything back to the driver. Raises if allocations are still live."""
        if self.live.size():
            raise RuntimeError(f"gmlake: cannot close: {self.live.size()} allocations are still live")
        self.empty_cache()
        if self.pools.by_id.size():
            raise RuntimeError(f"gmlake: cannot close: private pools {sorted(self.pools_ids())} still hold memory "
                               f"(release_pool each, ending any still active)")
        if self.segments.by_serial.size():
            raise RuntimeError(f"gmlake: {self.segments.by_serial.size()} segments could not be released")
        orphans = self.stats()["orphans"]
        if orphans:
            raise RuntimeError(f"gmlake: the driver refused to take back {orphans} chunks, ranges or events")

    def check(self) -> None:
        """Verify every internal invariant and statistic against the structures; raises InvariantError (an
        AssertionError that `python -O` does not strip) naming the first one broken. For tests; the checks are
        gmlake/core/_debug.pxi's."""
        _check_invariants(self)

    # ------------------------------------------------------------------ private pools (Note [Private pools])

    def begin_allocate_to_pool(self, pool_id: int, streams: Iterable[int] | None = None, *,
                               capturing: bool = False) -> None:
        """Serve the requests of `streams` (None: every stream; empty: only malloc(..., pool=pool_id)) from private
        pool `pool_id` until end_allocate_to_pool, as PyTorch's beginAllocateToPool does for a CUDA graph. The first begin creates the
        pool; a later begin of a pool still in use shares it (one more use to release). With `capturing`, the
        streams are under graph capture: until the pool ends, the allocator calls no event or synchronize function
        (Note [Pools and graph capture]). Raises ValueError for a pool already active or released but still
        holding memory."""
        _api_begin_pool(self, pool_id, streams, capturing)

    def retain_pool(self, pool_id: int) -> None:
        """One more use of active private pool `pool_id`, as a second beginAllocateToPool of a pool already routing
        requests is in PyTorch (cudagraph trees capture into the pool their warm-up allocates from): each use is
        released by its own release_pool. The torch bridge routes nested begins through this."""
        _api_retain_pool(self, pool_id)

    def end_allocate_to_pool(self, pool_id: int) -> None:
        """Stop routing requests to private pool `pool_id` (PyTorch's endAllocateToPool); the pool keeps its memory
        and its use. Ending the last capturing pool lets the frees deferred during capture record their events."""
        _api_end_pool(self, pool_id)

    def release_pool(self, pool_id: int) -> int:
        """Drop one use of private pool `pool_id` (PyTorch's releasePool). The last use returns the pool's wholly
        free segments to the driver now (after a synchronize), unless a capture is running; blocks still allocated
        stay valid, and their segments return at the next empty_cache or memory pressure once wholly free.
        Returns the bytes returned now."""
        return _api_release_pool(self, pool_id)

    def pools_info(self) -> list:
        """One dict per private pool: id, use_count, active, capturing, streams (None: every stream), segments,
        reserved_bytes, allocated_bytes (its blocks in use)."""
        return _api_pools_info(self)

    def pools_ids(self) -> list:
        """The ids of the private pools that exist (in use, or released but still holding memory); copied under the
        lock, as every reading call copies."""
        cdef vector[uint64_t] ids
        with nogil:
            _copy_pool_ids(self, ids)
        return list(ids)

    @staticmethod
    def _pool_id(pool_id) -> int:
        if not isinstance(pool_id, int) or isinstance(pool_id, bool) or not 0 < pool_id < (1 << 64):
            raise ValueError(f"gmlake: a private pool id is an int >= 1 (0 is the default pool), got {pool_id!r}")
        return pool_id

    def segments_info(self) -> list:
        """One dict per segment: serial, pool, size, chunk size, mapped chunks, private pool id (0: the default
        pool), and its blocks' states.

        The walk is copied into plain rows under the lock, without the GIL, and turned into Python objects after the
        lock is let go, as every Python method does: Python code run under the lock could free memory of this
        allocator (a finalizer run by the garbage collector), whose lock is not reentrant."""
        return _api_segments_info(self)

    def share_units(self, ptr: int) -> tuple:
        """(offset, size, units) of the live allocation at `ptr`, for sharing it with another process: the (handle,
        bytes) of each unit under it in the order a range maps them, the allocation `offset` bytes into them."""
        return _api_share_units(self, ptr)
