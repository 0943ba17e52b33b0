# A monotonic clock for timing inside nogil code.
cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec* ts)
    int CLOCK_MONOTONIC
    int CLOCK_REALTIME


cdef inline double monotonic_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1e9 + ts.tv_nsec
