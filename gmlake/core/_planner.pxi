# The allocator core, room "plan": what the run has shown decides where growth maps fine pages. A Planner (declared
# in _allocator.pxd) is chosen once when the allocator is made: the policy's cython_planner(), else the built-in
# the `plan` knob names (RunPlanner where set, else the base Planner, which plans nothing and leaves every decision
# to the knobs as before). It is asked only on a large request's miss path (stitch or grow), never on the cache
# hit, so a warm step that fits in what is mapped pays nothing for it. Included into _allocator.pyx.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _planner_of, _plan_request, _plan_fine_tail, _plan_new_high


cdef Planner _planner_of(policy):
    """The planner a policy chose: its cython_planner(), else RunPlanner where its `plan` knob is set, else the base
    Planner (no plan: every decision as the knobs say)."""
    planner = policy.cython_planner()
    if planner is None:
        return RunPlanner() if getattr(policy, "plan", False) else Planner()
    if not isinstance(planner, Planner):
        raise TypeError(f"gmlake: policy {policy.name}: cython_planner() must return a gmlake.core._allocator.Planner "
                        f"or None, got {type(planner).__name__}")
    return planner


cdef inline void _plan_request(Allocator self, size_t size) noexcept nogil:
    """A large request of `size` bytes reached the miss path (it stitches or grows): the planner sees it first, and
    what growth does for it next is decided for this request (Planner.request)."""
    self.planner.request = size
    self.planner.on_miss(self, size)


cdef inline bint _plan_fine_tail(Allocator self, size_t need) noexcept nogil:
    """Whether growth maps the last page it partly covers, of which it needs `need` bytes, in `tail_page` slots for
    the request being served (the knob's other conditions are checked by the caller: _cuts_tail)."""
    return self.planner.fine_tail(self, need)


cdef inline void _plan_new_high(Allocator self) noexcept nogil:
    """Reserved memory just reached a new high: the planner may look at the layout that got it there."""
    self.planner.on_new_high(self)


cdef inline size_t _calls_made(Allocator self) noexcept nogil:
    cdef size_t i, n = 0
    for i in range(<int>NUM_CALLS):
        n += self.st.calls[i]
    return n


cdef class Planner:
    """No plan: growth cuts every tail `tail_page` lets it cut, as without a planner; nothing is counted. Subclass it
    (RunPlanner below, or a policy's own, from Policy.cython_planner(), compiled against gmlake's .pxd files) to
    decide from the run."""

    cdef void on_miss(self, Allocator a, size_t size) noexcept nogil:
        pass

    cdef bint fine_tail(self, Allocator a, size_t need) noexcept nogil:
        return True

    cdef void on_new_high(self, Allocator a) noexcept nogil:
        pass

    def report(self, calls):
        """What the plan keeps and how it fared, for Allocator.stats()["plan"] (`calls`: the driver calls made so
        far): None where nothing is planned."""
        return None


cdef class RunPlanner(Planner):
    """Note [A plan learned from the run]: a handle costs the driver per handle, whatever its size (cuMemSetAccess
    ~24 us, cuMemUnmap ~17 us), so pages fine everywhere reach the free bytes that share pages with live blocks at
    ten times the growth's calls, and `tail_page` on every tail still misses the time goal on most traces. Fine pages
    pay only where a block's tail would otherwise leave a free run inside a page that a live block keeps, at the
    moment that decides memory: when reserved memory reaches a new high (an uncapped run never unmaps, so its peak
    is the last such moment, and the layout of the first steps is what later steps reuse).

    So the plan is learned there. Each time growth takes reserved memory to a new high, the planner walks the free
    blocks of the default pool's large class and notes every free run that shares its first or last page with a live
    block: the live block's size (in `tail_page` buckets) is a size whose tail fragments. The plan is that set of
    sizes. A later large request that must grow (the miss path: no free block or cached sBlock fits) is a plan hit
    where its size is in the set: growth maps its tail page in slots (Note [Fine pages at a block's tail]); a size
    not in the set is a plan miss and grows in whole pages, as the default does without a plan. Requests served from
    free memory never reach the planner: the cache hit is unchanged, and nothing live is ever moved or unmapped.

    The plan settles once `plan_settle` requests in a row reached the miss path without adding a size; then it stops
    looking (no walks) and only counts. It re-plans (looks again) on drift: a request larger than any seen before,
    or `plan_settle` misses after it settled. Counted: hits, misses, re-plans, and the driver calls made while
    settled (the target: close to none), reported by Allocator.stats()["plan"], `gmlake replay --json` and `gmlake
    explain`."""

    def __cinit__(self):
        self.settle_after = 64
        import os
        self.x_mode = int(os.environ.get("PLAN_MODE", "0"))
        self.x_maxtenths = int(os.environ.get("PLAN_MAXTENTHS", "10"))
        self.x_budget = int(os.environ.get("PLAN_BUDGET", "0"))
        self.x_minsize = int(os.environ.get("PLAN_MINSIZE", "0"))

    cdef void on_miss(self, Allocator a, size_t size) noexcept nogil:
        cdef size_t S = a.k.tail_page
        cdef bint known = S != 0 and self.sizes.count(round_up(size, S)) != 0
        if a.k.plan_settle:
            self.settle_after = a.k.plan_settle
        if S:
            self.seen[round_up(size, S)] += 1
        if known:
            self.hits += 1
        else:
            self.misses += 1
            self.misses_settled += self.settled
        if size > self.largest:
            if self.largest != 0 and self.settled:
                self._replan(a)
            self.largest = size
        elif self.settled and self.misses_settled >= self.settle_after:
            self._replan(a)
        if not self.settled:
            self.quiet += 1
            if self.quiet >= self.settle_after:
                self.settled = True
                self.settles += 1
                self.misses_settled = 0
                self.calls_at_settle = _calls_made(a)

    cdef void _replan(self, Allocator a) noexcept nogil:
        self.calls_settled += _calls_made(a) - self.calls_at_settle
        self.settled = False
        self.quiet = 0
        self.replans += 1

    cdef bint fine_tail(self, Allocator a, size_t need) noexcept nogil:
        cdef size_t S = a.k.tail_page
        cdef size_t C = a.k.expandable_page_large
        cdef size_t coarse, fine
        if self.request == 0:
            return False
        if self.request < self.x_minsize:
            return False
        if round_up(need, S) * 10 > C * self.x_maxtenths:
            return False
        if self.x_budget:
            fine = a.st.handles[<int>CALL_MAP]
            if fine * 100 > self.x_budget * (a.st.reserved // C + 1):
                return False
        if self.x_mode == 1:
            return True
        if self.x_mode == 4:
            return not self.settled
        if self.x_mode == 2:
            return self.seen[round_up(self.request, S)] >= 2
        if self.x_mode == 3:
            return self.seen[round_up(self.request, S)] <= 1
        return self.sizes.count(round_up(self.request, S)) != 0

    cdef void on_new_high(self, Allocator a) noexcept nogil:
        cdef FreeIndex* index
        cdef FreeIndex.iterator it
        cdef Block* f
        cdef size_t C, o, e, added = 0
        cdef size_t S = a.k.tail_page
        if self.settled or S == 0:
            return
        index = free_index(a, SIZE_LARGE)
        it = index.begin()
        while it != index.end():
            f = deref(it).second
            inc(it)
            if f.seg == NULL or f.seg.owner != NULL or f.seg.chunk_size <= S:
                continue
            C = f.seg.chunk_size
            o = f.addr - f.seg.va
            e = o + f.size
            if o % C and f.prev != NULL and f.prev.state == BLOCK_ALLOCATED and f.prev.sblock == NULL:
                added += self.sizes.insert(round_up(f.prev.size, S)).second
            if e % C and f.next != NULL and f.next.state == BLOCK_ALLOCATED and f.next.sblock == NULL:
                added += self.sizes.insert(round_up(f.next.size, S)).second
        if added:
            self.quiet = 0
            self.walks_adding += 1
        self.walks += 1

    def report(self, calls):
        settled_calls = self.calls_settled + (calls - self.calls_at_settle if self.settled else 0)
        return {"planner": type(self).__name__, "hits": self.hits, "misses": self.misses, "replans": self.replans,
                "settled": bool(self.settled), "settles": self.settles, "calls_after_settled": settled_calls,
                "planned_sizes": len(self.sizes), "largest_request": self.largest, "walks": self.walks}
