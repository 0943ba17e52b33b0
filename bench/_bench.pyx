# cython: language_level=3, annotation_typing=False
"""Timing in nogil loops for the micro benchmark (bench micro) and the replay cost table it measures: the core's
cache hits and single driver calls. Not part of gmlake's API."""
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libcpp.vector cimport vector
from gmlake.core._allocator cimport Allocator
from gmlake.core._driver cimport Driver, DRIVER_OK, EVENT_DONE

from gmlake.core._clock cimport monotonic_ns
from posix.unistd cimport close


cdef inline double now_us() noexcept nogil:
    return monotonic_ns() * 1e-3


def _check(Driver driver, int rc, str what):
    if rc != DRIVER_OK:
        raise RuntimeError(f"{what} failed: {driver.describe_error(rc)}")


def time_driver_calls(Driver driver not None, size_t chunk_size, size_t handles, bint export=False,
                      bint copies=True) -> dict:
    """Microseconds per call for each VMM call, over `handles` chunks of `chunk_size` bytes.

    set_access and unmap are timed once over a range holding all the handles, and reported per handle, because the
    CUDA driver charges them per handle mapped in the range. `export`: export each chunk once all are created
    (Driver.export_chunk, timed: "export") and close its descriptor, before any is mapped, so that the calls after
    are those of an exported chunk (bench ipc-price). `copies`: time re-backing's copies of the whole range.
    Returns {call: µs per call or per handle}.
    """
    cdef vector[uint64_t] hs
    cdef uint64_t h = 0
    cdef uintptr_t va = 0, va2 = 0
    cdef size_t i, span = chunk_size * handles
    cdef double t0, t_create, t_reserve, t_map, t_access, t_unmap, t_release, t_free, t_map_one, t_access_one
    cdef double t_copy_out = 0, t_copy_in = 0
    cdef double t_export = 0
    cdef vector[char] host
    cdef vector[int] fds
    cdef int fd = -1
    cdef int rc = DRIVER_OK
    _check(driver, driver.synchronize(), "synchronize")
    with nogil:
        t0 = now_us()
        for i in range(handles):
            rc = driver.create_chunk(chunk_size, &h)
            if rc != DRIVER_OK:
                break
            hs.push_back(h)
        t_create = now_us() - t0
    if rc != DRIVER_OK:
        for i in range(hs.size()):
            driver.release_chunk(hs[i], chunk_size)
    _check(driver, rc, "create_chunk")
    if export:
        with nogil:
            t0 = now_us()
            for i in range(handles):
                rc = driver.export_chunk(hs[i], &fd)
                if rc != DRIVER_OK:
                    break
                fds.push_back(fd)
            t_export = now_us() - t0
            for i in range(fds.size()):
                close(fds[i])
        if rc != DRIVER_OK:
            for i in range(handles):
                driver.release_chunk(hs[i], chunk_size)
        _check(driver, rc, "export_chunk")
    with nogil:
        t0 = now_us()
        rc = driver.reserve(span, driver.granularity, &va)
        t_reserve = now_us() - t0
    _check(driver, rc, "reserve")
    with nogil:
        t0 = now_us()
        for i in range(handles):
            rc = driver.map(va + i * chunk_size, chunk_size, hs[i])
            if rc != DRIVER_OK:
                break
        t_map = now_us() - t0
    _check(driver, rc, "map")
    with nogil:
        t0 = now_us()
        rc = driver.set_access(va, span)
        t_access = now_us() - t0
    _check(driver, rc, "set_access")
    # The copies re-backing makes (Note [Taking slots back at the edge]): the whole range to pageable host memory
    # and back, as one call each.
    if copies:
        host.resize(span)
        with nogil:
            t0 = now_us()
            rc = driver.copy_out(&host[0], va, span)
            t_copy_out = now_us() - t0
        _check(driver, rc, "copy_out")
        with nogil:
            t0 = now_us()
            rc = driver.copy_in(va, &host[0], span)
            t_copy_in = now_us() - t0
        _check(driver, rc, "copy_in")
    # One handle alone, for the fixed part of set_access.
    _check(driver, driver.reserve(chunk_size, driver.granularity, &va2), "reserve")
    with nogil:
        t0 = now_us()
        rc = driver.map(va2, chunk_size, hs[0])
        t_map_one = now_us() - t0
        t0 = now_us()
        rc = driver.set_access(va2, chunk_size) if rc == DRIVER_OK else rc
        t_access_one = now_us() - t0
    _check(driver, rc, "set_access")
    _check(driver, driver.unmap(va2, chunk_size), "unmap")
    _check(driver, driver.free_va(va2, chunk_size), "free_va")
    with nogil:
        t0 = now_us()
        rc = driver.unmap(va, span)
        t_unmap = now_us() - t0
    _check(driver, rc, "unmap")
    with nogil:
        t0 = now_us()
        rc = driver.free_va(va, span)
        t_free = now_us() - t0
    _check(driver, rc, "free_va")
    with nogil:
        t0 = now_us()
        for i in range(handles):
            rc = driver.release_chunk(hs[i], chunk_size)
        t_release = now_us() - t0
    _check(driver, rc, "release_chunk")
    out = {
        "create_chunk": t_create / handles,
        "reserve": t_reserve,
        "map": t_map / handles,
        "set_access_per_handle": t_access / handles,
        "set_access_one_handle": t_access_one,
        "unmap_per_handle": t_unmap / handles,
        "free_va": t_free,
        "release_chunk": t_release / handles,
        "chunk_size": chunk_size,
        "handles": handles,
    }
    if copies:
        out["copy_out_per_mib"] = t_copy_out * (1 << 20) / span
        out["copy_in_per_mib"] = t_copy_in * (1 << 20) / span
    if export:
        out["export"] = t_export / handles
    return out


def time_stream_calls(Driver driver not None, int64_t stream, size_t iterations) -> dict:
    """Microseconds per call of the calls stream ordering makes: the capture query asked before a request's first
    driver call (Note [Unannounced capture]), and an event's record (with its creation), query once complete,
    record again once complete (a spare event reused, Note [Reusing events]), and destruction (a fence, or a
    record_stream free). The event prices feed gmlake/sim/data/driver_costs_h200.json. Returns {call: µs per call}."""
    cdef vector[uint64_t] events
    cdef uint64_t ev = 0
    cdef size_t i
    cdef bint capturing = False
    cdef int rc = DRIVER_OK
    cdef double t0, t_capture, t_record, t_query, t_rerecord, t_destroy
    if iterations == 0:
        raise ValueError("iterations must be at least 1")
    with nogil:
        t0 = now_us()
        for i in range(iterations):
            rc = driver.stream_capturing(stream, &capturing)
            if rc != DRIVER_OK:
                break
        t_capture = now_us() - t0
    _check(driver, rc, "stream_capturing")
    if capturing:
        raise RuntimeError("the stream is being captured: time the calls outside any capture")
    with nogil:
        t0 = now_us()
        for i in range(iterations):
            ev = 0                      # 0: a new event each time
            rc = driver.record_event(stream, &ev)
            if rc != DRIVER_OK:
                break
            events.push_back(ev)
        t_record = now_us() - t0
    if rc != DRIVER_OK:
        for i in range(events.size()):
            driver.destroy_event(events[i])
    _check(driver, rc, "record_event")
    _check(driver, driver.synchronize(), "synchronize")      # every event complete: the query's fast answer
    with nogil:
        t0 = now_us()
        for i in range(events.size()):
            if driver.query_event(events[i]) != EVENT_DONE:
                rc = -1
        t_query = now_us() - t0
    if rc != DRIVER_OK:
        for i in range(events.size()):
            driver.destroy_event(events[i])
        raise RuntimeError("an event recorded before a synchronize was still incomplete after it")
    with nogil:
        t0 = now_us()
        for i in range(events.size()):
            ev = events[i]
            rc = driver.record_event(stream, &ev)
            if rc != DRIVER_OK:
                break
        t_rerecord = now_us() - t0
        driver.synchronize()
        t0 = now_us()
        for i in range(events.size()):
            driver.destroy_event(events[i])
        t_destroy = now_us() - t0
    _check(driver, rc, "record_event on a used event")
    return {"capture_query": t_capture / iterations, "event_record": t_record / iterations,
            "event_query": t_query / iterations, "event_rerecord": t_rerecord / iterations,
            "event_destroy": t_destroy / iterations, "iterations": iterations}


def time_cache_hits(Allocator alloc, size_t size, size_t iterations, int64_t stream=0) -> float:
    """Nanoseconds per malloc+free pair of a cached block, timed inside the Cython core (no Python per call)."""
    cdef double t0, t1
    cdef size_t i
    cdef uintptr_t p
    p = alloc.malloc(size, stream)
    alloc.free(p)
    with nogil:
        t0 = monotonic_ns()
        for i in range(iterations):
            p = alloc.malloc_nogil(size, stream, NULL)
            alloc.free_nogil(p)
        t1 = monotonic_ns()
    if p == 0:
        raise RuntimeError("allocation failed during the benchmark")
    return (t1 - t0) / iterations
