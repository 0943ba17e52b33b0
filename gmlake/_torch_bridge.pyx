# cython: language_level=3, annotation_typing=False
"""The allocator behind torch.cuda.memory.CUDAPluggableAllocator: C entry points over one Allocator per device.

Compiled with CYTHON_EXTERN_C defined as extern "C", so the `cdef public` functions below keep their plain names
(gmlake_alloc, gmlake_free, ...) for ctypes and torch. Their paths are nogil; only the first call on a device, which
creates its allocator, takes the GIL.
"""
from libc.stdint cimport uint64_t, int64_t, uintptr_t
from libc.stdio cimport snprintf
from gmlake._allocator cimport Allocator, Failure, ERR_OOM, ERR_NONE

cdef extern from "_bridge.h" namespace "gmlake" nogil:
    void throw_error(const char* message)

cdef enum:
    MAX_DEVICES = 64

# Borrowed pointers; `_owners` keeps the Allocator objects alive.
cdef void* _allocators[MAX_DEVICES]
import threading

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


cdef char _create_error[512]


cdef void* _get(int device) noexcept nogil:
    if device < 0 or device >= MAX_DEVICES:
        return NULL
    if _allocators[device] != NULL:
        return _allocators[device]
    with gil:
        try:
            allocator(device)
        except BaseException as exc:
            msg = f"gmlake: cannot create the allocator for device {device}: {exc}".encode()[:500]
            snprintf(_create_error, sizeof(_create_error), "%s", <const char*>msg)
            return NULL
    return _allocators[device]


cdef inline double _mib(size_t n) noexcept nogil:
    return n / 1048576.0


cdef void _fail(Allocator a, size_t size, int device, Failure* why) noexcept nogil:
    """Raise torch's error for a failed allocation: gmlake's OOM message, or the policy's / driver's error."""
    cdef char message[768]
    if why.err == ERR_OOM:
        snprintf(message, sizeof(message),
                 "gmlake: CUDA out of memory on device %d: tried to allocate %.2f MiB (%zu bytes); "
                 "%.2f MiB reserved, %.2f MiB allocated, %.2f MiB cached and free; cap %.2f MiB "
                 "(set_per_process_memory_fraction or GMLAKE_LIMIT; 0 = none), device capacity %.2f MiB. "
                 "The allocator is still usable: free tensors or use a smaller batch and retry.",
                 device, _mib(size), size, _mib(why.reserved), _mib(why.allocated),
                 _mib(why.reserved - why.allocated), _mib(why.limit), _mib(a.driver.capacity))
    else:
        with gil:
            text = f"gmlake: allocating {size} bytes on device {device} failed: {a.failure(size, why)}"
            encoded = text.encode()[:700]
            snprintf(message, sizeof(message), "%s", <const char*>encoded)
    throw_error(message)


cdef public void* gmlake_alloc(size_t size, int device, void* stream) noexcept nogil:
    cdef void* handle = _get(device)
    cdef Failure why
    if handle == NULL:
        throw_error(_create_error)
    if size == 0:
        size = 1    # torch may ask for 0 bytes; hand out a distinct, valid pointer
    cdef uintptr_t ptr = (<Allocator>handle).malloc_nogil(size, <int64_t><uintptr_t>stream, &why)
    if ptr == 0:
        _fail(<Allocator>handle, size, device, &why)
    return <void*>ptr


cdef public void gmlake_free(void* ptr, size_t size, int device, void* stream) noexcept nogil:
    cdef void* handle = _allocators[device] if 0 <= device < MAX_DEVICES else NULL
    if handle != NULL:
        (<Allocator>handle).free_nogil(<uintptr_t>ptr)


cdef public void gmlake_init(int device_count) noexcept nogil:
    pass    # allocators are created on a device's first allocation


cdef public void gmlake_reset() noexcept nogil:
    cdef int d
    for d in range(MAX_DEVICES):
        if _allocators[d] != NULL:
            (<Allocator>_allocators[d]).empty_cache_nogil(NULL)


cdef public void gmlake_memory_fraction(double fraction, int device) noexcept nogil:
    cdef void* handle = _get(device)
    if handle == NULL:
        return
    if not (0.0 <= fraction <= 1.0):        # torch checks too; a NaN or out-of-range value never becomes a cap
        throw_error("gmlake: set_per_process_memory_fraction needs a fraction between 0 and 1")
    (<Allocator>handle).set_limit_nogil(<size_t>(fraction * (<Allocator>handle).driver.capacity))


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
