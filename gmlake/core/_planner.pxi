# The allocator core, room "plan": what the run shows decides where growth maps fine pages. A Planner (declared in
# _allocator.pxd) is chosen once when the allocator is made: the policy's cython_planner(), else RunPlanner where
# the `plan` knob is set, else the base Planner, which plans nothing and leaves every decision to the knobs as before.
# It is asked only on a large request's miss path (stitch or grow) and when growth takes reserved memory to a new
# high, never on the cache hit: a step that fits in what is mapped pays nothing for it. Included into _allocator.pyx.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _planner_of, _plan_request, _plan_fine_tail, _plan_new_high, RunPlanner


cdef Planner _planner_of(policy):
    """The planner a policy chose: its cython_planner(), else RunPlanner where its `plan` knob is set, else the base
    Planner (no plan)."""
    planner = policy.cython_planner()
    if planner is None:
        return RunPlanner() if getattr(policy, "plan", False) else Planner()
    if not isinstance(planner, Planner):
        raise TypeError(f"gmlake: policy {policy.name}: cython_planner() must return a gmlake.core._allocator.Planner "
                        f"or None, got {type(planner).__name__}")
    return planner


cdef inline void _plan_request(Allocator self, size_t size) noexcept nogil:
    """A large request of `size` bytes reached the miss path (it stitches or grows): the planner sees it first, and
    what growth maps for it next is decided for this request (Planner.request)."""
    self.planner.request = size
    self.planner.on_miss(self, size)


cdef inline bint _plan_fine_tail(Allocator self, size_t need, size_t page) noexcept nogil:
    """Whether growth maps the last `page`-byte page it partly covers, of which it needs `need` bytes, in `tail_page`
    slots for the request being served (the knob's own conditions are checked by the caller)."""
    return self.planner.fine_tail(self, need, page)


cdef inline void _plan_new_high(Allocator self) noexcept nogil:
    """Growth just took reserved memory to a new high."""
    self.planner.on_new_high(self)


cdef inline uint64_t _calls_made(Allocator self) noexcept nogil:
    cdef uint64_t n = 0
    cdef int i
    for i in range(<int>NUM_CALLS):
        n += self.st.calls[i]
    return n


cdef class Planner:
    """No plan: growth cuts every tail `tail_page` lets it cut, as without a planner, and nothing is counted. Subclass
    it (RunPlanner below, or a policy's own from Policy.cython_planner(), compiled against gmlake's .pxd files) to
    decide from the run."""

    cdef void on_miss(self, Allocator a, size_t size) noexcept nogil:
        pass

    cdef bint fine_tail(self, Allocator a, size_t need, size_t page) noexcept nogil:
        return True

    cdef void on_new_high(self, Allocator a) noexcept nogil:
        pass

    def report(self, calls):
        """What the plan keeps and how it fared, for Allocator.stats()["plan"] (`calls`: the driver calls made so
        far): None where nothing is planned."""
        return None


cdef class RunPlanner(Planner):
    """Note [A plan learned from the run]: the driver charges per handle, whatever its size (cuMemSetAccess ~24 us,
    cuMemUnmap ~17, cuMemCreate ~10), so pages fine everywhere reach the free bytes that share pages with live blocks
    at about ten times the growth's calls, and `tail_page` on every tail still misses the replay time goal on most
    bundled traces. The planner decides where fine pages pay, and watches the run to say when its layout settled.

    What it decides: growth maps a block's last page in `tail_page` slots only where the block covers at least one
    whole page and its tail needs at most `plan_tail_share` percent of that page. A large block's tail then costs a
    few handles and leaves most of a page unmapped instead of free beside live bytes (Note [Fine pages at a block's
    tail]); a block smaller than a page, or a tail that fills most of its page, grows whole pages as without a plan:
    cutting those maps nearly a page's worth of slots, one handle each, for little memory (the next block grown
    there maps the rest of the page slot by slot). In replay (`python -m bench plan-goals`) this rule met the memory
    goal on more tuning traces than the default without a plan, at no time goal lost; restricting it to sizes the
    run showed (the sizes of live blocks sharing a page with a free run at each new high of reserved memory, or
    sizes seen twice), or to the run's first steps, met fewer goals (docs/benchmarks.md, "Where fine pages pay").

    What it watches: each large request on the miss path is a plan hit where its size (in `tail_page` buckets) was
    seen there before, else a miss (a size the run had not shown). The plan settles once `plan_settle` requests in a
    row reached the miss path with sizes seen before; it re-plans on drift: a request larger than any before, or
    `plan_settle` misses once settled. Counted: hits, misses, re-plans, new highs of reserved memory after it
    settled, and the driver calls made while settled (a warm step's calls: the target is none). Requests served
    from free memory never reach the planner, and nothing live is ever moved or unmapped. Allocator.stats()["plan"],
    `gmlake replay --json` and `gmlake explain` report them."""

    cdef void on_miss(self, Allocator a, size_t size) noexcept nogil:
        cdef size_t bucket = round_up(size, a.k.tail_page) if a.k.tail_page else size
        cdef bint known = self.seen.count(bucket) != 0
        if known:
            self.hits += 1
            self.quiet += 1
        else:
            self.misses += 1
            self.quiet = 0
            self.seen.insert(bucket)
            if self.settled:
                self.misses_settled += 1
        if self.settled and (size > self.largest or self.misses_settled >= a.k.plan_settle):
            self.calls_settled += _calls_made(a) - self.calls_at_settle
            self.settled = False
            self.replans += 1
            self.quiet = 0
        if size > self.largest:
            self.largest = size
        if not self.settled and self.quiet >= a.k.plan_settle:
            self.settled = True
            self.settles += 1
            self.misses_settled = 0
            self.calls_at_settle = _calls_made(a)

    cdef bint fine_tail(self, Allocator a, size_t need, size_t page) noexcept nogil:
        return self.request >= page and round_up(need, a.k.tail_page) * 100 <= page * a.k.plan_tail_share

    cdef void on_new_high(self, Allocator a) noexcept nogil:
        if self.settled:
            self.highs_settled += 1

    def report(self, calls):
        return {"planner": type(self).__name__, "hits": self.hits, "misses": self.misses, "replans": self.replans,
                "settled": bool(self.settled), "settles": self.settles,
                "calls_after_settled": self.calls_settled + (calls - self.calls_at_settle if self.settled else 0),
                "new_highs_after_settled": self.highs_settled, "sizes_seen": self.seen.size(),
                "largest_request": self.largest}
