# The allocator core: one per device. See _allocator.pyx for the algorithm.
from libc.stdint cimport uint64_t, int64_t, uintptr_t
from libcpp.vector cimport vector
from libcpp.map cimport map as cmap
from libcpp.unordered_map cimport unordered_map
from libcpp.unordered_set cimport unordered_set
from libcpp.pair cimport pair
from gmlake.core._driver cimport Driver
from cython.operator cimport dereference as deref, predecrement as dec

cdef extern from "<mutex>" namespace "std" nogil:
    cppclass std_mutex "std::mutex":
        pass

cdef extern from "_structs.h" namespace "gmlake" nogil:
    cdef enum BlockState:
        BLOCK_FREE
        BLOCK_ALLOCATED
        BLOCK_CLAIMED
        BLOCK_UNMAPPED
    cdef enum SizeClass:
        SIZE_SMALL
        SIZE_LARGE
    cppclass Segment
    cppclass SBlock
    cppclass PrivatePool
    cppclass FreeKey
    cppclass Block:
        uintptr_t addr
        size_t size
        size_t requested
        int64_t stream
        uint64_t free_seq
        int state
        Segment* seg
        Block* prev
        Block* next
        SBlock* sblock
    cppclass Segment:
        uint64_t serial
        uintptr_t va
        size_t size
        size_t chunk_size
        int size_class
        int64_t stream
        PrivatePool* owner
        bint under_cap
        cmap[FreeKey, Block*]* free_index
        vector[uint64_t] handles
        vector[int] sblock_maps
        size_t mapped_chunks
        cmap[size_t, vector[uint64_t]] slots
        Block* first
    cppclass Piece:
        uintptr_t addr
        size_t size
    cppclass ChunkRef:
        Segment* seg
        size_t index
        size_t offset
        size_t size
    cppclass SBlock:
        uint64_t serial
        uintptr_t va
        size_t va_size
        size_t offset
        size_t capacity
        uint64_t last_use
        int64_t stream
        vector[Piece] pieces
        vector[ChunkRef] chunks
        Block* alloc
        vector[Block*] claimed
    cppclass PendingFree:
        Block* block
        vector[uint64_t] events
        vector[int64_t] streams
    cppclass OrphanChunk:
        uint64_t handle
        size_t size
    cppclass OrphanRange:
        uintptr_t va
        size_t size
        size_t mapped
        size_t handles
        bint release_va
    cdef enum TraceAction:
        TRACE_ALLOC
        TRACE_FREE_REQUESTED
        TRACE_FREE_COMPLETED
        TRACE_SEGMENT_ALLOC
        TRACE_SEGMENT_FREE
        TRACE_SEGMENT_MAP
        TRACE_SEGMENT_UNMAP
        TRACE_OOM
    cppclass TraceEntry:
        int action
        uintptr_t addr
        size_t size
        int64_t stream
        int64_t time_us
    cppclass FreeKey:
        int64_t stream
        size_t size
        uint64_t serial
        uintptr_t offset
    cppclass SBlockKey:
        size_t capacity
        uint64_t serial
    cppclass SBlockCache:
        cmap[uint64_t, SBlock*] all
        cmap[SBlockKey, SBlock*] by_fit
        cmap[uint64_t, SBlock*] by_age
        uint64_t tick
        void add(SBlock* sb)
        void cache(SBlock* sb)
        void uncache(SBlock* sb)
        void forget(SBlock* sb)
        size_t cached()
        SBlock* oldest()
    cppclass PrivatePool:
        uint64_t id
        int64_t use_count
        bint active
        bint capturing
        bint all_streams
        vector[int64_t] streams
        size_t segments
        size_t reserved
        cmap[FreeKey, Block*] free_small
        cmap[FreeKey, Block*] free_large

ctypedef cmap[FreeKey, Block*] FreeIndex
ctypedef pair[FreeKey, Block*] FreeEntry

# Note [Reusing nodes on the hot path] (_structs.h): spare Blocks and container nodes, under the lock.
cdef extern from "_structs.h" namespace "gmlake" nogil:
    cppclass FreeIndexStash "gmlake::NodeStash<std::map<gmlake::FreeKey, gmlake::Block*>>":
        void put(FreeIndex& index, const FreeKey& key, Block* block)
        bint take(FreeIndex& index, const FreeKey& key)
        size_t held()
    cppclass AddrStash "gmlake::NodeStash<std::map<uintptr_t, gmlake::Block*>>":
        void put(cmap[uintptr_t, Block*]& by_addr, const uintptr_t& addr, Block* block)
        bint take(cmap[uintptr_t, Block*]& by_addr, const uintptr_t& addr)
        size_t held()
    cppclass LiveStash "gmlake::NodeStash<std::unordered_map<uintptr_t, gmlake::Block*>>":
        void put(unordered_map[uintptr_t, Block*]& live, const uintptr_t& addr, Block* block)
        void take_at(unordered_map[uintptr_t, Block*]& live, unordered_map[uintptr_t, Block*].iterator it)
        size_t held()
    cppclass BlockStash:
        Block* make()
        void drop(Block* block)
        size_t held()

# The rooms' state (_structs.h): each room's in one field of the Allocator, written only by the room's own functions
# (its .pxi); other rooms call those, and may read. docs/design.md's table says which room owns which.
cdef extern from "_structs.h" namespace "gmlake" nogil:
    cppclass Fence:
        uint64_t event
        uint64_t seq
    cppclass FreeRoom:                          # room "blocks", _blocks.pxi
        FreeIndex small
        FreeIndex large
        FreeIndex holes_small
        FreeIndex holes_large
        cmap[uintptr_t, Block*] by_addr
        uint64_t seq
        FreeIndexStash index_nodes
        AddrStash addr_nodes
        BlockStash spare_blocks
    cppclass SegmentRoom:                       # room "segments", _segments.pxi
        cmap[uint64_t, Segment*] by_serial
        uint64_t next_serial
    cppclass StreamRoom:                        # room "streams", _streams.pxi
        cmap[int64_t, Fence] fences
        unordered_map[uintptr_t, vector[int64_t]] uses
        vector[PendingFree] pending
        cmap[int64_t, size_t] pending_per_stream
        vector[uint64_t] spare_events
    cppclass PoolRoom:                          # room "pools", _pools.pxi
        cmap[uint64_t, PrivatePool*] by_id
        vector[PrivatePool*] active
        size_t capturing
        vector[PendingFree] deferred_frees
    cppclass OrphanRoom:                        # room "vmm", _vmm.pxi
        vector[OrphanChunk] chunks
        vector[OrphanRange] ranges
        vector[uint64_t] events
        size_t count()
    # The allocator's lock, released when the function that declared it returns (Note [Waiting for the lock without
    # the GIL]). Declared without except+: lock() only throws on misuse, and it is called from noexcept nogil code.
    cppclass ScopedLock:
        ScopedLock()
        void acquire(std_mutex& mutex)

# Driver calls, counted by kind.
cdef enum Call:
    CALL_CREATE = 0
    CALL_RELEASE
    CALL_RESERVE
    CALL_FREE_VA
    CALL_MAP
    CALL_UNMAP
    CALL_SET_ACCESS
    CALL_SYNC
    CALL_EVENT_RECORD
    CALL_EVENT_QUERY
    CALL_EVENT_DESTROY
    CALL_EVENT_WAIT
    CALL_COPY_OUT       # device to host (re-backing's copy of live slots)
    CALL_COPY_IN        # host to device
    NUM_CALLS

cdef enum Err:
    ERR_NONE = 0
    ERR_OOM
    ERR_DRIVER
    ERR_INVALID_FREE
    ERR_POLICY          # a Python policy hook raised; the exception waits in the calling thread's hook_errors
    ERR_CAPTURE         # what the call needed (a synchronize or an event) is forbidden while a graph is captured
    ERR_NO_POOL         # malloc_in_pool_nogil: the pool named is not active
    ERR_RAW_CAPTURE     # the request's stream is under a graph capture the allocator was not told of

# Whether the request in progress was checked for a capture nobody announced (Note [Unannounced capture]).
cdef enum CaptureCheck:
    CAPTURE_UNCHECKED = 0
    CAPTURE_CLEAR
    CAPTURE_FOUND

# The request in progress (malloc), on the caller's stack beside its Failure, which points at it: what the rooms need
# to know of the request while serving it. Nothing of a request is kept in the allocator between calls.
cdef struct Request:
    int64_t stream      # the request's stream
    PrivatePool* target # the private pool serving it (NULL: the default pool)
    int capture_check   # whether its stream was checked for a capture nobody announced (a CaptureCheck)

# Why one call failed: each call that can fail keeps its own on its stack and passes it down to every function on
# its path (Note [A call's failure]); the caller gets a copy, so an error travels with the call that raised it. The
# byte counts are the moment of failure.
cdef struct Failure:
    int err
    int code            # the driver's return code (ERR_DRIVER)
    int call            # which driver call (a Call) returned it
    bint hook_failed    # a policy seam raised or answered badly during this call: the request fails (ERR_POLICY)
    Request* request    # the request this call serves (malloc), NULL in other calls; never copied out (_report)
    size_t reserved
    size_t allocated
    size_t limit

# What the process's other users of the device (the CUDA libraries) took outside the allocator, as growth saw it
# when it asked the device what is free (Note [Leaving the libraries room], _vmm.pxi). Written only by _ask_device.
cdef struct LibrariesRoom:
    size_t within_reach     # the device's free bytes plus the allocator's reserved, at the last ask (0: none yet)
    size_t measured         # the reserve the libraries' rises call for now (device_reserve is its floor)
    size_t largest_rise     # the largest rise ever seen
    uint64_t asks           # times the device was asked
    uint64_t rises          # asks that saw a rise
    uint64_t quiet_asks     # asks since `measured` was last set or halved

cdef struct Stats:
    size_t allocated
    size_t peak_allocated
    size_t requested
    size_t peak_requested
    size_t reserved
    size_t peak_reserved
    size_t active
    size_t peak_active
    size_t sblock_va
    size_t peak_sblock_va
    uint64_t live_blocks
    uint64_t allocs
    uint64_t frees
    uint64_t stitches
    uint64_t stitched_handles
    uint64_t sblock_reuses
    uint64_t sblock_evictions
    uint64_t segments_created
    uint64_t chunks_released
    uint64_t ooms
    uint64_t stream_migrations
    uint64_t stream_waits         # blocks of another stream taken after a wait on the GPU (cross_stream_wait)
    uint64_t capture_queries          # cuStreamIsCapturing asked (Note [Unannounced capture]); not in `calls`
    uint64_t rebacked_chunks          # chunks re-backed in slots (Note [Taking slots back at the edge])
    uint64_t copied_bytes             # bytes the re-backing copied out and in again (each counted once)
    uint64_t tails_cut_at_reuse       # free pages cut into slots as a reused block took them (Note [Fine pages at reuse])
    uint64_t calls[<int>NUM_CALLS]
    uint64_t handles[<int>NUM_CALLS]

# The policy's knobs, copied into C so the hot path reads no Python. How memory grows is not a knob here: the
# policy's growth (a Growth, below) decides it, chosen once when the allocator is made.
cdef struct Knobs:
    # Policy's knobs, by their names there (gmlake/policies/knobs.py declares each, once; tests/test_knobs_declared.py
    # holds these fields to those declarations, names and types)
    size_t round_to
    size_t small_size
    size_t small_segment_size
    size_t chunk_size
    bint stitch
    size_t min_stitch_size
    size_t min_saved_chunks
    size_t max_cached_sblocks
    size_t sblock_search_depth
    bint sblock_first
    size_t restitch_limit         # 0: no limit (Note [Stitching a size again])
    size_t restitch_share         # percent of reserved: restitch_limit spares a request this large (0: none)
    size_t restitch_room          # percent of reserved: less room under the limit lifts restitch_limit (0: never)
    size_t large_split_min
    size_t max_split_size
    size_t max_non_split_rounding
    bint cross_stream
    bint cross_stream_wait       # with cross_stream only: Note [Waiting for another stream's free block]
    bint cap_counts_request
    size_t large_segment_size
    size_t min_large_alloc
    size_t round_large
    size_t expandable_page_small
    size_t expandable_page_large
    size_t capped_page_large      # expandable_page_large where 0: Note [Finer pages under a cap]
    size_t edge_page              # 0: no stitching rule of its own at the edge (Note [Stitching at the edge])
    size_t expandable_reserve     # 9/8 of the device's memory where 0
    size_t tail_page              # 0: whole pages at a block's tail (Note [Fine pages at a block's tail])
    size_t cut_at_reuse           # percent; 0: reuse never cuts a page (Note [Fine pages at reuse])
    bint plan                     # RunPlanner decides which tails growth cuts (Note [A plan learned from the run])
    size_t plan_tail_share        # percent of a page a cut tail may need (Note [A plan learned from the run])
    size_t plan_settle            # miss-path requests in a row of known sizes that settle the plan
    size_t reback_slot            # 0: never re-back (Note [Taking slots back at the edge])
    size_t slot                   # the unit of a page mapped in parts: reback_slot, else tail_page
    size_t device_reserve         # 0: growth may take the device's last byte (Note [Leaving the libraries room])
    size_t libraries_half_life    # 0: device_reserve alone, nothing measured
    # What the growth says of itself (Growth.fit_counts_unmapped)
    bint fit_counts_unmapped
    # Which seams the policy overrides in Python (read once, at construction): the core calls Python only there.
    bint hook_allow_stitch
    bint hook_split
    bint hook_evict
    bint hook_place
    bint hook_stitch
    bint hook_layout
    bint hook_pressure

# Why cached sBlocks are being evicted: the policy's evict_victim is asked for the bound and pressure, not for
# empty_cache (which evicts all).
cdef enum EvictReason:
    EVICT_ALL = 0
    EVICT_BOUND
    EVICT_PRESSURE

# What relieves memory pressure (Policy.relieve_pressure answers with one, by name: PRESSURE_ACTIONS).
cdef enum PressureAction:
    PRESSURE_GIVE_UP = 0
    PRESSURE_SYNC
    PRESSURE_RELEASE_OTHER
    PRESSURE_RELEASE_ALL
    PRESSURE_REBACK

# At most this many pressure actions per request, so a policy cannot loop a request forever.
cdef enum:
    MAX_PRESSURE_ATTEMPTS = 4

# Which seams a Seams subclass decides in Cython (its `overridden` bits).
cdef enum SeamBit:
    SEAM_PLACE = 1
    SEAM_SPLIT = 2
    SEAM_STITCH = 4
    SEAM_ALLOW_STITCH = 8
    SEAM_LAYOUT = 16
    SEAM_EVICT = 32
    SEAM_PRESSURE = 64


cimport cython


cdef class Seams
cdef class Growth
cdef class Planner


@cython.final
cdef class Allocator:
    cdef readonly Driver driver
    cdef readonly object policy
    cdef readonly Seams seams                            # how an overridden seam is decided (Python or Cython)
    cdef readonly Growth growth                          # how new memory is laid out (chosen once, from the policy)
    cdef readonly Planner planner                        # what the run has shown decides (_planner.pxi)
    cdef Knobs k
    cdef std_mutex mutex
    cdef size_t limit_bytes                              # the cap on memory held; NO_LIMIT: none, 0: nothing fits
    cdef bint reserve_open                               # relief ran out: growth may take the device reserve
    cdef LibrariesRoom libraries                         # what the libraries took outside it (_vmm.pxi)
    cdef bint at_edge                                    # relief is retrying a request (Note [Stitching at the edge])
    cdef bint edge_pages                                 # a stitch's shortfall maps edge_page pages now
    cdef size_t most_reserved                            # the most ever reserved (reset_peak_stats keeps it)
    cdef uint64_t most_reserved_at                       # st.allocs when it was reached (Note [Fine pages at reuse])
    cdef size_t max_request
    cdef Stats st
    cdef object hook_errors                              # threading.local: the exception a hook raised, per thread
    cdef bint checking                                   # debug_checks: every invariant after every operation
    cdef uint64_t checks_run
    cdef object invariant_error                          # what a debug check found, for the next Python call
    cdef unordered_map[uintptr_t, Block*] live           # user pointer -> allocated block
    cdef LiveStash live_nodes                            # Note [Reusing nodes on the hot path]
    cdef bint tracing                                    # recording history (record_memory_history)
    cdef size_t trace_max
    cdef size_t trace_next                               # ring buffer position once full
    cdef vector[TraceEntry] trace
    # The rooms' state, one field each, written only by the room's own functions (_structs.h, docs/design.md).
    cdef FreeRoom frees                                  # free index, holes, blocks by address (_blocks.pxi)
    cdef SegmentRoom segments                            # segments (_segments.pxi)
    cdef SBlockCache sblock_cache                        # every sBlock; the cached ones by fit and by age (_sblocks.pxi)
    cdef StreamRoom streams                              # fences, record_stream's uses and pending frees (_streams.pxi)
    cdef PoolRoom pools                                  # private pools and graph capture (_pools.pxi)
    cdef OrphanRoom orphans                              # what the driver refused to take back (_vmm.pxi)

    cdef uintptr_t malloc_nogil(self, size_t size, int64_t stream, Failure* why) noexcept nogil
    cdef uintptr_t malloc_in_pool_nogil(self, size_t size, int64_t stream, uint64_t pool_id,
                                        Failure* why) noexcept nogil
    cdef int free_nogil(self, uintptr_t ptr) noexcept nogil
    cdef int empty_cache_nogil(self, Failure* why) noexcept nogil
    cdef void set_limit_nogil(self, size_t limit) noexcept nogil
    cdef object failure(self, size_t size, Failure* why, int64_t request=*)
    cdef void _report(self, Failure* why, Failure* out) noexcept nogil
    cdef void _debug_check(self) noexcept nogil
    cdef int record_stream_nogil(self, uintptr_t ptr, int64_t stream) noexcept nogil
    cdef size_t block_size_nogil(self, uintptr_t ptr) noexcept nogil
    cdef size_t device_room_nogil(self, size_t free) noexcept nogil

    # internals, in the order _allocator.pyx defines them
    cdef void _record(self, int action, uintptr_t addr, size_t size, int64_t stream) noexcept nogil


cdef class Growth:
    """How new memory is laid out when no free block fits: the one place the allocator's growth is decided, chosen
    once when the allocator is made (Policy.segment_rule names a built-in: ChunkGrowth, PyTorchGrowth,
    ExpandableGrowth; Policy.cython_growth() may supply a subclass of one, compiled against this .pxd). No other
    room asks which growth it is: they call these methods (on a miss only: one indirect call) or read the two
    properties, copied into the allocator's knobs at construction. Each method is called with the allocator's lock
    held, over its own structures: read them, change them only through the methods given here."""
    cdef readonly bint stitches                 # may a stitch's shortfall be new memory of this growth (else none)
    cdef readonly bint fit_counts_unmapped      # best fit counts the unmapped room after a free block (expandable)

    # New memory for a whole request of `size` bytes of size class `size_class`, taken (allocated to `stream`);
    # NULL with why.err set where it cannot be had.
    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil
    # Whether the request may not have new memory now (why.err is then ERR_OOM, so memory pressure is relieved).
    cdef bint refuses(self, Allocator a, Failure* why, int size_class, size_t size) noexcept nogil
    # What a shortfall costs: whether a stitch of free pieces that still needs `shortfall` new bytes saves enough
    # over growing the whole `size`-byte request (Policy.min_saved_chunks).
    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil
    # New memory for a stitch's shortfall, as its last piece; `undo` is what to give back if the stitch then fails
    # (NULL: nothing). False: none (why.err set), or with no error: grow the whole request instead.
    cdef bint new_piece(self, Allocator a, Failure* why, size_t shortfall, int64_t stream, Piece* piece,
                        Segment** undo) noexcept nogil
    # The layout of a new segment of a private pool (graph capture), whose segments never grow in place.
    cdef void private_layout(self, Allocator a, int size_class, size_t size, size_t* segment_size,
                             size_t* handle_size) noexcept nogil
    # The built-in pressure stage of `attempt` (0, 1, ...): the PressureAction a request that found no memory takes
    # next, offered to Policy.relieve_pressure as its default.
    cdef int pressure_stage(self, Allocator a, int attempt) noexcept nogil
    # For subclasses: a new mapped segment laid out as asked (the policy's segment_layout may change it), and the
    # head of a free, unindexed block taken for a request.
    cdef Segment* new_segment(self, Allocator a, Failure* why, int size_class, size_t size, size_t segment_size,
                              size_t handle_size, int64_t stream) noexcept nogil
    cdef Block* take(self, Allocator a, Failure* why, Block* b, size_t size, int64_t stream) noexcept nogil
    # The largest request whose new memory fits in `room` bytes as this growth lays it out, where a cap below the
    # device's memory binds or not (Note [The largest block served now]). Python-visible too, for reports and hints:
    # page(policy, binds), the large page a request maps, and oom_pages(policy), what the out-of-memory hint names.
    cdef size_t whole_pages(self, Allocator a, size_t room, bint binds) noexcept nogil


cdef class ChunkGrowth(Growth):
    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil
    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil
    cdef bint new_piece(self, Allocator a, Failure* why, size_t shortfall, int64_t stream, Piece* piece,
                        Segment** undo) noexcept nogil
    cdef void private_layout(self, Allocator a, int size_class, size_t size, size_t* segment_size,
                             size_t* handle_size) noexcept nogil
    cdef size_t whole_pages(self, Allocator a, size_t room, bint binds) noexcept nogil


cdef class PyTorchGrowth(Growth):
    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil


cdef class ExpandableGrowth(Growth):
    cdef Block* grow(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream) noexcept nogil
    cdef bint refuses(self, Allocator a, Failure* why, int size_class, size_t size) noexcept nogil
    cdef bint stitch_saves(self, Allocator a, size_t size, size_t shortfall, int64_t stream) noexcept nogil
    cdef bint new_piece(self, Allocator a, Failure* why, size_t shortfall, int64_t stream, Piece* piece,
                        Segment** undo) noexcept nogil
    cdef size_t whole_pages(self, Allocator a, size_t room, bint binds) noexcept nogil


cdef class Planner:
    """What the run shows decides where growth maps fine pages (_planner.pxi, Note [A plan learned from the run]):
    chosen once when the allocator is made (Policy.cython_planner(), else the `plan` knob), asked only on a large
    request's miss path and when reserved memory reaches a new high, with the allocator's lock held. This base plans
    nothing. A subclass compiled against this .pxd overrides the three methods, nogil; it reads the allocator's
    structures and never changes them."""
    cdef public size_t request                  # the large request on the miss path now (0: none yet)
    # A large request of `size` bytes reached the miss path (it stitches or grows).
    cdef void on_miss(self, Allocator a, size_t size) noexcept nogil
    # Whether growth maps the last `page`-byte page it partly covers, needing `need` bytes of it, in tail_page slots
    # for `request` (only asked where the knobs let it cut: Note [Fine pages at a block's tail]).
    cdef bint fine_tail(self, Allocator a, size_t need, size_t page) noexcept nogil
    # Growth took reserved memory to a new high.
    cdef void on_new_high(self, Allocator a) noexcept nogil


cdef class RunPlanner(Planner):
    cdef unordered_set[size_t] seen             # request sizes (tail_page buckets) seen on the miss path
    cdef readonly size_t largest                # the largest request seen there
    cdef readonly uint64_t hits, misses, replans, settles, highs_settled
    cdef readonly bint settled
    cdef uint64_t quiet, misses_settled, calls_at_settle, calls_settled


cdef class Seams:
    """How the core asks a seam that the policy overrides (see docs/policies.md). This base asks the policy's Python
    hook, with the GIL. A subclass compiled against this .pxd overrides any of these methods in Cython, nogil, and
    sets the matching SeamBit in `overridden` (in its __cinit__): the core then calls it there, through the vtable,
    without the GIL. Each method is called with the allocator's lock held; it receives the built-in answer and may
    change it. Its arguments are the allocator's own structures: read them, never change them; `why` is the
    request's Failure, which the base marks (hook_failed) when a Python hook raises or answers badly."""
    cdef public int overridden

    cdef void place(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream, Block** b,
                    SBlock** sb) noexcept nogil
    cdef bint split(self, Allocator a, Failure* why, Block* b, size_t size, bint default) noexcept nogil
    cdef void stitch(self, Allocator a, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                     vector[Piece]& pieces, size_t* remaining) noexcept nogil
    cdef bint allow_stitch(self, Allocator a, Failure* why, size_t size, int64_t stream, vector[Piece]& pieces,
                           size_t remaining) noexcept nogil
    cdef void layout(self, Allocator a, Failure* why, int size_class, size_t size, int64_t stream, size_t* segment_size,
                     size_t* handle_size) noexcept nogil
    cdef SBlock* evict(self, Allocator a, Failure* why, SBlock* lru_victim, int reason) noexcept nogil
    cdef int pressure(self, Allocator a, Failure* why, size_t size, int64_t stream, int size_class, int attempt,
                      int default) noexcept nogil


# ---------------------------------------------------------------- the exported API for research seams
# What a Seams or Growth subclass in another module may use to read the allocator's free blocks: keys and lookups,
# inlined into its own module from here, so that it copies nothing of the core's internals and keeps working when
# they move. Call them only from a seam (the allocator's lock is held there); never change what they return.

# Note [No limit]: a limit is a number of bytes, and 0 is a limit like any other (nothing fits under it, as under
# PyTorch's set_per_process_memory_fraction(0)); no limit at all is NO_LIMIT (the largest size_t) in the core, None
# in Python. So every comparison with a limit reads the same, and none asks whether a limit is set first.
cdef extern from "_structs.h" namespace "gmlake" nogil:
    const size_t NO_LIMIT

cdef enum:
    ANY_STREAM = -1             # the stream of a free block whose stream's work is done: usable by any stream


cdef inline FreeKey free_key(int64_t stream, size_t size) noexcept nogil:
    """The first key of a free index at (stream, size): where a search for `stream`'s blocks of `size` bytes or
    more begins (free indexes are ordered by stream, size, segment serial, offset)."""
    cdef FreeKey key
    key.stream = stream
    key.size = size
    key.serial = 0
    key.offset = 0
    return key


cdef inline FreeIndex* free_index(Allocator a, int size_class) noexcept nogil:
    """The default pool's free index of a size class (SIZE_SMALL or SIZE_LARGE)."""
    return &a.frees.small if size_class == SIZE_SMALL else &a.frees.large


cdef inline Block* smallest_free(FreeIndex* index, int64_t stream, size_t size) noexcept nogil:
    """The best fit: the smallest free block of `stream` (ANY_STREAM: of no stream) of at least `size` bytes (of
    those as small, the first in segment and address order), or NULL."""
    cdef FreeIndex.iterator it = index.lower_bound(free_key(stream, size))
    if it == index.end() or deref(it).first.stream != stream:
        return NULL
    return deref(it).second


cdef inline Block* largest_free(FreeIndex* index, int64_t stream, size_t size) noexcept nogil:
    """The largest free block of `stream` (ANY_STREAM: of no stream) of at least `size` bytes (of those as large,
    the first in segment and address order), or NULL."""
    cdef FreeIndex.iterator it = index.lower_bound(free_key(stream + 1, 0))
    if it == index.begin():
        return NULL
    dec(it)
    if deref(it).first.stream != stream or deref(it).first.size < size:
        return NULL
    return deref(index.lower_bound(free_key(stream, deref(it).first.size))).second
