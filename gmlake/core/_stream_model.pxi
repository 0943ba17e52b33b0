# The hazard model of ModelDriver (tests only), included by _driver.pyx: kernels queued per stream, judged
# against every map, unmap, release and address free.

def _overlap(a: list, b: list) -> tuple | None:
    """The first physical byte range two extent lists share, as (handle, lo, hi), or None."""
    for handle, lo, hi in a:
        for other, olo, ohi in b:
            if handle == other and lo < ohi and olo < hi:
                return handle, max(lo, olo), min(hi, ohi)
    return None


class _Kernel:
    """Work queued on a stream: it touches VA [va, va + size), i.e. the physical `extents` (handle, lo, hi) that VA
    mapped when it was queued. When it runs it writes byte `write` and/or checks that the bytes read `expect`."""
    __slots__ = ("stream", "ticket", "va", "size", "extents", "write", "expect", "waits", "label")

    def __init__(self, stream, ticket, va, size, extents, write, expect, waits, label):
        self.stream, self.ticket, self.va, self.size = stream, ticket, va, size
        self.extents, self.write, self.expect, self.waits, self.label = extents, write, expect, waits, label

    def describe(self) -> str:
        return f"stream {self.stream}'s queued kernel #{self.ticket} ({self.label or 'unnamed'}) on 0x{self.va:x}+{self.size}"


class StreamModel:
    """What a ModelDriver with hazard tracking knows: which VA maps which handle, and each stream's queued kernels.

    A kernel runs (its write lands, its check reads) only when its stream is completed up to it: by the test
    (`complete_stream`), by a seeded random schedule (`complete_random`) or by a synchronize. Hazards are judged on
    physical memory, (handle, offset), because an sBlock maps one handle in several VA ranges; an unmap is judged on
    VA, since a queued kernel faults on the address it was given. Each hazard found is appended to `hazards`.
    """

    def __init__(self, driver) -> None:
        self.driver = driver
        self.maps: dict[int, tuple[int, int]] = {}      # va -> (size, handle) of each live mapping
        self.starts: list[int] = []                     # the mappings' VAs, sorted
        self.handle_vas: dict[int, set[int]] = {}       # handle -> the VAs it is mapped at
        self.queues: dict[int, deque] = {}              # stream -> queued kernels, oldest first
        self.waited: dict[int, dict[int, int]] = {}     # stream -> {other stream: ticket its later work waits for}
        self.hazards: list[str] = []

    # ---- address translation

    def extents(self, va: int, size: int) -> list[tuple[int, int, int]]:
        """The physical ranges (handle, lo, hi) under VA [va, va + size); HazardError if any byte is unmapped."""
        out = []
        at, end = va, va + size
        i = bisect_right(self.starts, at) - 1
        while at < end:
            if i < 0 or i >= len(self.starts):
                raise HazardError(f"access to 0x{at:x}, which no handle is mapped at")
            start = self.starts[i]
            msize, handle = self.maps[start]
            if not start <= at < start + msize:
                raise HazardError(f"access to 0x{at:x}, which no handle is mapped at")
            hi = min(end, start + msize)
            out.append((handle, at - start, hi - start))
            at = hi
            i += 1
        return out

    # ---- kernels

    def pending(self, stream: int | None = None) -> int:
        """How many kernels are queued (on `stream`, or on all streams)."""
        if stream is not None:
            return len(self.queues.get(stream, ()))
        return sum(len(q) for q in self.queues.values())

    def launch(self, stream: int, ticket: int, va: int, size: int, write, expect, waits: dict, label: str) -> None:
        """Queue a kernel; HazardError if another stream's queued work (not waited for) touches the same bytes."""
        extents = self.extents(va, size)
        kernel = _Kernel(stream, ticket, va, size, extents, write, expect, waits, label)
        for other, queue in self.queues.items():
            if other == stream:
                continue    # one stream runs its kernels in order
            waited = waits.get(other, 0)
            for queued in queue:
                if queued.ticket <= waited or (write is None and queued.write is None):
                    continue    # ordered by an event wait, or two reads: no race
                shared = _overlap(extents, queued.extents)
                if shared is not None:
                    handle, lo, hi = shared
                    raise HazardError(
                        f"stream-ordering hazard: stream {stream} was handed handle {handle} bytes [{lo}, {hi}) "
                        f"(kernel {label or 'unnamed'} on 0x{va:x}+{size}) while {queued.describe()} still uses them")
        self.queues.setdefault(stream, deque()).append(kernel)

    def wait(self, stream: int, other: int, ticket: int) -> None:
        """An event wait: work queued on `stream` from now on is ordered after `other`'s work up to `ticket`, and so,
        as on a GPU, after whatever `other` itself waited for by then."""
        if other != stream:
            self._merge(self.waited.setdefault(stream, {}), self._through(other, ticket), stream)

    def waits_of(self, stream: int, after) -> dict[int, int]:
        """The waits of a kernel queued on `stream` now that also waits for all work queued so far on the streams in
        `after`: the stream's own event waits, each stream in `after` up to now, and what those streams waited for."""
        waits = dict(self.waited.get(stream, {}))
        for other in after:
            if other != stream:
                self._merge(waits, self._through(other, self.driver.queued(other)), stream)
        return waits

    def _through(self, other: int, ticket: int) -> dict[int, int]:
        """What waiting for `other` up to `ticket` orders after: that, and what `other` had waited for."""
        return {**self.waited.get(other, {}), other: ticket}

    @staticmethod
    def _merge(into: dict, more: dict, stream: int) -> None:
        for other, ticket in more.items():
            if other != stream:
                into[other] = max(into.get(other, 0), ticket)

    def run_until(self, stream: int, ticket: int) -> None:
        """Run `stream`'s kernels up to `ticket`, in order; the streams each one waited for run first."""
        queue = self.queues.get(stream)
        while queue and queue[0].ticket <= ticket:
            kernel = queue.popleft()
            for other, upto in kernel.waits.items():
                self.driver.complete_stream(other, upto)
            self._run(kernel)

    def _run(self, kernel) -> None:
        for handle, lo, hi in kernel.extents:
            if kernel.write is not None:
                self.driver._write_physical(handle, lo, bytes([kernel.write]) * (hi - lo))
            if kernel.expect is not None:
                got = self.driver._read_physical(handle, lo, hi - lo)
                if got is not None and got.count(kernel.expect) != len(got):
                    wrong = next(b for b in got if b != kernel.expect)
                    self.hazards.append(
                        f"data race: {kernel.describe()} expected its bytes to hold {kernel.expect} but handle "
                        f"{handle} [{lo}, {hi}) holds {wrong}: another stream's kernel overwrote them")

    # ---- what the allocator asks of the driver (each returns None if safe, else the hazard's description)

    def _queued_on(self, test) -> object:
        for queue in self.queues.values():
            for kernel in queue:
                if test(kernel):
                    return kernel
        return None

    def on_map(self, va: int, size: int, handle: int) -> None:
        self.maps[va] = (size, handle)
        insort(self.starts, va)
        self.handle_vas.setdefault(handle, set()).add(va)

    def on_unmap(self, va: int, size: int) -> str | None:
        end = va + size
        busy = self._queued_on(lambda k: k.va < end and va < k.va + k.size)
        if busy is not None:
            return (f"unmap of 0x{va:x}+{size} with no synchronize since {busy.describe()} was queued: "
                    f"the kernel would fault")
        i = bisect_right(self.starts, va - 1)
        while i < len(self.starts) and self.starts[i] < end:
            start = self.starts.pop(i)
            _, handle = self.maps.pop(start)
            self.handle_vas[handle].discard(start)
        return None

    def on_release(self, handle: int) -> str | None:
        vas = self.handle_vas.get(handle)
        if vas:
            return (f"release of handle {handle} while it is still mapped at "
                    f"{', '.join(f'0x{v:x}' for v in sorted(vas))}")
        busy = self._queued_on(lambda k: any(e[0] == handle for e in k.extents))
        if busy is not None:
            return f"release of handle {handle} while {busy.describe()} still uses it"
        self.handle_vas.pop(handle, None)
        return None

    def on_free_va(self, va: int, size: int) -> str | None:
        i = bisect_right(self.starts, va - 1)
        if i < len(self.starts) and self.starts[i] < va + size:
            return f"address free of 0x{va:x}+{size} while a handle is still mapped at 0x{self.starts[i]:x}"
        return None


FAULT_NAMES = ("create_chunk", "release_chunk", "reserve", "free_va", "map", "unmap", "set_access", "synchronize",
               "event_record", "copy")
