"""The switch for the buffer's compiled hot path (issue 17, must-have 6).

With numba installed, the next-use window's slide, the lookahead round (candidates, keys, both
rankings, the swap prefix), a step's hit/miss split and score bookkeeping, `apply` and the halo
index's search each run as one compiled loop (rudder.prefetch.kernels), fused so each array is
walked once, instead of ~40 numpy ops and two `torch.topk` per lookahead minibatch. The numpy path in buffer.py / nextuse.py stays and runs when
numba is missing or RUDDER_NO_JIT=1 (any value but "" or "0") is set in the environment.

Both paths give the same results, ties included: the rankings reproduce `torch.topk`'s CPU
selection exactly (aten/src/ATen/native/TopKImpl.h: std::partial_sort when k * 64 <= n, else
std::nth_element then std::sort of the first k - 1, over (key, index) pairs compared by key
only), with libstdc++'s algorithms transcribed step by step, so equal keys come out in the same
order. tests/test_kernels.py checks the ranking against torch.topk and the two paths against each
other (hits, rows, slot contents).

numba is imported when the first HaloBuffer is made (`warm`), not on import: a process without a
buffer does not pay for it, and one with a buffer pays before its first minibatch, not in it (a
fresh process: ~0.5 s to import numba, ~0.8 s for its first dispatch, ~0.1 s to load the kernels).
cache=True keeps the machine code in rudder/prefetch/__pycache__, so only the first process on a
host compiles (~30 s on the loaded 2-core VM; BENCHMARKS.md §11).
"""
from __future__ import annotations

import os

import numpy as np

_loaded: dict = {}


def kernels():
    """rudder.prefetch.kernels, or None: numba missing, or RUDDER_NO_JIT set (read once per
    process, as the buffer calls this ~10 times a minibatch; `refresh` reads it again)."""
    try:
        return _loaded["k"]
    except KeyError:
        pass
    k = None
    if os.environ.get("RUDDER_NO_JIT", "") in ("", "0"):
        try:
            from rudder.prefetch import kernels as k
        except ImportError:  # numba not installed
            k = None
    _loaded["k"] = k
    return k


def refresh() -> None:
    """Reads RUDDER_NO_JIT again (tests and A/B benchmarks switch paths within one process)."""
    _loaded.pop("k", None)


def warm() -> None:
    """Loads (or compiles) every kernel with the argument types the buffer passes, once per
    process, so no minibatch pays for it."""
    k = kernels()
    if k is None or _loaded.get("warm"):
        return
    i64, f64, hit = np.zeros(2, np.int64), np.zeros(2), np.zeros(2, bool)
    state, link = np.zeros((2, 4), np.int32), np.zeros(4, np.int32)
    k.split(i64, hit, i64, i64)
    k.record(f64, 0.5, i64[:0], f64, hit, i64[:0], True)
    k.nu_enter(state, link, i64[:1], 0, 0)
    k.nu_leave(state, link, i64[:1], 0)
    k.round_lookahead(state, 0, 2, i64, i64, f64, i64, False, 2, -1)
    k.apply(i64, i64, f64, f64, i64[:0], i64[:0])
    k.fill_counts(i64, f64, 0.5)
    k.topk_smallest(i64, 1)
    k.halo_search(i64, i64, i64, 0, 1)
    k.halo_map(np.zeros(2, np.int32), i64)
    for w in (np.uint64, np.uint32, np.uint16, np.uint8):  # buffer._words' widths
        k.copy_rows(np.zeros((2, 2), w), i64[:1], np.zeros((2, 2), w), i64[:1])
    _loaded["warm"] = True
