"""The switch for the buffer's compiled hot path (issue 17, must-have 6).

With numba installed, the next-use window's slide, the lookahead round (candidates, keys, both
rankings, the swap prefix) and a step's score bookkeeping each run as one compiled loop
(rudder.prefetch.kernels), fused so each array is walked once, instead of ~40 numpy ops and two
`torch.topk` per lookahead minibatch. The numpy path in buffer.py / nextuse.py stays and runs when
numba is missing or RUDDER_NO_JIT=1 (any value but "" or "0") is set in the environment.

Both paths give the same results, ties included: the rankings reproduce `torch.topk`'s CPU
selection exactly (aten/src/ATen/native/TopKImpl.h: std::partial_sort when k * 64 <= n, else
std::nth_element then std::sort of the first k - 1, over (key, index) pairs compared by key
only), with libstdc++'s algorithms transcribed step by step, so equal keys come out in the same
order. tests/test_kernels.py checks the ranking against torch.topk and the two paths against each
other (hits, rows, slot contents).

numba is imported on the first call, not with the buffer: a process that never records a step or
runs a round does not pay for it. cache=True keeps the machine code in rudder/prefetch/__pycache__,
so a fresh process loads it instead of compiling (BENCHMARKS.md §11 gives both times).
"""
from __future__ import annotations

import os

_loaded: dict = {}


def kernels():
    """rudder.prefetch.kernels, or None: numba missing, or RUDDER_NO_JIT set. Read per call, so a
    test can switch paths with the environment."""
    if os.environ.get("RUDDER_NO_JIT", "") not in ("", "0"):
        return None
    if "k" not in _loaded:
        try:
            from rudder.prefetch import kernels as k
        except ImportError:  # numba not installed
            k = None
        _loaded["k"] = k
    return _loaded["k"]
