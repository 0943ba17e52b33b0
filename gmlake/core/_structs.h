// Plain data of the allocator core: records, orderings, the spares the hot path reuses (NodeStash, BlockStash), each
// room's state (FreeRoom, SegmentRoom, SBlockCache, StreamRoom, PoolRoom, OrphanRoom) and the lock's guard
// (ScopedLock). All allocator logic lives in _allocator.pyx and its rooms; docs/design.md maps them.
//
// Vocabulary (one name per concept):
//   chunk       one physical allocation from the driver (cuMemCreate), mapped only whole; the driver's name for it is
//               its handle (Segment::handles); the expandable growth's knobs call its chunks pages, as PyTorch does
//   segment     a VA reservation over chunks mapped back to back, tiled by primitive blocks (pBlocks)
//   block       a byte range: free, allocated, claimed (in use through an sBlock) or unmapped (a hole)
//   sBlock      a stitched block: a new VA range mapping the chunks of several free pBlocks back to back
//   size class  small (requests up to small_size, in small segments, never stitched) or large: SizeClass
//   pool        a private pool (a CUDA graph's: PrivatePool); every other memory is the default pool's
//   growth      how new memory is laid out when no free block fits (Growth, _allocator.pxd)
#pragma once
#include <Python.h>     // ScopedLock lets the GIL go while it waits (PyGILState_Check, PyEval_SaveThread)
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gmlake {

// No limit on the memory held (Note [No limit], _allocator.pxd): 0 is a limit like any other.
constexpr size_t NO_LIMIT = SIZE_MAX;

struct Segment;
struct SBlock;
struct PrivatePool;

enum BlockState : int { BLOCK_FREE = 0, BLOCK_ALLOCATED = 1, BLOCK_CLAIMED = 2, BLOCK_UNMAPPED = 3 };
enum SizeClass : int { SIZE_SMALL = 0, SIZE_LARGE = 1 };   // requests up to small_size, and the rest

// A block is a byte range. Primitive blocks tile their segment's VA (addr is the home address); a stitched
// allocation is a block with seg == nullptr whose addr points into its sBlock's VA.
struct Block {
    uintptr_t addr = 0;
    size_t size = 0;
    size_t requested = 0;     // bytes the caller asked for (allocated blocks)
    int64_t stream = 0;
    uint64_t free_seq = 0;    // when it was last freed: cross-stream fences cover frees up to a sequence number
    int state = BLOCK_FREE;
    Segment* seg = nullptr;
    Block* prev = nullptr;    // address neighbours inside the segment
    Block* next = nullptr;
    SBlock* sblock = nullptr; // stitched allocation: its sBlock; claimed primitive block: the sBlock claiming it
};

// Best-fit order of free primitive blocks: stream, then size, then a driver-independent address order.
struct FreeKey {
    int64_t stream;
    size_t size;
    uint64_t serial;
    uintptr_t offset;
    bool operator<(const FreeKey& o) const {
        if (stream != o.stream) return stream < o.stream;
        if (size != o.size) return size < o.size;
        if (serial != o.serial) return serial < o.serial;
        return offset < o.offset;
    }
};

// A VA reservation over chunks (physical handles) of chunk_size bytes each, mapped in order.
struct Segment {
    uint64_t serial = 0;      // creation order: orders free blocks the same way on every driver
    uintptr_t va = 0;
    size_t size = 0;
    size_t chunk_size = 0;
    int size_class = SIZE_LARGE;
    int64_t stream = 0;       // the stream it was made for: its holes are that stream's (an expandable range grows
                              // only for its stream)
    PrivatePool* owner = nullptr;    // the private pool it belongs to (graph capture), or nullptr: the default pool
    bool under_cap = false;   // made while a cap below the device's memory was set (Note [Finer pages under a cap])
    std::map<FreeKey, Block*>* free_index = nullptr;   // where its free blocks are indexed: its pool's, by kind
    std::vector<uint64_t> handles;   // 0: chunk released (an unmapped hole)
    std::vector<int> sblock_maps;    // how many sBlocks map each chunk: it can be released only at zero
    size_t mapped_chunks = 0;        // chunks with memory mapped: a whole handle, or any of a re-backed chunk's slots
    // Re-backed chunks (Note [Taking slots back at the edge], _rebacking.pxi): chunk index -> one handle per slot of
    // reback_slot bytes (0: that slot unmapped); such a chunk's entry in `handles` is 0. Empty in every run that
    // never reached its limit.
    std::map<size_t, std::vector<uint64_t>> slots;
    Block* first = nullptr;
};

// A piece of physical memory an sBlock covers: a byte range at a primitive (home) address.
struct Piece {
    uintptr_t addr;
    size_t size;
};

// A unit an sBlock maps: a whole chunk, or one slot of a chunk mapped in slots.
struct ChunkRef {
    Segment* seg;
    size_t index;     // the chunk that holds it (its sblock_maps count)
    size_t offset;    // where the unit starts in seg
    size_t size;      // its bytes
};

// A stitched block: a VA range that maps the chunks of several primitive ranges back to back.
struct SBlock {
    uint64_t serial = 0;
    uintptr_t va = 0;
    size_t va_size = 0;
    size_t offset = 0;             // where the first piece starts inside the first chunk
    size_t capacity = 0;           // sum of the pieces
    uint64_t last_use = 0;         // LRU tick while cached
    int64_t stream = 0;            // the stream of its last allocation (what an eviction policy sees)
    std::vector<Piece> pieces;
    std::vector<ChunkRef> chunks;
    Block* alloc = nullptr;        // the live allocation through it, or nullptr while cached
    std::vector<Block*> claimed;   // primitive blocks its live allocation holds
};

// A free waiting for work queued on other streams (Tensor.record_stream) to finish.
struct PendingFree {
    Block* block;
    std::vector<uint64_t> events;    // still incomplete, one per stream that used the block
    std::vector<int64_t> streams;    // the stream each event was recorded on
};

// What the driver refused to take back, kept to retry (so a failed release or unmap never leaks).
struct OrphanChunk {
    uint64_t handle;
    size_t size;
};
struct OrphanRange {
    uintptr_t va;
    size_t size;
    size_t mapped;       // bytes still mapped at va (unmap them first)
    size_t handles;
    bool release_va;     // false for a stretch of a segment's reservation, which the segment frees
};

// One allocator event, in the vocabulary of PyTorch's memory snapshots.
enum TraceAction : int {
    TRACE_ALLOC = 0, TRACE_FREE_REQUESTED, TRACE_FREE_COMPLETED, TRACE_SEGMENT_ALLOC, TRACE_SEGMENT_FREE,
    TRACE_SEGMENT_MAP, TRACE_SEGMENT_UNMAP, TRACE_OOM
};
struct TraceEntry {
    int action;
    uintptr_t addr;
    size_t size;
    int64_t stream;
    int64_t time_us;
};

struct PrivatePool;

// A private memory pool, as PyTorch's CUDA graphs use one: its segments serve only the streams routed to it while
// it is active, and its free blocks are indexed here, apart from the default pool's (see _pools.pxi).
struct PrivatePool {
    uint64_t id = 0;
    int64_t use_count = 1;        // begins minus releases (PyTorch's use_count): its memory returns only at zero
    bool active = false;          // between begin_allocate_to_pool and end_allocate_to_pool
    bool capturing = false;       // active for streams under graph capture: no event or synchronize calls
    bool all_streams = false;     // active for every stream, not only `streams`
    std::vector<int64_t> streams;
    size_t segments = 0;          // segments it owns
    size_t reserved = 0;          // their mapped bytes
    std::map<FreeKey, Block*> free_small;
    std::map<FreeKey, Block*> free_large;
};

// A cross-stream fence: an event recorded on a stream, covering the frees made on it up to `seq`.
struct Fence {
    uint64_t event;
    uint64_t seq;
};

// Best-fit order of cached sBlocks: capacity, then age.
struct SBlockKey {
    size_t capacity;
    uint64_t serial;
    bool operator<(const SBlockKey& o) const {
        if (capacity != o.capacity) return capacity < o.capacity;
        return serial < o.serial;
    }
};

// The sBlock cache (room "sblocks", _sblocks.pxi): every sBlock by serial, and the cached ones (mapped, their
// allocation freed) by best fit and by age. Its methods change the three together; other rooms only read them.
struct SBlockCache {
    std::map<uint64_t, SBlock*> all;         // serial -> sBlock, cached or in use
    std::map<SBlockKey, SBlock*> by_fit;     // cached sBlocks, best fit by capacity
    std::map<uint64_t, SBlock*> by_age;      // last use -> cached sBlock, the least recently used first
    uint64_t tick = 0;                       // the clock of last uses
    static SBlockKey key_of(const SBlock* sb) { return SBlockKey{sb->capacity, sb->serial}; }
    // A new sBlock, in use.
    void add(SBlock* sb) { all[sb->serial] = sb; }
    // Its allocation was freed: cached, the most recently used.
    void cache(SBlock* sb) {
        sb->last_use = ++tick;
        by_fit[key_of(sb)] = sb;
        by_age[sb->last_use] = sb;
    }
    // In use again.
    void uncache(SBlock* sb) {
        by_fit.erase(key_of(sb));
        by_age.erase(sb->last_use);
    }
    // Evicted (it was cached): forgotten; the caller frees it.
    void forget(SBlock* sb) {
        uncache(sb);
        all.erase(sb->serial);
    }
    size_t cached() const { return by_age.size(); }
    SBlock* oldest() const { return by_age.begin()->second; }
};

// Note [Reusing nodes on the hot path]: a cache hit that splits a free block and merges it back on free would
// otherwise allocate and free a Block, and a node of each container it enters (free index, address map, live map),
// every time: about a third of a split + merge's instructions (callgrind of `python -m bench micro`'s cache-hit cases on
// the sim driver). Each allocator keeps up to 64 spares of each for its next
// requests, used only under its lock. A node moves between maps of one type (the default pool's free index and a
// private pool's), which C++17 node handles allow; spares are freed with the allocator.
template <class Map>
struct NodeStash {
    static constexpr size_t kept = 64;
    std::vector<typename Map::node_type> spare;
    NodeStash() { spare.reserve(kept); }
    // map[key] = value, in a spare node where there is one.
    void put(Map& map, const typename Map::key_type& key, typename Map::mapped_type value) {
        if (spare.empty()) {
            auto placed = map.emplace(key, value);
            if (!placed.second) placed.first->second = value;
            return;
        }
        typename Map::node_type node = std::move(spare.back());
        spare.pop_back();
        node.key() = key;
        node.mapped() = value;
        auto placed = map.insert(std::move(node));
        if (!placed.inserted) {
            placed.position->second = value;
            spare.push_back(std::move(placed.node));
        }
    }
    // map.erase(key), keeping the node.
    bool take(Map& map, const typename Map::key_type& key) {
        typename Map::node_type node = map.extract(key);
        if (node.empty()) return false;
        if (spare.size() < kept) spare.push_back(std::move(node));
        return true;
    }
    // map.erase(it), keeping the node.
    void take_at(Map& map, typename Map::iterator it) {
        typename Map::node_type node = map.extract(it);
        if (spare.size() < kept) spare.push_back(std::move(node));
    }
    size_t held() const { return spare.size(); }
};

// new Block() and delete, with spares.
struct BlockStash {
    static constexpr size_t kept = 64;
    std::vector<Block*> spare;
    BlockStash() { spare.reserve(kept); }
    ~BlockStash() { for (Block* b : spare) delete b; }
    Block* make() {
        if (spare.empty()) return new Block();
        Block* b = spare.back();
        spare.pop_back();
        *b = Block();
        return b;
    }
    void drop(Block* b) {
        if (spare.size() < kept) spare.push_back(b);
        else delete b;
    }
    size_t held() const { return spare.size(); }
};

// ---------------------------------------------------------------- the rooms' state
// Each room of the core (docs/design.md) keeps its state in one of these, held by the Allocator as one field. The
// functions of the room's own .pxi are its only writers; other rooms call them, and may read. Plain data: the
// logic is in the rooms, which inline into the one compilation unit of _allocator.pyx.

// Room "blocks" (_blocks.pxi), Allocator.frees: the free index, the unmapped holes, every pBlock by address.
struct FreeRoom {
    std::map<FreeKey, Block*> small;             // the default pool's free blocks, by size class
    std::map<FreeKey, Block*> large;
    std::map<FreeKey, Block*> holes_small;       // unmapped holes, by (stream, segment, offset)
    std::map<FreeKey, Block*> holes_large;
    std::map<uintptr_t, Block*> by_addr;         // home address -> primitive block, all states
    uint64_t seq = 0;                            // the free clock: Block::free_seq of the latest free
    NodeStash<std::map<FreeKey, Block*>> index_nodes;    // Note [Reusing nodes on the hot path]
    NodeStash<std::map<uintptr_t, Block*>> addr_nodes;
    BlockStash spare_blocks;
};

// Room "segments" (_segments.pxi), Allocator.segments: every segment, and the serials of segments and sBlocks.
struct SegmentRoom {
    std::map<uint64_t, Segment*> by_serial;
    uint64_t next_serial = 1;                    // segments and sBlocks share one creation order
};

// Room "streams" (_streams.pxi), Allocator.streams: stream ordering.
struct StreamRoom {
    std::map<int64_t, Fence> fences;                               // stream -> pending cross-stream fence
    std::unordered_map<uintptr_t, std::vector<int64_t>> uses;      // live pointer -> other streams that used it
    std::vector<PendingFree> pending;            // frees waiting for those streams' events, in free order
    std::map<int64_t, size_t> pending_per_stream;    // stream -> pending events recorded on it
    std::vector<uint64_t> spare_events;          // events to record again (Note [Reusing events])
};

// Room "pools" (_pools.pxi), Allocator.pools: private pools, by id, and the active ones in the order they began (the
// one serving a request is its Request's target). While `capturing` > 0 the core calls no event or synchronize
// function (Note [Pools and graph capture]); frees that would need one wait in deferred_frees.
struct PoolRoom {
    std::map<uint64_t, PrivatePool*> by_id;
    std::vector<PrivatePool*> active;
    size_t capturing = 0;                        // active pools under capture; other rooms ask _capturing()
    std::vector<PendingFree> deferred_frees;
};

// Room "vmm" (_vmm.pxi), Allocator.orphans: what the driver refused to take back, to retry.
struct OrphanRoom {
    std::vector<OrphanChunk> chunks;
    std::vector<OrphanRange> ranges;
    std::vector<uint64_t> events;
    size_t count() const { return chunks.size() + ranges.size() + events.size(); }
};

// The allocator's lock, held from acquire() to the end of the C function that declared it (Cython declares C++
// locals at the top of the function, so the destructor runs at its exit, on every return path): one acquire per
// entry point, no release written by hand.
//
// Note [Waiting for the lock without the GIL]: policy hooks run under this lock and take the GIL. A thread that holds
// the GIL and calls in (torch allocates from Python with the GIL held) must not wait for the lock while holding it,
// or a hook in the lock's holder waits for the GIL forever: such a thread lets the GIL go while it waits. Only the
// contended path pays for the check.
struct ScopedLock {
    std::mutex* held = nullptr;
    ScopedLock() = default;
    ScopedLock(const ScopedLock&) = delete;
    ScopedLock& operator=(const ScopedLock&) = delete;
    ~ScopedLock() {
        if (held) held->unlock();
    }
    void acquire(std::mutex& mutex) {
        if (!mutex.try_lock()) {
            if (PyGILState_Check()) {
                PyThreadState* saved = PyEval_SaveThread();
                mutex.lock();
                PyEval_RestoreThread(saved);
            } else {
                mutex.lock();
            }
        }
        held = &mutex;
    }
};

}  // namespace gmlake
