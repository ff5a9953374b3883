"""The hindsight oracle: Belady's optimal replacement on a recorded trace.

Model (the same batched model as the buffer): minibatch t asks for a *set* of remote ids; a hit
is a requested halo node resident before t; every other remote id is pulled (a miss). After t
the cache may keep any `capacity` nodes of (resident ∪ t's pulled halo misses): those rows
crossed the network anyway, so keeping them costs nothing extra. Belady keeps the ones whose
next use is nearest (nodes never used again are dropped at once). This is demand-fetch Belady
with bypass: it fetches the fewest rows of any policy with this capacity, prefetching or not
(a prefetched row is one more row fetched; lazily fetching it on demand instead never costs
more), and it has the most hits of every policy that fetches only on demand (none, static,
LRU, LFU, S3-FIFO, SIEVE). A policy that pulls extra rows (fixed, lookahead) can buy hits
above it, but never fetch fewer rows in all.

Vectorised: the next use of every access comes from one stable sort of the trace by halo
node; then each minibatch is a mask lookup and one partition (top-k) over resident ∪ misses.

Two universes, at the same buffer memory (capacity rows): `halo` (the 1-hop halo, what the
buffer can hold today) and `all` (every remote node the trace records, 2+ hops included: the
unrestricted optimum, the yardstick for a buffer beyond the halo).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rudder.trace import Trace

Start = Literal["init", "empty"]
Universe = Literal["halo", "all"]
# what each result is, in words (CLI tables, JSON, run summary)
NAMES = {"halo": "Belady, halo only", "all": "Belady, all remote nodes"}


@dataclass
class OracleResult:
    capacity: int
    start: str
    hits: np.ndarray  # [S] buffer hits per minibatch
    remote_rows: np.ndarray  # [S] remote accesses per minibatch (halo or not)
    admitted: np.ndarray  # [S] nodes newly kept after each minibatch (no extra rows: misses)
    initial_fill: int  # rows of the starting contents (reported apart, as in training)
    extra: dict = field(default_factory=dict)
    universe: str = "halo"  # the nodes it could keep: halo | all (every remote node)
    universe_nodes: int = 0  # how many

    @property
    def total_hits(self) -> int:
        return int(self.hits.sum())

    @property
    def total_remote(self) -> int:
        return int(self.remote_rows.sum())

    @property
    def misses(self) -> int:
        """Rows fetched (Belady fetches nothing but misses)."""
        return self.total_remote - self.total_hits

    @property
    def hit_rate(self) -> float:
        r = self.total_remote
        return self.total_hits / r if r else 0.0

    def summary(self) -> dict:
        return {
            "policy": "belady",
            "name": NAMES[self.universe],
            "universe": self.universe,
            "universe_nodes": self.universe_nodes,
            "capacity": self.capacity,
            "start": self.start,
            "minibatches": int(self.hits.size),
            "remote_rows": self.total_remote,
            "hits": self.total_hits,
            "misses": self.misses,
            "fetched_rows": self.misses,
            "replaced_rows": 0,
            "admitted_rows": int(self.admitted.sum()),
            "initial_fill_rows": self.initial_fill,
            "hit_rate": self.hit_rate,
            **self.extra,
        }


def next_uses(trace: Trace) -> tuple[np.ndarray, np.ndarray, int]:
    """(next_mb [N], first_mb [H], INF): for every access, the minibatch of the same halo
    node's next access (INF = S if none or not a halo node); for every halo node, the
    minibatch of its first access (INF if never)."""
    S, H = trace.num_minibatches, trace.num_halo
    INF = S
    ok, pos = trace.halo_positions()
    mb = np.repeat(np.arange(S, dtype=np.int64), trace.sizes())
    nxt = np.full(trace.num_accesses, INF, dtype=np.int64)
    first = np.full(H, INF, dtype=np.int64)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return nxt, first, INF
    order = np.argsort(pos[idx], kind="stable")  # by node, then by time (stable)
    acc = idx[order]
    p, m = pos[acc], mb[acc]
    same = p[1:] == p[:-1]
    ns = np.full(acc.size, INF, dtype=np.int64)
    ns[:-1][same] = m[1:][same]
    nxt[acc] = ns
    starts = np.ones(acc.size, dtype=bool)
    starts[1:] = ~same
    first[p[starts]] = m[starts]
    return nxt, first, INF


def all_remote(trace: Trace) -> Trace:
    """The same trace with every remote node it records cacheable (halo ∪ accessed ids): the
    universe of a buffer not restricted to the 1-hop halo. Accesses, fill and capacity unchanged."""
    out = Trace(halo=trace.remote_nodes(), offsets=trace.offsets, ids=trace.ids,
                epoch=trace.epoch, init=trace.init, capacity=trace.capacity,
                feat_bytes=trace.feat_bytes, part_id=trace.part_id, num_parts=trace.num_parts,
                input_rows=trace.input_rows, meta=dict(trace.meta))
    return out


def belady(trace: Trace, capacity: int | None = None, start: Start = "init",
           universe: Universe = "halo") -> OracleResult:
    """Belady (demand fetch, bypass) over the whole trace. `start`: the trace's initial fill
    (`init`, as the run started) or an empty cache. `universe`: keep only halo nodes (`halo`)
    or any remote node (`all`), with the same capacity in rows."""
    C = trace.capacity if capacity is None else int(capacity)
    if C < 0:
        raise ValueError(f"capacity must be >= 0, got {C}")
    if start not in ("init", "empty"):
        raise ValueError(f"unknown start {start!r}; valid: init, empty")
    if universe not in NAMES:
        raise ValueError(f"unknown universe {universe!r}; valid: {', '.join(NAMES)}")
    if universe == "all":
        trace = all_remote(trace)
    S, H = trace.num_minibatches, trace.num_halo
    nxt, first, INF = next_uses(trace)
    ok, pos = trace.halo_positions()
    sizes = trace.sizes()
    hits = np.zeros(S, dtype=np.int64)
    admitted = np.zeros(S, dtype=np.int64)

    nu = first.copy()  # next use of each halo node after the current minibatch
    resident = np.zeros(H, dtype=bool)
    res = np.zeros(0, dtype=np.int64)

    def keep_best(cand: np.ndarray) -> np.ndarray:
        cand = cand[nu[cand] < INF]  # never used again: keeping it can never hit
        if cand.size > C:
            cand = cand[np.argpartition(nu[cand], C - 1)[:C]] if C > 0 else cand[:0]
        return cand

    init = trace.init_positions() if start == "init" else np.zeros(0, dtype=np.int64)
    initial_fill = int(min(init.size, C))
    if C > 0 and init.size:
        if init.size > C:  # a smaller capacity than the run's: keep the best of the fill
            init = init[np.argpartition(first[init], C - 1)[:C]]
        res = init
        resident[res] = True  # kept as filled (even if never used: it was fetched up front)

    off = trace.offsets
    for t in range(S):
        s, e = off[t], off[t + 1]
        m = ok[s:e]
        req = pos[s:e][m]
        hm = resident[req]
        hits[t] = np.count_nonzero(hm)
        nu[req] = nxt[s:e][m]
        if C == 0:
            continue
        new = req[~hm]
        keep = keep_best(np.concatenate([res, new]) if new.size else res)
        resident[res] = False
        resident[keep] = True
        admitted[t] = np.count_nonzero(resident[new])
        res = keep
    return OracleResult(C, start, hits, sizes.astype(np.int64), admitted, initial_fill,
                        universe=universe, universe_nodes=H)
