# The policy's Python hooks (included by _allocator.pyx): what the base Seams asks (_seams.pxi) when a policy
# overrides a hook in Python. Each _hook_* function runs with the GIL, under the allocator's lock: it builds what the
# hook sees (views of free blocks and cached sBlocks, made lazily: LazyViews), calls the hook, checks the answer's
# type (Note [Strict answers]) and turns it back into the core's terms. A hook's exception or an answer of the wrong
# type is noted in the call's Failure (_note_hook_failure, _seams.pxi) and the built-in answer is used meanwhile;
# whether the answer is in range is checked where the core reads it (_ask_*, _seams.pxi), as for a Cython seam.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _hook_split, _hook_allow_stitch, _hook_evict, _hook_place, _hook_stitch, _hook_layout, _hook_pressure
from cpython.ref cimport Py_REFCNT
from cpython.pyport cimport PY_SSIZE_T_MAX

# Note [Strict answers]: a hook answers in Python's own types, and nothing else is taken: True or False (a bool,
# not None, 0 or "no") for should_split and allow_stitch; an int (not a bool) for an index, a size or a count;
# None only where the hook's docstring allows it. A forgotten `return` (None) or a truthy string would otherwise
# decide silently ("never split": thousands of OOMs that look like a result).
_new_tuple = tuple.__new__


cdef str _shown(object answer):
    """repr(answer) for a message, even where the answer's own __repr__ raises."""
    try:
        return repr(answer)
    except BaseException:
        return f"<a {type(answer).__name__}>"


cdef inline bint _is_index(object x, Py_ssize_t n):
    """Whether x is an index into n items: an int, not a bool (Note [Strict answers])."""
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n


# ---------------------------------------------------------------- what a hook sees


cdef class LazyViews:
    """A read-only sequence of the free blocks (FreeBlock) and then the cached sBlocks (CachedSBlock) a hook may
    choose from, each view built when first read. A hook that only returns its `default` builds none.

    Note [Views built on read]: building every candidate's view costs a choose_block far more than the hook itself
    takes (a request has many candidates, many of them sBlocks with their pieces); and finding which cached sBlocks fit (a lookup per piece, for every cached sBlock
    big enough) was the larger part of what remained. So views are built on read, and the cached sBlocks that fit
    are found only as far as a read (or `len`) needs. Reads happen while the hook runs, so they see the moment of
    the decision. When the hook returns, the sequence is dropped (the common case: nothing else refers to it) or,
    where the hook kept it, completed then, so a kept sequence is a plain copy, as the views always were.
    tests/test_seam_answers.py measures a replay with such a hook."""
    cdef Allocator a
    cdef vector[Block*] blocks
    cdef vector[SBlock*] sblocks
    cdef list items                 # views built so far (None: not yet), once anything was read
    # The cached sBlocks of at least `size` bytes not yet looked at (those that fit `stream` go to sblocks).
    cdef bint walking
    cdef cmap[SBlockKey, SBlock*].iterator walk
    cdef size_t size
    cdef int64_t stream

    cdef void _walk_to(self, Py_ssize_t count):
        """Find cached sBlocks that fit until `count` are known, or all are."""
        while self.walking and <Py_ssize_t>self.sblocks.size() < count:
            if self.walk == self.a.sblock_cache.by_fit.end():
                self.walking = False
                break
            if _sblock_fits(self.a, deref(self.walk).second, self.size, self.stream):
                self.sblocks.push_back(deref(self.walk).second)
            inc(self.walk)

    cdef Py_ssize_t _len(self):
        if self.a is None:              # closed: what the hook kept, built
            return len(self.items) if self.items is not None else 0
        self._walk_to(PY_SSIZE_T_MAX)
        return self.blocks.size() + self.sblocks.size()

    def __len__(self) -> int:
        return self._len()

    cdef object _item(self, Py_ssize_t i):
        """The view at i, where i < _len()."""
        cdef Block* b
        cdef Py_ssize_t n = self._len()
        if self.items is None:
            self.items = [None] * n
        view = self.items[i]
        if view is None:
            if i < <Py_ssize_t>self.blocks.size():
                b = self.blocks[i]
                view = _new_tuple(FreeBlock, (b.addr, b.size, b.stream, b.seg.serial, b.addr - b.seg.va))
            else:
                view = _cached_view(self.a, self.sblocks[i - self.blocks.size()])
            self.items[i] = view
        return view

    def __getitem__(self, index):
        cdef Py_ssize_t n = self._len(), i
        if isinstance(index, slice):
            return [self._item(j) for j in range(*index.indices(n))]
        i = index
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("candidate index out of range")
        return self._item(i)

    def __iter__(self):
        cdef Py_ssize_t i
        for i in range(self._len()):
            yield self._item(i)

    def __reversed__(self):
        cdef Py_ssize_t i
        for i in reversed(range(self._len())):
            yield self._item(i)

    def __contains__(self, value) -> bool:
        return any(v == value for v in self)

    def index(self, value, start: int = 0, stop: int | None = None) -> int:
        for i in range(*slice(start, stop).indices(self._len())):
            if self._item(i) == value:
                return i
        raise ValueError(f"{value!r} is not among the candidates")

    def count(self, value) -> int:
        return sum(1 for v in self if v == value)

    def __eq__(self, other) -> bool:
        if isinstance(other, LazyViews):
            other = list(other)
        return isinstance(other, (list, tuple)) and list(self) == list(other)

    def __hash__(self):
        raise TypeError("unhashable type: 'LazyViews'")

    def __repr__(self) -> str:
        return repr(list(self))

    cdef void _close(self, Py_ssize_t refs):
        """The hook returned: where it kept the sequence (more references than the `refs` it had before the hook
        was called), build every view now; then let go of the allocator's structures."""
        cdef Py_ssize_t i, n
        if Py_REFCNT(self) > refs:
            n = self._len()
            for i in range(n):
                self._item(i)
            if self.items is None:
                self.items = []
        self.walking = False
        self.a = None
        self.blocks.clear()
        self.sblocks.clear()


from collections.abc import Sequence as _Sequence
_Sequence.register(LazyViews)


cdef LazyViews _views(Allocator self):
    cdef LazyViews views = LazyViews.__new__(LazyViews)
    views.a = self
    return views


cdef object _cached_view(Allocator self, SBlock* sb):
    cdef size_t i
    return _new_tuple(CachedSBlock, (sb.serial, sb.va, sb.va_size, sb.capacity,
                      tuple([(sb.pieces[i].addr, sb.pieces[i].size) for i in range(sb.pieces.size())]),
                      sb.chunks.size(), sb.stream, self.sblock_cache.tick - sb.last_use if sb.alloc == NULL else 0,
                      _sblock_all_free(self, sb)))


cdef class _FreeBlockWalk:
    """The walk behind AllocatorState.free_blocks, run on its first read (inside the hook, the lock held)."""
    cdef Allocator a
    cdef int64_t stream

    def __call__(self):
        return tuple(_free_blocks(self.a, SIZE_SMALL, 0, self.stream, NULL)
                     + _free_blocks(self.a, SIZE_LARGE, 0, self.stream, NULL))


cdef object _with_state(Allocator self, Failure* why, int64_t stream, object hook, tuple args):
    """hook(*args, state): the read-only view a hook receives (built only when a hook is called; the caller holds
    the lock). Its free_blocks are walked only if the hook reads them, and cannot be after it returns."""
    cdef _FreeBlockWalk walk = _FreeBlockWalk.__new__(_FreeBlockWalk)
    walk.a = self
    walk.stream = stream
    blocks = FreeBlocks(walk)
    cdef uint64_t pool = why.request.target.id if why.request != NULL and why.request.target != NULL else 0
    state = _new_tuple(AllocatorState, (self.st.reserved, self.st.allocated, self.st.active,
                                        None if self.limit_bytes == NO_LIMIT else self.limit_bytes,
                                        self.driver.capacity, self.sblock_cache.cached(), stream, blocks, pool))
    try:
        return hook(*args, state)
    finally:
        blocks._expire()


cdef list _free_blocks(Allocator self, int pool, size_t at_least, int64_t stream, vector[Block*]* out):
    """Free blocks of `pool` of at least `at_least` bytes that `stream` may use (its own, then those of no
    stream, each in best-fit order), as FreeBlocks; their pointers go to `out` where given (then no views are
    built: the caller's LazyViews builds them on read)."""
    cdef FreeIndex* index = free_index(self, pool)
    cdef FreeIndex.iterator it
    cdef Block* b
    cdef int64_t s
    cdef bint any_found = False
    found = [] if out == NULL else None
    for s in (stream, ANY_STREAM):
        if s == ANY_STREAM and stream == ANY_STREAM and any_found:
            break
        it = index.lower_bound(free_key(s, at_least))
        while it != index.end() and deref(it).first.stream == s:
            b = deref(it).second
            any_found = True
            if out != NULL:
                out.push_back(b)
            else:
                found.append(_new_tuple(FreeBlock, (b.addr, b.size, b.stream, b.seg.serial, b.addr - b.seg.va)))
            inc(it)
    return found


# ---------------------------------------------------------------- the Python hooks (the base Seams asks these)


cdef bint _hook_split(Allocator self, Failure* why, size_t block_size, size_t size, int pool, bint default) noexcept:
    try:
        answer = self.policy.should_split(block_size, size, SIZE_CLASS_NAMES[pool], default)
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "should_split")
        return default
    if answer is True or answer is False:
        return answer
    _bad_answer(self, why, "should_split", f"should_split returned {_shown(answer)}, not a bool (True or False)")
    return default


cdef bint _hook_allow_stitch(Allocator self, Failure* why, size_t size, int64_t stream, vector[Piece]& pieces,
                             size_t remaining) noexcept:
    cdef size_t i
    try:
        answer = self.policy.allow_stitch(size, stream, [pieces[i].size for i in range(pieces.size())], remaining)
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "allow_stitch")
        return True
    if answer is True or answer is False:
        return answer
    _bad_answer(self, why, "allow_stitch", f"allow_stitch returned {_shown(answer)}, not a bool (True or False)")
    return True


cdef SBlock* _hook_evict(Allocator self, Failure* why, SBlock* lru_victim, int reason) noexcept:
    """Eviction seam: ask the policy which cached sBlock to evict (they are listed oldest first); NULL: it
    declined."""
    cdef LazyViews cached = _views(self)
    cdef pair[uint64_t, SBlock*] entry
    cdef SBlock* victim = lru_victim
    cdef Py_ssize_t n, refs
    for entry in self.sblock_cache.by_age:
        cached.sblocks.push_back(entry.second)
    n = cached.sblocks.size()
    refs = Py_REFCNT(cached)
    try:
        index = _with_state(self, why, lru_victim.stream, self.policy.evict_victim, (cached, EVICT_REASONS[reason]))
        if index is None:
            victim = NULL
        elif _is_index(index, n):
            victim = cached.sblocks[<Py_ssize_t>index]
        else:
            _bad_answer(self, why, "evict_victim", f"evict_victim returned {_shown(index)}, not None or an index "
                                                   f"into {n} cached sBlocks")
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "evict_victim")
    cached._close(refs)
    return victim


cdef void _hook_place(Allocator self, Failure* why, int pool, size_t size, int64_t stream, Block** b,
                      SBlock** sb) noexcept:
    """Placement seam: the policy picks among the free blocks and cached sBlocks that fit (or none); `b` and
    `sb` hold the built-in choice on entry and the policy's on return (unchanged if the hook fails)."""
    cdef LazyViews candidates = _views(self)
    cdef cmap[SBlockKey, SBlock*].iterator it
    cdef SBlockKey key
    cdef Py_ssize_t i, n, chosen, default = -1, refs
    _free_blocks(self, pool, size, stream, &candidates.blocks)
    if sb != NULL:
        key.capacity = size
        key.serial = 0
        candidates.walk = self.sblock_cache.by_fit.lower_bound(key)
        candidates.walking = True
        candidates.size = size
        candidates.stream = stream
    for i in range(<Py_ssize_t>candidates.blocks.size()):
        if b[0] == candidates.blocks[i]:
            default = i
    if sb != NULL and sb[0] != NULL:
        # the built-in's sBlock fits, so the walk meets it; only the sBlocks before it are looked at
        while candidates.walking and (candidates.sblocks.empty() or candidates.sblocks.back() != sb[0]):
            candidates._walk_to(candidates.sblocks.size() + 1)
        if not candidates.sblocks.empty() and candidates.sblocks.back() == sb[0]:
            default = candidates.blocks.size() + candidates.sblocks.size() - 1
    refs = Py_REFCNT(candidates)
    try:
        answer = _with_state(self, why, stream, self.policy.choose_block,
                             (size, stream, SIZE_CLASS_NAMES[pool], candidates, None if default < 0 else default))
        if isinstance(answer, int) and not isinstance(answer, bool) and answer >= 0:
            candidates._walk_to(answer - <Py_ssize_t>candidates.blocks.size() + 1)
        n = candidates.blocks.size() + candidates.sblocks.size()
        if answer is None or _is_index(answer, n):
            b[0] = NULL
            if sb != NULL:
                sb[0] = NULL
            if answer is not None:
                chosen = answer
                if chosen < <Py_ssize_t>candidates.blocks.size():
                    b[0] = candidates.blocks[chosen]
                else:
                    sb[0] = candidates.sblocks[chosen - candidates.blocks.size()]
        else:
            _bad_answer(self, why, "choose_block", f"choose_block returned {_shown(answer)}, not None or an index "
                                                   f"into {candidates._len()} candidates")
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "choose_block")
    candidates._close(refs)


cdef void _hook_stitch(Allocator self, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                       vector[Piece]& pieces, size_t* remaining) noexcept:
    """Stitching seam: the policy picks which of `blocks` to stitch, in order; pieces are cut from them as the
    built-in cuts its own (see _cut_pieces). `pieces` and `remaining` hold the built-in choice on entry."""
    cdef LazyViews free = _views(self)
    cdef vector[Block*] chosen
    cdef size_t i, j
    cdef Py_ssize_t n = blocks.size(), refs
    free.blocks = blocks
    default = []
    for i in range(pieces.size()):
        for j in range(blocks.size()):
            if blocks[j].addr <= pieces[i].addr < blocks[j].addr + blocks[j].size:
                default.append(j)
                break
    refs = Py_REFCNT(free)
    try:
        answer = _with_state(self, why, stream, self.policy.choose_stitch, (size, stream, free, default))
        if not isinstance(answer, (list, tuple)):
            _bad_answer(self, why, "choose_stitch", f"choose_stitch returned {_shown(answer)}, not a list of "
                                                    f"indices into {n} blocks")
        elif len(set(answer)) != len(answer) or not all(_is_index(x, n) for x in answer):
            _bad_answer(self, why, "choose_stitch", f"choose_stitch returned {_shown(answer)}, not distinct "
                                                    f"indices into {n} blocks")
        else:
            for x in answer:
                chosen.push_back(blocks[<size_t>x])
            pieces.clear()
            remaining[0] = _cut_pieces(self, chosen, size, pieces)
            if pieces.empty():
                remaining[0] = size
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "choose_stitch")
    free._close(refs)


cdef void _hook_layout(Allocator self, Failure* why, int pool, size_t size, int64_t stream, size_t* segment_size,
                       size_t* handle_size) noexcept:
    """Growth seam: the policy lays out a new segment for `size` bytes as (segment bytes, handle bytes); the
    sizes are checked where the core reads them (_ask_layout), whoever decided."""
    try:
        answer = _with_state(self, why, stream, self.policy.segment_layout,
                             (size, stream, SIZE_CLASS_NAMES[pool], (segment_size[0], handle_size[0])))
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "segment_layout")
        return
    if not isinstance(answer, tuple) or len(answer) != 2 or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64 for x in answer):
        _bad_answer(self, why, "segment_layout", f"segment_layout returned {_shown(answer)}, not a tuple "
                                                 f"(segment bytes, handle bytes) of two ints")
        return
    segment_size[0] = answer[0]
    handle_size[0] = answer[1]


cdef int _hook_pressure(Allocator self, Failure* why, size_t size, int64_t stream, int pool, int attempt,
                        int default) noexcept:
    """Release-under-pressure seam: the policy names the next action (PRESSURE_ACTIONS), or None to give up."""
    try:
        builtin = None if default == PRESSURE_GIVE_UP else PRESSURE_ACTIONS[default - 1]
        answer = _with_state(self, why, stream, self.policy.relieve_pressure,
                             (size, stream, SIZE_CLASS_NAMES[pool], attempt, builtin))
    except BaseException as exc:
        _note_hook_failure(self, why, exc, "relieve_pressure")
        return default
    if answer is None:
        return PRESSURE_GIVE_UP
    if isinstance(answer, str) and answer in PRESSURE_ACTIONS:
        return PRESSURE_ACTIONS.index(answer) + 1
    _bad_answer(self, why, "relieve_pressure", f"relieve_pressure returned {_shown(answer)}, not None or one of "
                                               f"{', '.join(PRESSURE_ACTIONS)}")
    return default
