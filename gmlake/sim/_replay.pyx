# cython: language_level=3, annotation_typing=False
"""The replay loop: a trace's requests through an Allocator, nogil, sampling reserved and allocated memory."""
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t, uintptr_t
from libcpp.vector cimport vector
from gmlake.core._allocator cimport Allocator, Failure, ERR_OOM
from gmlake.core._driver cimport ModelDriver

import numpy as np

from gmlake.core._clock cimport monotonic_ns


def replay_events(Allocator alloc not None, const uint8_t[:] action, const int64_t[:] stream,
                  const uint64_t[:] size, const uint32_t[:] ident, size_t samples=2000,
                  const uint64_t[:] pool=None, uint64_t event_lag=0, int64_t[:] progress=None,
                  const uint64_t[:] outside_at=None, const uint64_t[:] outside_bytes=None) -> dict:
    """Serve each alloc (action 0) and free (action 1) in order; other actions are skipped. The timeline samples
    (about `samples` of them) hold the largest reserved, allocated and requested values since the previous sample.
    `pool`, if given, names per event the private pool (already begun) an alloc is served from, 0 for the default
    pool. `progress`, if given (two int64s, for another thread to watch): the loop writes the events done into
    progress[0] as it goes, and stops early (returning "stopped": True) once progress[1] is non-zero.

    A request the allocator cannot serve is counted as an OOM and its free skipped, as a training run that caught
    the error would go on. A driver error stops the replay. Allocation ids must be below the number of events
    (gmlake.sim.replay numbers them densely). `event_lag` > 0 (a model driver's only): an event the allocator records
    completes that many requests later, as if the GPU trailed the CPU (Note [Event lag in replay]); 0: at once.
    `outside_at` and `outside_bytes` (a model driver's only; ascending event indices): from event outside_at[k] on,
    the process holds outside_bytes[k] of the device outside the allocator (Note [The libraries' memory in replay]);
    growth the device has no room for is counted as a library failure, and the libraries keep what they held.
    Returns peaks, counts and a sampled timeline.
    """
    cdef size_t n = action.shape[0]
    if stream.shape[0] != n or size.shape[0] != n or ident.shape[0] != n or (pool is not None and pool.shape[0] != n):
        raise ValueError("replay_events: arrays differ in length")
    cdef bint pooled = pool is not None
    cdef ModelDriver model = None
    if event_lag:
        if not isinstance(alloc.driver, ModelDriver):
            raise ValueError("replay_events: event_lag needs a model driver (sim or host)")
        model = <ModelDriver>alloc.driver
        model.event_lag = event_lag
    cdef bint lagged = model is not None
    cdef size_t outside_n = 0, outside_next = 0, library_failures = 0, first_library_failure = <size_t>-1
    cdef size_t peak_outside = 0, first_oom = <size_t>-1
    if outside_at is not None or outside_bytes is not None:
        if outside_at is None or outside_bytes is None or outside_at.shape[0] != outside_bytes.shape[0]:
            raise ValueError("replay_events: outside_at and outside_bytes go together, of one length")
        if not isinstance(alloc.driver, ModelDriver):
            raise ValueError("replay_events: memory outside the allocator needs a model driver (sim or host)")
        model = <ModelDriver>alloc.driver
        outside_n = outside_at.shape[0]
    cdef uint32_t max_id = 0
    cdef size_t i
    for i in range(n):
        if ident[i] > max_id:
            max_id = ident[i]
    if n and max_id >= n:   # the id table is indexed by id: keep it as long as the trace, whatever the ids
        raise ValueError(f"replay_events: allocation ids must be below the number of events ({n}), got {max_id}")
    cdef vector[uintptr_t] ptrs
    ptrs.assign(<size_t>max_id + 1, 0)
    cdef size_t every = max(1, n // max(1, samples))
    cdef size_t slots = n // every + 2
    t_event = np.zeros(slots, dtype=np.int64)
    t_reserved = np.zeros(slots, dtype=np.int64)
    t_allocated = np.zeros(slots, dtype=np.int64)
    t_requested = np.zeros(slots, dtype=np.int64)
    cdef int64_t[:] te = t_event
    cdef int64_t[:] tr = t_reserved
    cdef int64_t[:] ta = t_allocated
    cdef int64_t[:] tq = t_requested
    cdef bint watched = progress is not None
    if watched and progress.shape[0] < 2:
        raise ValueError("replay_events: progress needs two int64s (events done, stop)")
    cdef size_t taken = 0, served = 0, ooms = 0
    cdef size_t peak_reserved = 0, allocated_at_peak = 0, peak_allocated = 0, peak_event = 0
    cdef size_t window_reserved = 0, window_allocated = 0, window_requested = 0
    cdef uintptr_t p
    cdef int failed = 0
    cdef bint stopped = False
    cdef Failure why
    cdef double t0, t1
    with nogil:
        t0 = monotonic_ns()
        for i in range(n):
            if watched:
                progress[0] = i
                if progress[1]:
                    stopped = True
                    break
            if lagged:
                model.clock += 1
            while outside_next < outside_n and outside_at[outside_next] <= i:
                if not model.hold_outside(outside_bytes[outside_next]):
                    library_failures += 1
                    if first_library_failure == <size_t>-1:
                        first_library_failure = i
                elif model.outside_bytes > peak_outside:
                    peak_outside = model.outside_bytes
                outside_next += 1
            if action[i] == 0:
                if pooled and pool[i] != 0:
                    p = alloc.malloc_in_pool_nogil(size[i], stream[i], pool[i], &why)
                else:
                    p = alloc.malloc_nogil(size[i], stream[i], &why)
                if p == 0:
                    if why.err != ERR_OOM:     # a driver error or a policy hook that raised stops the replay
                        failed = 1
                        break
                    ooms += 1
                    if first_oom == <size_t>-1:
                        first_oom = i
                else:
                    ptrs[ident[i]] = p
                served += 1
            elif action[i] == 1:
                p = ptrs[ident[i]]
                if p != 0:
                    alloc.free_nogil(p)
                    ptrs[ident[i]] = 0
                served += 1
            else:
                continue
            if alloc.st.reserved > peak_reserved:
                peak_reserved = alloc.st.reserved
                allocated_at_peak = alloc.st.allocated
                peak_event = i
            if alloc.st.allocated > peak_allocated:
                peak_allocated = alloc.st.allocated
            # Each sample is the largest value in its window, so short peaks show in the timeline.
            if alloc.st.reserved > window_reserved:
                window_reserved = alloc.st.reserved
            if alloc.st.allocated > window_allocated:
                window_allocated = alloc.st.allocated
            if alloc.st.requested > window_requested:
                window_requested = alloc.st.requested
            if i % every == 0:
                te[taken] = i
                tr[taken] = window_reserved
                ta[taken] = window_allocated
                tq[taken] = window_requested
                taken += 1
                window_reserved = 0
                window_allocated = 0
                window_requested = 0
        t1 = monotonic_ns()
    if failed:
        raise alloc.failure(size[i], &why, i)
    if watched:
        progress[0] = i if stopped else n
    te[taken] = n
    tr[taken] = alloc.st.reserved
    ta[taken] = alloc.st.allocated
    tq[taken] = alloc.st.requested
    taken += 1
    return {
        "events": n,
        "requests": served,
        "ooms": ooms,
        "first_oom": None if first_oom == <size_t>-1 else first_oom,
        "library_failures": library_failures,
        "first_library_failure": None if first_library_failure == <size_t>-1 else first_library_failure,
        "peak_outside": peak_outside,
        "seconds": (t1 - t0) * 1e-9,
        "peak_reserved": peak_reserved,
        "peak_allocated": peak_allocated,
        "allocated_at_peak_reserved": allocated_at_peak,
        "peak_event": peak_event,
        "stopped": stopped,
        "timeline": {"event": t_event[:taken], "reserved": t_reserved[:taken], "allocated": t_allocated[:taken],
                     "requested": t_requested[:taken]},
    }
