# cython: language_level=3, annotation_typing=False
"""The allocator behind torch.cuda.memory.CUDAPluggableAllocator: C entry points over one Allocator per device.

Compiled with CYTHON_EXTERN_C defined as extern "C", so the `cdef public` functions below keep their plain names
(gmlake_alloc, gmlake_free, ...) for ctypes and torch. Their paths are nogil; only the first call on a device, which
creates its allocator, and the graph pool hooks (rare, and their errors become Python text) take the GIL.
"""
from libc.stdint cimport uint64_t, int64_t, uintptr_t, INT64_MAX
from libc.stdio cimport snprintf
from libcpp.atomic cimport atomic
from libcpp.utility cimport pair
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, predecrement as dec
from gmlake.core._allocator cimport (Allocator, Failure, ERR_OOM, ERR_CAPTURE, ERR_NONE, ScopedLock, std_mutex,
                                     FreeIndex, SIZE_SMALL, SIZE_LARGE, NO_LIMIT, free_index, free_key)
from gmlake.core._driver cimport DRIVER_OK

cdef extern from "_bridge.h" namespace "gmlake" nogil:
    void throw_error(const char* message)
    ctypedef void (*OomThrower)(const char* message)
    void throw_oom(OomThrower thrower, const char* message)
    cppclass StreamFilter:
        pass
    bint filter_accepts(const StreamFilter& filter, void* stream)


cdef enum:
    MAX_DEVICES = 64

# Borrowed pointers; `_owners` keeps the Allocator objects alive.
cdef void* _allocators[MAX_DEVICES]
import threading
import sys
import traceback
import warnings
from gmlake.core.errors import format_torch_size

_owners: dict = {}
_factory = None
_create_lock = threading.Lock()    # the first allocations on a device may come from several threads at once


def configure(factory) -> None:
    """Set the callable that makes the Allocator for a device: factory(device) -> Allocator."""
    global _factory
    _factory = factory


def allocator(int device):
    """The Allocator serving `device`, creating it if needed."""
    if device < 0 or device >= MAX_DEVICES:
        raise ValueError(f"gmlake: device {device} out of range")
    if _allocators[device] == NULL:
        with _create_lock:
            if _allocators[device] == NULL:
                if _factory is None:
                    raise RuntimeError("gmlake: the torch bridge is not configured; call gmlake.torch.enable() first")
                a = _factory(device)
                if not isinstance(a, Allocator):
                    raise TypeError("gmlake: the allocator factory must return a gmlake.Allocator")
                _owners[device] = a
                _allocators[device] = <void*>a
    return <Allocator>_allocators[device]


def allocators() -> dict:
    """{device: Allocator} for every device used so far."""
    return dict(_owners)


# Note [The bridge's errors travel with the call]: a message the bridge throws is written under the GIL and thrown
# after it is released, so it lives in the calling entry point's own stack buffer (ErrorText), never in a shared one
# that another thread's failure could overwrite in between, as the core's Failure does (Note [A call's failure]).
cdef enum:
    ERROR_TEXT = 512

cdef struct ErrorText:
    char text[ERROR_TEXT]


cdef void* _get(int device, ErrorText* error) noexcept nogil:
    """The allocator of `device`, created on its first use; NULL with the reason in `error` where it cannot be."""
    if device < 0 or device >= MAX_DEVICES:
        snprintf(error.text, ERROR_TEXT, "gmlake: device %d out of range", device)
        return NULL
    if _allocators[device] != NULL:
        return _allocators[device]
    with gil:
        try:
            allocator(device)
        except BaseException as exc:
            msg = f"gmlake: cannot create the allocator for device {device}: {exc}".encode()[:500]
            snprintf(error.text, ERROR_TEXT, "%s", <const char*>msg)
            return NULL
    return _allocators[device]


# ---------------------------------------------------------------- out of memory, as PyTorch's allocator reports it
#
# An allocation that finds no memory ends as torch's own allocator's does: the out-of-memory observers are called
# (device, bytes asked, the cap or else the device's capacity, the device's free bytes), then c10::OutOfMemoryError is
# thrown, which torch raises as torch.OutOfMemoryError (Note [Torch's out-of-memory type] in gmlake/torch/_torch_oom.py);
# memory_stats()["num_ooms"] reads the allocator's count. Policy and driver failures stay RuntimeErrors naming their
# cause.

cdef OomThrower _oom_thrower = NULL
_oom_observers: list = []

cdef enum:
    OOM_TEXT = 2048


def set_oom_thrower(address: int) -> None:
    """Make the bridge throw out-of-memory errors through the function at `address`, a void(const char*) that
    throws c10::OutOfMemoryError and never returns (0: throw std::runtime_error with the same text)."""
    global _oom_thrower
    _oom_thrower = <OomThrower><uintptr_t>address


def oom_thrower() -> int:
    """The address set_oom_thrower installed (0: none)."""
    return <uintptr_t>_oom_thrower


def attach_out_of_memory_observer(observer) -> None:
    """Call observer(device, requested bytes, the cap or else the device's capacity, the device's free bytes) when an
    allocation through the bridge runs out of memory, before the error is raised; what
    torch._C._cuda_attach_out_of_memory_observer does for PyTorch's allocator."""
    if not callable(observer):
        raise TypeError(f"gmlake: an out-of-memory observer must be callable, got {type(observer).__name__}")
    _oom_observers.append(observer)


cdef str _observe_oom(int device, size_t size, size_t allowed, size_t free_bytes):
    """Call the observers; a note for the error's text naming those that raised (each one's traceback goes to
    stderr: the out-of-memory error is what the allocation raises, as the caller expects)."""
    failed = []
    for observer in list(_oom_observers):
        try:
            observer(device, size, allowed, free_bytes)
        except BaseException as exc:   # noqa: BLE001 - reported below, and the out-of-memory error still raised
            print(f"gmlake: an out-of-memory observer ({observer!r}) raised:", file=sys.stderr)
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            failed.append(f"{type(exc).__name__}: {exc}")
    return f" (An out-of-memory observer raised {'; '.join(failed)}.)" if failed else ""


cdef void _fail(Allocator a, size_t size, int device, Failure* why) noexcept nogil:
    """Raise torch's error for a failed allocation: torch.OutOfMemoryError (after the observers) for an
    out-of-memory, else a RuntimeError with the policy's / driver's error (gmlake.core.errors writes every text; an
    allocation that fails is rare enough to take the GIL)."""
    cdef char message[OOM_TEXT]
    cdef bint oom = why.err == ERR_OOM or why.err == ERR_CAPTURE
    cdef size_t free_bytes = 0
    cdef bint known_free = oom and a.driver.device_free(&free_bytes) == 0 and a.driver.capacity != 0
    with gil:
        error = a.failure(size, why)
        if oom:
            note = _observe_oom(device, size, why.limit if why.limit != NO_LIMIT else a.driver.capacity,
                                free_bytes if known_free else 0)
            page, capped_page, tail_page = a.growth.oom_pages(a.policy)      # what the growth says of its pages
            text = error.torch_message(device, a.capturing != 0 or why.err == ERR_CAPTURE,
                                       device_free=free_bytes if known_free else None,
                                       stitches=a.stats()["stitches"], page=page, capped_page=capped_page,
                                       tail_page=tail_page) + note
        else:
            text = f"gmlake: allocating {size} bytes on device {device} failed: {error}"
        encoded = text.encode()[:OOM_TEXT - 48].decode(errors="ignore").encode()    # whole characters only
        snprintf(message, sizeof(message), "%s", <const char*>encoded)
    if oom:
        throw_oom(_oom_thrower, message)
    throw_error(message)


cdef public void* gmlake_alloc(size_t size, int device, void* stream) noexcept nogil:
    cdef ErrorText error
    cdef void* handle = _get(device, &error)
    cdef Failure why
    cdef uintptr_t ptr
    if handle == NULL:
        throw_error(error.text)
    if size == 0:
        size = 1    # torch may ask for 0 bytes; hand out a distinct, valid pointer
    if _routed_count.load() == 0:
        ptr = (<Allocator>handle).malloc_nogil(size, <int64_t><uintptr_t>stream, &why)
    else:
        ptr = _alloc_routed(<Allocator>handle, size, device, stream, &why)
    if ptr == 0:
        _fail(<Allocator>handle, size, device, &why)
    return <void*>ptr


# Note [Frees after the interpreter]: PyTorch frees some blocks after Python has finished: a block another process
# still held when the sender exits sits in torch's CudaIPCSentDataLimbo, whose static destructor frees it, and
# module teardown frees tensors after gmlake's own module state may be gone. The process's exit returns all device
# memory anyway, so once Python's exit hooks run (install() registers serve_no_more_frees first, so it runs last) a
# free does nothing. The shim keeps the allocator object alive past C++'s static destructors for the same reason
# (gmlake/torch/_torch_allocator_shim.cc).
cdef bint _exiting = False


def serve_no_more_frees() -> None:
    """From here on a free does nothing (Note [Frees after the interpreter]): the process is exiting."""
    global _exiting
    _exiting = True


cdef public void gmlake_free(void* ptr, size_t size, int device, void* stream) noexcept nogil:
    cdef void* handle = _allocators[device] if 0 <= device < MAX_DEVICES else NULL
    if handle != NULL and not _exiting:
        (<Allocator>handle).free_nogil(<uintptr_t>ptr)


cdef public void gmlake_init(int device_count) noexcept nogil:
    pass    # allocators are created on a device's first allocation


cdef public void gmlake_reset() noexcept nogil:
    cdef int d
    for d in range(MAX_DEVICES):
        if _allocators[d] != NULL:
            (<Allocator>_allocators[d]).empty_cache_nogil(NULL)


cdef public void gmlake_memory_fraction(double fraction, int device) noexcept nogil:
    """torch.cuda.set_per_process_memory_fraction: a cap of fraction x the device's memory, as PyTorch's allocator
    sets one. A fraction of 0 (or one that rounds to 0 bytes) is a cap of 0 bytes, under which every allocation
    fails with out-of-memory, as in PyTorch: not the core's limit 0, which means no cap. A NaN or a fraction outside
    [0, 1] is refused, as torch's own allocator refuses it, and the cap stays as it was."""
    cdef ErrorText error
    cdef char message[160]
    cdef void* handle
    cdef size_t capacity, limit
    if not (0.0 <= fraction <= 1.0):        # also a NaN, which compares false
        snprintf(message, sizeof(message), "gmlake: set_per_process_memory_fraction: invalid fraction %g, it "
                 "must be between 0 and 1", fraction)
        throw_error(message)
    handle = _get(device, &error)
    if handle == NULL:
        throw_error(error.text)
    capacity = (<Allocator>handle).driver.capacity
    limit = <size_t>(fraction * capacity)
    if limit == 0 and capacity == 0 and fraction != 0.0:
        limit = NO_LIMIT        # a driver that models no device size: no cap but fraction 0
    (<Allocator>handle).set_limit_nogil(limit)


cdef public void* gmlake_base_alloc(void* ptr, size_t* size) noexcept nogil:
    cdef int d
    cdef size_t n
    for d in range(MAX_DEVICES):
        if _allocators[d] != NULL:
            n = (<Allocator>_allocators[d]).block_size_nogil(<uintptr_t>ptr)
            if n:
                if size != NULL:
                    size[0] = n
                return ptr
    return ptr


cdef public void gmlake_record_stream(void* ptr, void* stream) noexcept nogil:
    cdef int d
    for d in range(MAX_DEVICES):
        if _allocators[d] != NULL and \
                (<Allocator>_allocators[d]).record_stream_nogil(<uintptr_t>ptr, <int64_t><uintptr_t>stream) == ERR_NONE:
            return


# ---------------------------------------------------------------- cacheInfo: the largest block served now
#
# Note [The largest block served now]: PyTorch sizes cuDNN's benchmark (cudnn.benchmark = True) by asking its
# allocator, through CUDACachingAllocator::cacheInfo(device, &largest), for the largest workspace it could hand out:
# cuDNN then tries only the algorithms whose workspace is below it, and skips one whose workspace request still
# raises out-of-memory. PyTorch's own allocator answers the larger of its largest cached free block (of any
# stream) and the device's free memory, what cudaMalloc could still add. gmlake answers the same question for its
# own rules, under the allocator's lock:
#   - the largest free block of the default pool, small or large, of any stream (what PyTorch counts);
#   - or what growth may still take without relieving pressure: under a cap, the cap less the memory reserved;
#     otherwise the device's free memory less the policy's device reserve (Note [Leaving the libraries room]:
#     cuDNN loads its kernels outside the allocator, into what the reserve keeps free), never more than the
#     device's free memory, and rounded down to what the growth maps (Growth.whole_pages: whole chunks, pages or
#     round_large steps), so a request of that size needs no page past it. While a graph is captured the device is not asked (the core
#     never asks it then): only the cap's room counts;
#   - and 0 under a cap of 0 bytes (set_per_process_memory_fraction(0)), which refuses every request.
# An answer too high costs an out-of-memory per algorithm tried (observers called, num_ooms counted), one too
# low only a slower algorithm, so it leaves out what a request could get only by pressure relief or stitching
# (cached sBlocks, several free blocks joined): PyTorch's answer leaves out the same kinds (its release of cached
# blocks and retry). A private pool's free blocks serve only its own requests and are left out (PyTorch counts
# them). The answer is rarely asked for (once for each new convolution shape while benchmarking), so it walks the
# free indexes: one step for each stream that holds free blocks.

cdef size_t _largest_free_block(FreeIndex* index) noexcept nogil:
    """The largest free block in `index`, of any stream: the last entry of each stream's run (ordered by stream,
    then size), reached by one lower_bound per stream."""
    cdef size_t largest = 0
    cdef int64_t stream
    cdef FreeIndex.iterator it = index.begin()
    cdef FreeIndex.iterator last
    while it != index.end():
        stream = deref(it).first.stream
        it = index.end() if stream == INT64_MAX else index.lower_bound(free_key(stream + 1, 0))
        last = it
        dec(last)
        if deref(last).first.size > largest:
            largest = deref(last).first.size
    return largest


cdef size_t _largest_served(Allocator a) noexcept nogil:
    """Note [The largest block served now], for `a`."""
    cdef ScopedLock held
    cdef size_t largest, room, free_bytes = 0
    cdef bint capped, binds
    held.acquire(a.mutex)
    largest = _largest_free_block(free_index(a, SIZE_LARGE))
    room = _largest_free_block(free_index(a, SIZE_SMALL))
    if room > largest:
        largest = room
    capped = a.limit_bytes != NO_LIMIT
    binds = capped and (a.driver.capacity == 0 or a.limit_bytes < a.driver.capacity)
    room = 0
    if capped:
        room = a.limit_bytes - a.st.reserved if a.st.reserved < a.limit_bytes else 0
    if not a.pools.capturing and a.driver.device_free(&free_bytes) == DRIVER_OK:
        if not binds:       # growth leaves the device reserve free where no cap binds
            free_bytes = a.device_room_nogil(free_bytes)
        room = free_bytes if not capped or free_bytes < room else room
    room = a.growth.whole_pages(a, room, binds)
    if room > largest:
        largest = room
    if capped and largest > a.limit_bytes:      # a request over the cap is refused even where a free block fits
        largest = a.limit_bytes - a.limit_bytes % a.k.round_to
    return largest if largest < a.max_request else a.max_request


cdef atomic[uint64_t] _cache_info_calls       # how many times cacheInfo was asked (tests and the GPU check read it)


def cache_info_calls() -> int:
    """How many times gmlake_cache_info was called in this process (cuDNN's benchmark asking cacheInfo, through the
    allocator shim)."""
    return _cache_info_calls.load()


def cache_info(int device) -> int:
    """gmlake_cache_info for `device` from Python (Note [The largest block served now]); RuntimeError where the
    device's allocator cannot be had."""
    cdef size_t largest = 0
    cdef char error[ERROR_TEXT]
    cdef int rc
    with nogil:
        rc = gmlake_cache_info(device, &largest, error, sizeof(error))
    if rc:
        raise RuntimeError((<bytes>error).decode(errors="replace"))
    return largest


cdef public int gmlake_cache_info(int device, size_t* largest, char* error, size_t error_size) noexcept nogil:
    """CUDACachingAllocator::cacheInfo for gmlake (Note [The largest block served now]): the largest block the
    allocator of `device` could serve now, in `largest`. The allocator is created if this is the device's first
    call. Returns 0, or 1 with the reason in `error` (at most `error_size` bytes, NUL included) where it cannot be
    had: the C++ shim that overrides cacheInfo (gmlake/torch/_torch_allocator_shim.cc) throws it as torch's error."""
    cdef ErrorText why
    cdef void* handle
    _cache_info_calls.fetch_add(1)
    handle = _get(device, &why)
    if handle == NULL:
        if error != NULL and error_size:
            snprintf(error, error_size, "%s", why.text)
        return 1
    largest[0] = _largest_served(<Allocator>handle)
    return 0


# ---------------------------------------------------------------- CUDA graphs: PyTorch's private pool hooks
#
# Note [Graph pools through the bridge]: PyTorch announces a pool with beginAllocateToPool(device, pool id, filter),
# where the filter says which requests the pool serves: those of a stream capturing under one capture id
# (torch.cuda.graph), or those of one thread (cudagraph trees, MemPool's use_mem_pool). A filter is C++ and may ask
# the CUDA runtime, so the core knows nothing of it: the bridge keeps the active pools' filters and routes each
# request itself (Allocator.malloc_in_pool_nogil), the core serving it from that pool (Note [Private pools]).
#   - Every pool PyTorch begins is treated as capturing (no event, no synchronize while it is active): the begin
#     hook cannot tell a capture from a MemPool context, and a capture starts only after its begin.
#   - While any pool is routed, requests run with the thread in relaxed capture mode, as PyTorch's own allocator
#     does around cudaMalloc: growing memory (cuMemCreate, cuMemMap, cuMemSetAccess) during a global-mode capture
#     must not invalidate it.
#   - PyTorch may begin a pool that is already routing (cudagraph trees capture into the pool their warm-up
#     allocates from): such a begin adds a use of the pool (Allocator.retain_pool) and a route; the pool stops
#     routing when its last route ends. Each begin's use is dropped by its own releasePool.
# With no pool routed, a request pays one atomic load for all this.

# _routing_lock guards the three vectors below. It is taken only by a ScopedLock in one of the routing steps after
# _alloc_routed (one step a function, the lock held until it returns, on every path: a filter or a push_back that
# throws included), never around a call into the allocator or any Python.
cdef std_mutex _routing_lock
cdef vector[int] _routed_devices          # one entry per active begin: its device, pool key and filter
cdef vector[uint64_t] _routed_pools
cdef vector[StreamFilter] _routed_filters
cdef atomic[int] _routed_count            # how many entries: 0 keeps gmlake_alloc on its plain path

cdef enum:
    RELAXED_CAPTURE_MODE = 2              # CU_STREAM_CAPTURE_MODE_RELAXED


cdef uint64_t _pool_key(pair[unsigned long long, unsigned long long] pool) noexcept nogil:
    """The core's pool id for PyTorch's (first, second) pair: one of them is a counter and the other 0; 0 if either
    does not fit in 32 bits (never seen: they count pools made in this process)."""
    if (pool.first >> 32) or (pool.second >> 32):
        return 0
    return (pool.first << 32) | pool.second


cdef uintptr_t _alloc_routed(Allocator a, size_t size, int device, void* stream, Failure* why) noexcept nogil:
    """A request while PyTorch has pools active: the first active pool whose filter accepts the stream serves it,
    else the default pool, with the thread in relaxed capture mode."""
    cdef uint64_t pool = _route(device, stream)
    cdef int mode = RELAXED_CAPTURE_MODE
    cdef uintptr_t ptr
    cdef bint relaxed = a.driver.exchange_capture_mode(&mode) == 0
    ptr = a.malloc_in_pool_nogil(size, <int64_t><uintptr_t>stream, pool, why)
    if relaxed:
        a.driver.exchange_capture_mode(&mode)
    return ptr


# ---- the routing steps, each under _routing_lock

cdef inline uint64_t _route(int device, void* stream) noexcept nogil:
    """The pool of the first active begin on `device` whose filter accepts `stream`, else 0 (the default pool)."""
    cdef ScopedLock held
    held.acquire(_routing_lock)
    cdef size_t i
    for i in range(_routed_pools.size()):
        if _routed_devices[i] == device and filter_accepts(_routed_filters[i], stream):
            return _routed_pools[i]
    return 0


cdef bint _is_routed(int device, uint64_t pool) noexcept nogil:
    """Whether some active begin routes `pool` on `device` (the caller holds _routing_lock)."""
    cdef size_t i
    for i in range(_routed_pools.size()):
        if _routed_devices[i] == device and _routed_pools[i] == pool:
            return True
    return False


cdef bint _routes(int device, uint64_t pool) noexcept nogil:
    """_is_routed, under _routing_lock."""
    cdef ScopedLock held
    held.acquire(_routing_lock)
    return _is_routed(device, pool)


cdef void _add_route(int device, uint64_t pool, const StreamFilter& filter) noexcept nogil:
    """A begin's route: `pool` on `device` serves the requests `filter` accepts."""
    cdef ScopedLock held
    held.acquire(_routing_lock)
    _routed_devices.push_back(device)
    _routed_pools.push_back(pool)
    _routed_filters.push_back(filter)
    _routed_count.store(<int>_routed_pools.size())


cdef bint _drop_route(int device, uint64_t pool) noexcept nogil:
    """Drop the latest route of `pool` on `device`, if any: whether that was its last."""
    cdef ScopedLock held
    held.acquire(_routing_lock)
    cdef size_t i = _routed_pools.size()
    cdef bint found = False
    while i > 0:
        i -= 1
        if _routed_devices[i] == device and _routed_pools[i] == pool:
            _routed_devices.erase(_routed_devices.begin() + i)
            _routed_pools.erase(_routed_pools.begin() + i)
            _routed_filters.erase(_routed_filters.begin() + i)
            found = True
            break
    _routed_count.store(<int>_routed_pools.size())
    return found and not _is_routed(device, pool)


cdef void _copy_routes(vector[int]& devices, vector[uint64_t]& pools) noexcept nogil:
    """The active begins' devices and pools, copied out, so that routed_pools makes its Python objects unlocked."""
    cdef ScopedLock held
    held.acquire(_routing_lock)
    cdef size_t i
    for i in range(_routed_pools.size()):
        devices.push_back(_routed_devices[i])
        pools.push_back(_routed_pools[i])


cdef enum PoolMethod:
    POOL_BEGIN
    POOL_RETAIN
    POOL_END
    POOL_RELEASE


cdef bint _pool_call(int device, PoolMethod which, uint64_t pool, ErrorText* error) noexcept with gil:
    """Call Allocator.<method>(pool) on `device`'s allocator; False with the message in `error` if it raised."""
    method = ("begin_allocate_to_pool", "retain_pool", "end_allocate_to_pool", "release_pool")[which]
    try:
        a = allocator(device)
        if which == POOL_BEGIN:
            a.begin_allocate_to_pool(pool, [], capturing=True)
        else:
            getattr(a, method)(pool)
        return True
    except BaseException as exc:
        msg = f"gmlake: {method} of CUDA graph pool {pool >> 32}:{pool & 0xffffffff} on device {device}: {exc}"
        encoded = msg.encode()[:500]
        snprintf(error.text, ERROR_TEXT, "%s", <const char*>encoded)
        return False


cdef void _warn_pool_error(ErrorText* error) noexcept with gil:
    warnings.warn((<bytes>error.text).decode(errors="replace"), RuntimeWarning, stacklevel=2)


cdef public void gmlake_begin_allocate_to_pool(int device, pair[unsigned long long, unsigned long long] pool_id, StreamFilter filter) noexcept nogil:
    cdef uint64_t pool = _pool_key(pool_id)
    cdef bint nested
    cdef ErrorText error
    if _get(device, &error) == NULL:
        throw_error(error.text)
    if pool == 0:
        throw_error("gmlake: beginAllocateToPool: a CUDA graph pool id out of range")
    nested = _routes(device, pool)
    if not _pool_call(device, POOL_RETAIN if nested else POOL_BEGIN, pool, &error):
        throw_error(error.text)
    _add_route(device, pool, filter)


cdef public void gmlake_end_allocate_to_pool(int device, pair[unsigned long long, unsigned long long] pool_id) noexcept nogil:
    """Drop the pool's latest route; the pool stops routing with its last. Called at the end of a capture, which
    must not throw: an unknown pool is ignored."""
    cdef uint64_t pool = _pool_key(pool_id)
    cdef ErrorText error
    if _drop_route(device, pool) and not _pool_call(device, POOL_END, pool, &error):
        throw_error(error.text)


cdef public void gmlake_release_pool(int device, pair[unsigned long long, unsigned long long] pool_id) noexcept nogil:
    """Drop one use of the pool (a graph's reset, a MemPool's end); its last use returns its free memory. Called
    from CUDAGraph's destructor, so a failure is a warning, never an exception."""
    cdef uint64_t pool = _pool_key(pool_id)
    cdef ErrorText error
    if device < 0 or device >= MAX_DEVICES or _allocators[device] == NULL:
        return
    if pool != 0 and not _pool_call(device, POOL_RELEASE, pool, &error):
        _warn_pool_error(&error)


def routed_pools() -> list:
    """(device, pool key) of every active begin PyTorch made, in order (for tests and debugging)."""
    cdef vector[int] devices
    cdef vector[uint64_t] pools
    cdef size_t i
    _copy_routes(devices, pools)
    return [(devices[i], pools[i]) for i in range(pools.size())]


# ---------------------------------------------------------------- sharing a tensor with another process
#
# Note [Sharing a tensor through PyTorch's handle]: torch.multiprocessing (Queue, Pipe, reduce_tensor) shares a CUDA
# tensor by asking the allocator for a handle to the block under it (CUDACachingAllocator::shareIpcHandle) and
# opens it in the receiver with getIpcDevPtr; PyTorch's Note [Sharing CUDA tensors] (the CudaIPCSentData reference
# count, the limbo, the event the receiver waits on) keeps the sender's block allocated while a receiver holds it.
# gmlake's shim (gmlake/torch/_torch_allocator_shim.cc) answers shareIpcHandle in PyTorch's own expandable-segment
# format, so any receiver opens it with torch's own code: the sender's pid, the page size, the number of pages, then
# one descriptor per page, which the receiver takes from the sender with pidfd_getfd and maps back to back. The pages
# are the block's units (Note [Sharing a block's units]: whole chunks or slots, a stitched block's in its sBlock's
# order), each with the descriptor its driver keeps while the chunk lives (Note [One descriptor per shared chunk]).
# The format has one page size, so a block whose units differ in size (a tail_page or reback_slot slot beside whole
# pages, an edge_page or capped_page_large page beside a larger one) cannot be shared: shareIpcHandle raises, in the sender, one error naming the knob. A gmlake receiver opens a
# handle with PyTorch's native caching allocator, which the shim keeps for that (getIpcDevPtr).

cdef int _share_units(Allocator a, uintptr_t ptr, size_t* offset, size_t* unit_size, int* fds, size_t capacity,
                      size_t* count, ErrorText* why):
    """gmlake_share_ipc's work under the GIL: 0, 2 where `capacity` is short of *count descriptors, else 1 and the
    reason in `why`."""
    cdef int fd = -1
    cdef int rc
    cdef size_t i
    try:
        start, _, units = a.share_units(ptr)
        sizes = sorted({n for _, n in units})
        if len(sizes) != 1:
            raise ValueError(
                f"its block lies on pages of {len(sizes)} sizes ({', '.join(format_torch_size(n) for n in sizes)}), "
                f"and "
                f"PyTorch's handle for sharing CUDA tensors holds pages of one size; pages of several sizes come "
                f"from the policy's tail_page, reback_slot, capped_page_large or edge_page knob: set it to 0 to "
                f"share tensors")
        count[0] = len(units)
        if count[0] > capacity:
            return 2
        for i in range(count[0]):
            rc = a.driver.shared_fd(<uint64_t>units[i][0], &fd)
            if rc != DRIVER_OK:
                hint = ("; GMLAKE_IPC=0 made its chunks unexportable: start the process with GMLAKE_IPC=1 to share "
                        "tensors"
                        if not getattr(a.driver, "exportable", True) else "")
                raise RuntimeError(f"{a.driver.describe_error(rc)}{hint}")
            fds[i] = fd
        offset[0] = start
        unit_size[0] = sizes[0]
        return 0
    except BaseException as exc:
        msg = f"gmlake: cannot share the CUDA tensor at {ptr:#x} with another process: {exc}".encode()[:500]
        snprintf(why.text, ERROR_TEXT, "%s", <const char*>msg)
        return 1


cdef public int gmlake_share_ipc(void* ptr, size_t* offset, size_t* unit_size, int* fds, size_t capacity,
                                 size_t* count, char* error, size_t error_size) noexcept nogil:
    """The pages under the live block at `ptr`, for PyTorch's shareIpcHandle (Note [Sharing a tensor through
    PyTorch's handle]): their one size in `unit_size`, their number in `count`, a descriptor for each in `fds` (the
    driver's, kept open while the chunk lives; the caller must not close them), and where the block starts in them
    in `offset`. Returns 0; 2 where `capacity` descriptors are too few (then `count` says how many to make room
    for); 1 with the reason in `error` where the block cannot be shared."""
    cdef ErrorText why
    cdef void* owner = NULL
    cdef int d, rc
    for d in range(MAX_DEVICES):
        if _allocators[d] != NULL and (<Allocator>_allocators[d]).block_size_nogil(<uintptr_t>ptr):
            owner = _allocators[d]
            break
    if owner == NULL:
        if error != NULL and error_size:
            snprintf(error, error_size, "gmlake: cannot share %p with another process: no allocation of gmlake's "
                     "starts there", ptr)
        return 1
    with gil:
        rc = _share_units(<Allocator>owner, <uintptr_t>ptr, offset, unit_size, fds, capacity, count, &why)
    if rc == 1 and error != NULL and error_size:
        snprintf(error, error_size, "%s", why.text)
    return rc


def share_ipc(ptr: int) -> tuple:
    """gmlake_share_ipc from Python: (offset, page size, [descriptor, ...]) of the live block at `ptr` (Note [Sharing
    a tensor through PyTorch's handle]); the descriptors stay the driver's. RuntimeError with the reason where it
    cannot be shared."""
    cdef size_t offset = 0, unit = 0, count = 0
    cdef vector[int] fds
    cdef char error[ERROR_TEXT]
    cdef int rc = 2
    cdef void* p = <void*><uintptr_t>ptr
    fds.resize(16)
    while rc == 2:
        with nogil:
            rc = gmlake_share_ipc(p, &offset, &unit, fds.data(), fds.size(), &count, error, sizeof(error))
        if rc == 2:
            fds.resize(count)
    if rc:
        raise RuntimeError((<bytes>error).decode(errors="replace"))
    return offset, unit, [fds[i] for i in range(count)]
