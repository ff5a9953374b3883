"""The compiled loops of the buffer's hot path (numba); imported only through rudder.prefetch.jit.

Each public kernel (no leading underscore) gives exactly what the numpy path of
rudder.prefetch.buffer / nextuse gives, ties included (see rudder.prefetch.jit). No bounds checks
(numba's default): the callers pass valid positions and slots, as the numpy path assumes.
"""
from __future__ import annotations

import numba
import numpy as np

NONE = (1 << 31) - 1  # nextuse.NONE (no later use); kept equal by tests/test_kernels.py
_FIRST, _FREQ, _LAST = 0, 1, 2  # nextuse's row columns
_S_THRESHOLD = 16  # libstdc++'s _S_threshold (introsort hands ranges this small to insertion sort)

_jit = numba.njit(cache=True, nogil=True)


# ---- libstdc++'s algorithms on (key, index) pairs, compared by key only ----------------------
# Each function is a transcription of its namesake in libstdc++'s bits/stl_heap.h and
# bits/stl_algo.h, with `comp(a, b)` = key[a] < key[b] (the callers negate keys for "largest").
# Pairs move together: key k[i] and index x[i].

@_jit
def _adjust_heap(k, x, first, hole, n, vk, vx):
    top = hole
    child = hole
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if k[first + child] < k[first + child - 1]:
            child -= 1
        k[first + hole] = k[first + child]
        x[first + hole] = x[first + child]
        hole = child
    if (n & 1) == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        k[first + hole] = k[first + child - 1]
        x[first + hole] = x[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2  # __push_heap
    while hole > top and k[first + parent] < vk:
        k[first + hole] = k[first + parent]
        x[first + hole] = x[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    k[first + hole] = vk
    x[first + hole] = vx


@_jit
def _pop_heap(k, x, first, last, result):
    vk, vx = k[result], x[result]
    k[result], x[result] = k[first], x[first]
    _adjust_heap(k, x, first, 0, last - first, vk, vx)


@_jit
def _make_heap(k, x, first, last):
    n = last - first
    if n < 2:
        return
    parent = (n - 2) // 2
    while True:
        _adjust_heap(k, x, first, parent, n, k[first + parent], x[first + parent])
        if parent == 0:
            return
        parent -= 1


@_jit
def _heap_select(k, x, first, middle, last):
    _make_heap(k, x, first, middle)
    for i in range(middle, last):
        if k[i] < k[first]:
            _pop_heap(k, x, first, middle, i)


@_jit
def _sort_heap(k, x, first, last):
    while last - first > 1:
        last -= 1
        _pop_heap(k, x, first, last, last)


@_jit
def _swap(k, x, a, b):
    k[a], k[b] = k[b], k[a]
    x[a], x[b] = x[b], x[a]


@_jit
def _move_median_to_first(k, x, result, a, b, c):
    if k[a] < k[b]:
        if k[b] < k[c]:
            _swap(k, x, result, b)
        elif k[a] < k[c]:
            _swap(k, x, result, c)
        else:
            _swap(k, x, result, a)
    elif k[a] < k[c]:
        _swap(k, x, result, a)
    elif k[b] < k[c]:
        _swap(k, x, result, c)
    else:
        _swap(k, x, result, b)


@_jit
def _partition_pivot(k, x, first, last):
    """__unguarded_partition_pivot: median of three to `first`, then Hoare's partition."""
    mid = first + (last - first) // 2
    _move_median_to_first(k, x, first, first + 1, mid, last - 1)
    lo, hi, p = first + 1, last, first
    while True:
        while k[lo] < k[p]:
            lo += 1
        hi -= 1
        while k[p] < k[hi]:
            hi -= 1
        if not lo < hi:
            return lo
        _swap(k, x, lo, hi)
        lo += 1


@_jit
def _linear_insert(k, x, last):
    """__unguarded_linear_insert."""
    vk, vx = k[last], x[last]
    nxt = last - 1
    while vk < k[nxt]:
        k[last], x[last] = k[nxt], x[nxt]
        last = nxt
        nxt -= 1
    k[last], x[last] = vk, vx


@_jit
def _insertion_sort(k, x, first, last):
    if first == last:
        return
    for i in range(first + 1, last):
        if k[i] < k[first]:
            vk, vx = k[i], x[i]
            for j in range(i, first, -1):  # move_backward
                k[j], x[j] = k[j - 1], x[j - 1]
            k[first], x[first] = vk, vx
        else:
            _linear_insert(k, x, i)


@_jit
def _lg(n):
    """std::__lg: floor(log2(n)), n > 0."""
    r = 0
    while n > 1:
        n >>= 1
        r += 1
    return r


@_jit
def _sort(k, x, first, last):
    """std::sort: __introsort_loop (its recursion on a stack: the ranges are disjoint, so the
    order they are done in changes nothing) then __final_insertion_sort."""
    if first == last:
        return
    stack = np.empty((2 * 64 + 8, 3), dtype=np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2] = first, last, 2 * _lg(last - first)
    top = 1
    while top:
        top -= 1
        f, l, depth = stack[top, 0], stack[top, 1], stack[top, 2]
        while l - f > _S_THRESHOLD:
            if depth == 0:
                _heap_select(k, x, f, l, l)  # __partial_sort(f, l, l)
                _sort_heap(k, x, f, l)
                break
            depth -= 1
            cut = _partition_pivot(k, x, f, l)
            stack[top, 0], stack[top, 1], stack[top, 2] = cut, l, depth
            top += 1
            l = cut
    if last - first > _S_THRESHOLD:  # __final_insertion_sort
        _insertion_sort(k, x, first, first + _S_THRESHOLD)
        for i in range(first + _S_THRESHOLD, last):
            _linear_insert(k, x, i)
    else:
        _insertion_sort(k, x, first, last)


@_jit
def _nth_element(k, x, first, nth, last):
    """std::nth_element: __introselect."""
    if first == last or nth == last:
        return
    depth = 2 * _lg(last - first)
    while last - first > 3:
        if depth == 0:
            _heap_select(k, x, first, nth + 1, last)
            _swap(k, x, first, nth)
            return
        depth -= 1
        cut = _partition_pivot(k, x, first, last)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(k, x, first, last)


@_jit
def topk_smallest(keys, n):
    """torch.topk(keys, n, largest=False, sorted=True).indices on the CPU, exactly (NaN-free keys)."""
    return _topk_pairs(keys.copy(), np.arange(keys.size), n)


@_jit
def _topk_pairs(k, x, n):
    """topk_smallest on pairs already made (keys k, indices x: both consumed)."""
    size = k.size
    if n > 0:
        if n * 64 <= size:
            _heap_select(k, x, 0, n, size)  # std::partial_sort
            _sort_heap(k, x, 0, n)
        else:
            _nth_element(k, x, 0, n - 1, size)
            _sort(k, x, 0, n - 1)
    return x[:n].copy()


# ---- the next-use window (rudder.prefetch.nextuse): one loop per minibatch entering / leaving --

@_jit
def nu_enter(state, link, pos, a, lo):
    # branch-free (whether a node has a use in the window is a coin toss to the predictor): a
    # node with none writes its link into its own entry, overwritten with NONE right after
    for i in range(pos.size):
        p = pos[i]
        prev = state[p, _LAST]
        link[prev if prev >= 0 else lo + i] = a  # a: the next use after the newest one
        link[lo + i] = NONE
        state[p, _LAST] = lo + i
        state[p, _FREQ] += 1
        state[p, _FIRST] = min(state[p, _FIRST], a)


@_jit
def nu_leave(state, link, pos, lo):
    for i in range(pos.size):
        p = pos[i]
        state[p, _FIRST] = link[lo + i]
        state[p, _FREQ] -= 1
        last = state[p, _LAST]
        state[p, _LAST] = -1 if last == lo + i else last  # its newest use was this one: none left


# ---- a step's bookkeeping (HaloBuffer.record) --------------------------------------------------

@_jit
def record(score, decay, hit_slots, miss_count, missed, missed_pos, count_misses):
    for i in range(score.size):
        score[i] *= decay
    for i in range(hit_slots.size):  # the same two roundings as the numpy path: (s * d) / d
        s = hit_slots[i]
        score[s] = score[s] / decay
    for i in range(missed_pos.size):
        p = missed_pos[i]
        if count_misses:
            miss_count[p] += 1.0
        missed[p] = True


# ---- the lookahead round (HaloBuffer.plan_lookahead with the incremental next use) -------------

@_jit
def round_lookahead(state, front, INF, slot_of, slot_pos, score, free_pos, any_node, n_max, empty_from):
    """(victim slots, newcomer positions), the k swaps of the round; see plan_lookahead. Next use
    of node p: min(first[p] - front + 1, INF) (INF: none in the window of INF - 1 minibatches).
    empty_from >= 0: the empty slots are exactly [empty_from, C) (HaloBuffer._empty_from)."""
    H = slot_of.size
    off = front - 1
    if any_node:  # every non-buffered node the window uses, ascending; the free ones first on ties
        free = np.zeros(H, dtype=np.bool_)
        for i in range(free_pos.size):
            free[free_pos[i]] = True
        m = 0
        for p in range(H):
            if slot_of[p] < 0 and state[p, _FREQ] != 0:
                m += 1
        cand = np.empty(m, dtype=np.int64)
        not_free = np.empty(m, dtype=np.int64)
        m = 0
        for p in range(H):
            if slot_of[p] < 0 and state[p, _FREQ] != 0:
                cand[m] = p
                not_free[m] = 0 if free[p] else 1
                m += 1
    else:  # this minibatch's misses the window uses again: distinct, ascending
        got = np.empty(free_pos.size, dtype=np.int64)
        m = 0
        for i in range(free_pos.size):  # branch-free, as in `split`
            p = free_pos[i]
            got[m] = p
            m += (slot_of[p] < 0) & (min(state[p, _FIRST] - off, INF) < INF)
        got = np.sort(got[:m])
        cand = np.empty(m, dtype=np.int64)
        m = 0
        for i in range(got.size):
            if i == 0 or got[i] != got[i - 1]:
                cand[m] = got[i]
                m += 1
        cand = cand[:m]
        not_free = np.zeros(m, dtype=np.int64)
    n = min(cand.size, slot_pos.size, n_max)
    if n <= 0:
        return cand[:0], cand[:0]
    F = INF
    ckey = np.empty(cand.size, dtype=np.int64)
    cnext = np.empty(cand.size, dtype=np.int64)
    lo_c = INF + 2
    for i in range(cand.size):
        p = cand[i]
        nu = min(np.int64(state[p, _FIRST]) - off, INF)
        cnext[i] = nu
        lo_c = min(lo_c, nu)
        ckey[i] = (nu * 2 + not_free[i]) * (F + 1) + (F - np.int64(state[p, _FREQ]))
    C = slot_pos.size
    if empty_from >= 0 and n <= C - empty_from:
        # empty slots rank first as victims and every candidate is used in the window, so the
        # n swaps fill n empty slots: the lowest ones, no pass over the C slots
        top = topk_smallest(ckey, n)
        newcomers = np.empty(n, dtype=np.int64)
        for i in range(n):
            newcomers[i] = cand[top[i]]
        return np.arange(empty_from, empty_from + n), newcomers
    vnext = _slot_next_use(state, off, INF, slot_of, slot_pos)
    nkey = np.empty(C, dtype=np.float64)  # -(vnext * 1e12 - score), exactly: the victims' key negated
    slots = np.empty(C, dtype=np.int64)  # the ranking's (key, index) pairs, made in the same pass
    hi_v = -1
    for s in range(C):
        slots[s] = s
        v = vnext[s]
        hi_v = max(hi_v, v)
        nkey[s] = score[s] - np.float64(v) * 1e12
    if lo_c >= hi_v:  # no newcomer is used sooner than any slot's node: the prefix is empty
        return cand[:0], cand[:0]
    victims = _topk_pairs(nkey, slots, n)
    top = topk_smallest(ckey, n)
    k = 0
    for i in range(n):
        k += cnext[top[i]] < vnext[victims[i]]
    newcomers = np.empty(k, dtype=np.int64)
    for i in range(k):
        newcomers[i] = cand[top[i]]
    return victims[:k].copy(), newcomers


# a buffer of at least 1/_SCAN_SHARE of the halo finds its slots' next use by a scan of the halo
# (sequential reads, ~4 ns a node) rather than a gather per slot (random reads, ~25 ns a slot:
# synth-bench, 2 machines, 0.5 of a 250k halo: 1.0 ms against 3.1)
_SCAN_SHARE = 6


@_jit
def _slot_next_use(state, off, INF, slot_of, slot_pos):
    """Each slot's node's next use, min(first - off, INF); INF + 1 for an empty slot."""
    C, H = slot_pos.size, slot_of.size
    if C * _SCAN_SHARE < H:  # a small buffer: gather its nodes' rows
        vnext = np.empty(C, dtype=np.int64)
        for s in range(C):
            p = slot_pos[s]
            v = min(np.int64(state[max(p, 0), _FIRST]) - off, INF)
            vnext[s] = v if p >= 0 else INF + 1
        return vnext
    vn = np.empty(C + 1, dtype=np.int64)  # entry C: where a node not buffered writes (no branch)
    vn[:C] = INF + 1
    for p in range(H):  # slot_of[p] = s exactly where slot_pos[s] = p (the buffer's invariant)
        s = slot_of[p]
        vn[s if s >= 0 else C] = min(np.int64(state[p, _FIRST]) - off, INF)
    return vn[:C]


# ---- a step's lookup split (HaloBuffer.split) ---------------------------------------------------

@_jit
def split(slot_of, is_halo, pos, ids):
    """(hit mask, hit slots, miss ids, missed halo positions) of one minibatch, in id order. One
    pass without branches: each element is written to all three outputs and only the count of
    the one it belongs to advances (a hit is a coin toss to the branch predictor). `pos` is a
    valid position wherever the halo is not empty (halo_positions' contract)."""
    m = ids.size
    hit = np.empty(m, dtype=np.bool_)
    hit_slots = np.empty(m, dtype=np.int64)
    miss_ids = np.empty(m, dtype=ids.dtype)
    missed_pos = np.empty(m, dtype=pos.dtype)
    a = b = c = 0
    if slot_of.size == 0:  # no halo: every id a miss, none a halo node
        miss_ids[:] = ids
        hit[:] = False
        return hit, hit_slots[:0], miss_ids, missed_pos[:0]
    for i in range(m):
        h = is_halo[i]
        s = slot_of[pos[i]]
        s = s if h else -1
        got = s >= 0
        hit[i] = got
        hit_slots[a] = s
        miss_ids[b] = ids[i]
        missed_pos[c] = pos[i]
        a += got
        b += not got
        c += h and not got
    return hit, hit_slots[:a], miss_ids[:b], missed_pos[:c]


# ---- replacement and counts (HaloBuffer.apply, size, stale_count) -------------------------------

@_jit
def apply(slot_pos, slot_of, score, miss_count, slots, new_pos):
    """The score hand-over of HaloBuffer.apply: every evicted node first, then every newcomer.
    Returns (how many of the slots were empty, the highest of them or -1)."""
    was_empty = 0
    top_empty = -1
    for i in range(slots.size):
        s = slots[i]
        old = slot_pos[s]
        if old >= 0:
            miss_count[old] = score[s]
            slot_of[old] = -1
        else:
            was_empty += 1
            top_empty = max(top_empty, s)
    for i in range(slots.size):
        s, p = slots[i], new_pos[i]
        score[s] = miss_count[p]
        slot_pos[s] = p
        slot_of[p] = s
    return was_empty, top_empty


@_jit
def fill_counts(slot_pos, score, threshold):
    """(filled slots, filled slots whose score is below `threshold`)."""
    filled = stale = 0
    for s in range(slot_pos.size):
        f = slot_pos[s] >= 0
        filled += f
        stale += f & (score[s] < threshold)
    return filled, stale


# ---- the halo index's bucketed search (HaloBuffer.halo_positions) ------------------------------

@_jit
def halo_search(off, halo, x, shift, steps):
    """(is_halo, position) of each id: the numpy path's binary search inside the id's bucket,
    the same `steps` iterations per id (so the same position where the id is not a halo node)."""
    H, nb, m = halo.size, off.size - 1, x.size
    is_halo = np.empty(m, dtype=np.bool_)
    pos = np.empty(m, dtype=np.int64)
    for i in range(m):
        v = x[i]
        bk = min(max(v >> shift, 0), nb - 1)
        lo, hi = off[bk], off[bk + 1]
        for _ in range(steps):
            mid = (lo + hi) >> 1
            right = (mid < hi) & (halo[min(mid, H - 1)] < v)
            lo, hi = (mid + 1, hi) if right else (lo, mid)
        p = min(lo, H - 1)
        pos[i] = p
        is_halo[i] = halo[p] == v
    return is_halo, pos


@_jit
def halo_map(pos_map, x):
    """(is_halo, position) of each id through the direct id -> position map (HaloBuffer's
    pos_map: int32, -1 where not halo); position 0 where not halo."""
    m, span = x.size, pos_map.size
    is_halo = np.empty(m, dtype=np.bool_)
    pos = np.empty(m, dtype=np.int64)
    for i in range(m):
        v = x[i]
        p = pos_map[v] if 0 <= v < span else -1
        is_halo[i] = p >= 0
        pos[i] = max(p, 0)
    return is_halo, pos


# ---- hit rows into the output (HaloBuffer.gather_into) ------------------------------------------

@_jit
def copy_rows(dst, rows, src, slots):
    """dst[rows[i]] = src[slots[i]], row by row (2-D integer views of the rows' bytes: a bit-exact
    copy): numpy's take + fancy assignment goes through a temporary of every row, twice the
    memory traffic of this one pass (~3x slower at synth-bench's ~9k hit rows of 512 bytes)."""
    for i in range(rows.size):
        r, s = rows[i], slots[i]
        for j in range(dst.shape[1]):
            dst[r, j] = src[s, j]
