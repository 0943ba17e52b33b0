# The policy seams (included by _allocator.pyx): how the core asks a policy that overrides a decision.
# Seams is what the core calls at every overridden seam; its base asks the Python hooks (_hooks.pxi: slow, with the
# GIL, under the allocator's lock), and a subclass in a researcher's own .pyx decides nogil (docs/policies.md).
# Whichever decided, the core checks the answer where it reads it (the _ask_* functions below): an answer out of
# range fails only that request, with the hook and the value named, and the built-in answer is used meanwhile.
# A Python hook's answer is checked for its type first (Note [Strict answers], _hooks.pxi).
# A hook's exception or bad answer is noted in the call's Failure (_note_hook_failure) and fails only that request.
#
# API (what the rest of the core calls; every other function here is this file's own):
#   _note_hook_failure, _bad_answer, _policy_error, _seams_of, _ask_place, _ask_stitch, _ask_layout, _ask_evict,
#   _ask_pressure


cdef void _note_hook_failure(Allocator self, Failure* why, object exc, str hook, bint bad_answer=False):
    """Fail the call in progress with the exception `hook` raised, or with its bad answer; the first in a call
    wins. The exception waits in this thread's hook_errors until failure() makes it the call's PolicyError
    (_policy_error), with the request's stream, read here while the lock is held."""
    if not why.hook_failed:
        why.hook_failed = True
        self.hook_errors.exc = exc
        self.hook_errors.hook = hook
        self.hook_errors.bad_answer = bad_answer
        self.hook_errors.stream = why.request.stream if why.request != NULL else 0


cdef void _bad_answer(Allocator self, Failure* why, str hook, str text) noexcept with gil:
    """Note a seam's answer out of range (from a Python hook or a Cython seam alike)."""
    _note_hook_failure(self, why, ValueError(text), hook, True)


cdef object _policy_error(Allocator self, size_t size, int64_t request):
    """The exception for a request a policy hook failed: a PolicyError naming the policy as its results do (its
    label: the user's class, not the built-in it subclasses), the hook, the request and what the hook did, caused
    by the hook's own exception (its traceback is the user's code). KeyboardInterrupt and SystemExit are not the
    policy's errors: they are returned as they are, so Ctrl-C interrupts a replay as it does without hooks."""
    exc = getattr(self.hook_errors, "exc", None)
    hook = getattr(self.hook_errors, "hook", "a hook")
    stream = getattr(self.hook_errors, "stream", 0)
    bad = getattr(self.hook_errors, "bad_answer", False)
    self.hook_errors.exc = None
    if exc is not None and not isinstance(exc, Exception):
        return exc
    label = self.policy.label()
    where = (f" at request #{request}" if request >= 0 else "") + f" (alloc of {size} bytes on stream {stream})"
    if bad:
        text = f"gmlake: policy {label} answered badly in {hook}{where}: {exc}"
    else:
        text = f"gmlake: policy {label} raised {type(exc).__name__} in {hook}{where}: {exc}"
    error = PolicyError(text, policy=label, hook=hook, request=request if request >= 0 else None, size=size,
                        stream=stream, bad_answer=bad)
    error.__cause__ = exc
    return error


# Each Policy hook and the Seams method (SeamBit) that decides it in Cython.
SEAM_HOOKS = {"choose_block": SEAM_PLACE, "should_split": SEAM_SPLIT, "choose_stitch": SEAM_STITCH,
              "allow_stitch": SEAM_ALLOW_STITCH, "segment_layout": SEAM_LAYOUT, "evict_victim": SEAM_EVICT,
              "relieve_pressure": SEAM_PRESSURE}


cdef Seams _seams_of(object policy, dict knobs):
    """The policy's Seams: its own Cython seams, or the base that asks its Python hooks. Which seams are asked goes
    into `knobs` (hook_*): only those the policy overrides, in Python or in Cython (never both: which would win?)."""
    seams = policy.cython_seams()
    if seams is None:
        seams = Seams()
    if not isinstance(seams, Seams):
        raise TypeError(f"gmlake: policy {policy.name}: cython_seams() must return a gmlake.core._allocator.Seams "
                        f"or None, got {type(seams).__name__}")
    flags = {}
    for hook, bit in SEAM_HOOKS.items():
        in_cython = bool(seams.overridden & bit)
        if in_cython and policy.overrides(hook):
            raise ValueError(f"gmlake: policy {policy.name} overrides {hook} both in Python and in its "
                             f"Cython seams ({type(seams).__name__})")
        flags[hook] = in_cython or policy.overrides(hook)
    knobs.update({"hook_allow_stitch": flags["allow_stitch"], "hook_split": flags["should_split"],
                  "hook_evict": flags["evict_victim"], "hook_place": flags["choose_block"],
                  "hook_stitch": flags["choose_stitch"], "hook_layout": flags["segment_layout"],
                  "hook_pressure": flags["relieve_pressure"]})
    return seams


# ---------------------------------------------------------------- the core reads a seam's answer here


cdef void _ask_place(Allocator self, Failure* why, int pool, size_t size, int64_t stream, Block** b,
                     SBlock** sb) noexcept nogil:
    """Placement seam: the policy's block must be a free block of `pool` (the default pool's) of at least `size`
    bytes that `stream` may use, its sBlock a cached one whose pieces are free for the stream; else the request
    fails and the built-in choice stands meanwhile."""
    cdef Block* builtin_b = b[0]
    cdef SBlock* builtin_sb = sb[0] if sb != NULL else NULL
    cdef FreeIndex* index = free_index(self, pool)
    cdef FreeIndex.iterator found
    cdef cmap[SBlockKey, SBlock*].iterator cached
    cdef SBlockKey key
    cdef Block* c
    cdef SBlock* s
    self.seams.place(self, why, pool, size, stream, b, sb)
    c = b[0]
    if c != NULL and c != builtin_b:
        found = index.find(key_of(c)) if c.seg != NULL else index.end()
        if found == index.end() or deref(found).second != c or c.size < size or (
                c.stream != stream and c.stream != ANY_STREAM):
            with gil:
                _bad_answer(self, why, "choose_block",
                            f"choose_block answered a block of {c.size} bytes at 0x{c.addr:x} on stream {c.stream}, "
                            f"not a free block of the {SIZE_CLASS_NAMES[pool]} pool of at least {size} bytes that stream "
                            f"{stream} may use")
            b[0] = builtin_b
            if sb != NULL:
                sb[0] = builtin_sb
            return
    if sb == NULL or sb[0] == NULL or sb[0] == builtin_sb:
        return
    s = sb[0]
    key.capacity = s.capacity
    key.serial = s.serial
    cached = self.sblock_cache.by_fit.find(key)
    if cached == self.sblock_cache.by_fit.end() or deref(cached).second != s or s.capacity < size or \
            not _sblock_fits(self, s, size, stream):
        with gil:
            _bad_answer(self, why, "choose_block",
                        f"choose_block answered sBlock {s.serial} of {s.capacity} bytes, not a cached sBlock of at "
                        f"least {size} bytes whose pieces are free for stream {stream}")
        b[0] = builtin_b
        sb[0] = builtin_sb


cdef void _ask_stitch(Allocator self, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                      vector[Piece]& pieces, size_t* remaining) noexcept nogil:
    """Stitching seam: the policy's pieces must be cut as _cut_pieces cuts them: each inside its own one of
    `blocks`, only the first starting inside a chunk, every one but the last ending on a chunk boundary (chunks map
    whole), and with `remaining` they carry `size` bytes; else the request fails and the built-in pieces stand."""
    cdef vector[Piece] builtin = pieces
    cdef size_t builtin_remaining = remaining[0], carried = 0, i, j, C
    cdef vector[size_t] used
    cdef Block* owner
    cdef const char* wrong = NULL
    self.seams.stitch(self, why, size, stream, blocks, pieces, remaining)
    for i in range(pieces.size()):
        owner = NULL
        for j in range(blocks.size()):
            if blocks[j].addr <= pieces[i].addr and pieces[i].addr + pieces[i].size <= blocks[j].addr + blocks[j].size:
                owner = blocks[j]
                for C in range(used.size()):
                    if used[C] == j:
                        wrong = "two pieces from one block"
                used.push_back(j)
                break
        if wrong != NULL:
            break
        if owner == NULL:
            wrong = "a piece outside the free blocks offered"
        elif pieces[i].size == 0:
            wrong = "an empty piece"
        elif i > 0 and _unit_floor(self, owner.seg, pieces[i].addr - owner.seg.va) != pieces[i].addr - owner.seg.va:
            wrong = "a piece after the first starting inside a chunk"
        elif (i + 1 < pieces.size() or remaining[0]) and \
                _unit_floor(self, owner.seg, pieces[i].addr + pieces[i].size - owner.seg.va) != \
                pieces[i].addr + pieces[i].size - owner.seg.va:
            wrong = "a piece before the last ending inside a chunk"
        if wrong != NULL:
            break
        carried += pieces[i].size
    if wrong == NULL and not pieces.empty() and carried + remaining[0] != size:
        wrong = "pieces and new bytes that do not add up to the request"
    if wrong == NULL:
        return
    with gil:
        _bad_answer(self, why, "choose_stitch", f"choose_stitch answered {pieces.size()} pieces and {remaining[0]} "
                                                f"new bytes for {size} bytes: {wrong.decode()}")
    pieces = builtin
    remaining[0] = builtin_remaining


cdef void _ask_layout(Allocator self, Failure* why, int pool, size_t size, int64_t stream, size_t* segment_size,
                      size_t* handle_size) noexcept nogil:
    """Growth seam: the policy's segment must hold `size` bytes, in whole handles of a non-zero multiple of the
    driver's granularity, and be no larger than the largest request (or the built-in's range); else the request
    fails and the built-in layout stands."""
    cdef size_t seg0 = segment_size[0], handle0 = handle_size[0], gran = self.driver.granularity
    cdef size_t bound = max(self.max_request, seg0)     # an expandable range may exceed the device
    cdef size_t seg, handle
    cdef const char* wrong = NULL
    self.seams.layout(self, why, pool, size, stream, segment_size, handle_size)
    seg = segment_size[0]
    handle = handle_size[0]
    if handle == 0:
        wrong = "handles of 0 bytes"
    elif handle % gran:
        wrong = "handles not a multiple of the driver's granularity"
    elif seg < size:
        wrong = "a segment smaller than the request"
    elif seg % handle:
        wrong = "a segment not a whole number of handles"
    elif seg > bound:
        wrong = "a segment larger than the largest request"
    if wrong == NULL:
        return
    with gil:
        _bad_answer(self, why, "segment_layout", f"segment_layout returned ({seg}, {handle}) for {size} bytes: "
                                                 f"{wrong.decode()} (granularity {gran}, at most {bound} bytes)")
    segment_size[0] = seg0
    handle_size[0] = handle0


cdef SBlock* _ask_evict(Allocator self, Failure* why, SBlock* lru_victim, int reason) noexcept nogil:
    """Eviction seam: the policy's victim must be a cached sBlock (or NULL: it declined); else the request fails
    and the least recently used goes meanwhile."""
    cdef SBlock* victim = self.seams.evict(self, why, lru_victim, reason)
    cdef cmap[SBlockKey, SBlock*].iterator cached
    cdef SBlockKey key
    if victim == NULL or victim == lru_victim:
        return victim
    key.capacity = victim.capacity
    key.serial = victim.serial
    cached = self.sblock_cache.by_fit.find(key)
    if cached != self.sblock_cache.by_fit.end() and deref(cached).second == victim:
        return victim
    with gil:
        _bad_answer(self, why, "evict_victim", f"evict_victim answered sBlock {victim.serial}, which is not cached")
    return lru_victim


cdef int _ask_pressure(Allocator self, Failure* why, size_t size, int64_t stream, int pool, int attempt,
                       int default) noexcept nogil:
    """Release-under-pressure seam: the policy's answer must be a PressureAction; else the request fails and the
    built-in's action is taken meanwhile."""
    cdef int action = self.seams.pressure(self, why, size, stream, pool, attempt, default)
    if PRESSURE_GIVE_UP <= action <= PRESSURE_REBACK:
        return action
    with gil:
        _bad_answer(self, why, "relieve_pressure", f"relieve_pressure answered action {action}, not one of "
                                                   f"{PRESSURE_GIVE_UP}-{PRESSURE_REBACK} (PressureAction)")
    return default


cdef class Seams:
    """The seams as the core asks them: this base asks the policy's Python hooks (see _allocator.pxd). Subclass it
    in Cython to decide a seam at C speed; docs/policies.md has the recipe, gmlake/policies/_seams_example.pyx an example.
    The core checks every answer where it reads it (_ask_*), so a subclass's answer out of range fails its request
    as a Python hook's does."""

    cdef void place(self, Allocator a, Failure* why, int pool, size_t size, int64_t stream, Block** b,
                    SBlock** sb) noexcept nogil:
        with gil:
            _hook_place(a, why, pool, size, stream, b, sb)

    cdef bint split(self, Allocator a, Failure* why, Block* b, size_t size, bint default) noexcept nogil:
        with gil:
            return _hook_split(a, why, b.size, size, b.seg.size_class, default)

    cdef void stitch(self, Allocator a, Failure* why, size_t size, int64_t stream, vector[Block*]& blocks,
                     vector[Piece]& pieces, size_t* remaining) noexcept nogil:
        with gil:
            _hook_stitch(a, why, size, stream, blocks, pieces, remaining)

    cdef bint allow_stitch(self, Allocator a, Failure* why, size_t size, int64_t stream, vector[Piece]& pieces,
                           size_t remaining) noexcept nogil:
        with gil:
            return _hook_allow_stitch(a, why, size, stream, pieces, remaining)

    cdef void layout(self, Allocator a, Failure* why, int pool, size_t size, int64_t stream, size_t* segment_size,
                     size_t* handle_size) noexcept nogil:
        with gil:
            _hook_layout(a, why, pool, size, stream, segment_size, handle_size)

    cdef SBlock* evict(self, Allocator a, Failure* why, SBlock* lru_victim, int reason) noexcept nogil:
        with gil:
            return _hook_evict(a, why, lru_victim, reason)

    cdef int pressure(self, Allocator a, Failure* why, size_t size, int64_t stream, int pool, int attempt,
                      int default) noexcept nogil:
        with gil:
            return _hook_pressure(a, why, size, stream, pool, attempt, default)
