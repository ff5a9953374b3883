"""HaloBuffer: the persistent per-trainer buffer of remote ("halo") node features.

Mechanism only (MassiveGNN's, faithful to SPEC.md); *when* to replace is a policy's call.
Memory is bounded by the halo size H, never the graph size:
  halo       [H]  sorted halo node ids
  pos_map    [span] int32, id -> halo position (-1: not halo), where the ids below the largest
                  halo id number at most MAP_SPAN_PER_HALO x H (partitioned graphs' dense ids):
                  an id's position is one gather (~6x faster than the search below at 250k halo)
  bucket_off [<=2H+2] otherwise: start of each id bucket (id >> shift) in `halo`; an id's halo
                  position is found inside its bucket of ~1-4 entries, in O(1) expected gathers
  slot_of    [H]  halo position -> buffer slot (-1: not buffered)        O(1) slot lookup
  slot_pos   [C]  buffer slot -> halo position (-1: empty slot)
  feats      [C, D] the buffered feature rows, on `device` (the training device)
  score      [C]  eviction score: x(1-alpha) per minibatch, a hit skips that minibatch's decay
  miss_count [H]  times a non-buffered halo node was sampled
  missed, missed_before [H] bool: halo nodes missed in the open metrics window / the window
                   before (the set-level drift of the misses: `roll_misses`)
Everything is array ops over whole minibatches; there is no per-node Python loop. The index
tensors are CPU tensors; the hot path (lookup, bookkeeping, the lookahead round, `apply`) works
on their numpy views (`.numpy()`: the same memory), which cost less dispatch per op than torch's
at a minibatch's few thousand ids; callers still get torch tensors.

Only the rows live on the training device: a hit is served there and never crosses PCIe; slot
numbers go over, and rows only as a newcomer's (from the rows pulled anyway). The index (every
other tensor) stays on the CPU, beside the sampler that makes the ids and the pull that needs the
misses. On a GPU it would cost a copy of the ids in, one kernel per op (~60 per minibatch,
a few hundred with a lookahead round, as last counted in torch ops) and a copy of the misses out
before the pull: maybe faster than the CPU at benchmark scale, not measured yet (BENCHMARKS.md,
section 8).
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from rudder.prefetch import jit
from rudder.prefetch.nextuse import WindowNextUse, next_use_scratch
from rudder.prefetch.remote_index import RemoteIndex

UNIVERSES = ("halo", "remote")  # what the buffer may hold: the 1-hop halo, or any remote id


class HaloBuffer:
    incremental_next_use = True  # False: the round computes next use from scratch (tests compare)
    # the direct id -> position map when its span is at most this many ids per halo node: 4 bytes
    # an id, so at most 32 bytes per halo node (the bucket index it replaces takes ~16, the
    # per-node arrays ~50); 0: always the bucketed search (tests compare the two)
    MAP_SPAN_PER_HALO = 8

    def __init__(
        self,
        halo_ids: torch.Tensor,
        capacity: int,
        feat_dim: int = 0,
        *,
        alpha: float = 0.05,
        period: int = 25,
        dtype: torch.dtype = torch.float32,
        store_features: bool = True,
        device: torch.device | str = "cpu",
        universe: str = "halo",
        max_nodes: int | None = None,
        id_bound: int | None = None,
    ):
        if universe not in UNIVERSES:
            raise ValueError(f"unknown universe {universe!r}; valid: {', '.join(UNIVERSES)}")
        self.universe = universe
        self.num_halo = int(torch.unique(halo_ids).numel())
        self.index: RemoteIndex | None = None
        self._held: torch.Tensor = _EMPTY  # the current minibatch's positions (remote universe)
        if universe == "halo":
            self.halo = torch.unique(halo_ids.to(torch.int64))  # sorted
            self._build_index()
        else:  # every remote id sampled, each given a position on first sight (RemoteIndex)
            if max_nodes is None or max_nodes < capacity:
                raise ValueError(f"universe=remote needs max_nodes >= capacity ({capacity}), got {max_nodes}")
            self.index = RemoteIndex(max_nodes, id_bound=id_bound)  # ids in [0, id_bound): a direct map
            self.halo = self.index.ids  # position -> id (-1: free), updated in place by the index
        H = self.halo.numel()
        self._pos_memo: dict = {}
        self._np_views: tuple | None = None  # _views()'s cache
        self._next_use: WindowNextUse | None = None  # made by the first lookahead round
        self._planned: tuple | None = None  # (ids, halo positions) of the last plan's newcomers
        self._scratch: torch.Tensor | None = None  # gather_into's rows, reused
        self._row_map: torch.Tensor | None = None  # rows_at's halo position -> row, reused
        if capacity < 0 or capacity > H:
            raise ValueError(f"capacity {capacity} must be in [0, {H}] (the "
                             f"{'halo size' if universe == 'halo' else 'remote index max_nodes'})")
        self.capacity = int(capacity)
        self.decay = 1.0 - alpha
        self.period = period
        self.threshold = self.decay**period
        self.slot_of = torch.full((H,), -1, dtype=torch.int64)
        self.slot_pos = torch.full((capacity,), -1, dtype=torch.int64)
        # slots holding a node, kept by fill and apply (a slot never empties again); while
        # `_suffix`, they are exactly slots [0, _filled): every fill so far took the lowest empty
        # slots, so the empty ones are [_filled, C) and need no search (`_empty_from`)
        self._filled = 0
        self._suffix = True
        self.score = torch.zeros(capacity, dtype=torch.float64)
        self.miss_count = torch.zeros(H, dtype=torch.float64)
        self.missed = torch.zeros(H, dtype=torch.bool)
        self.missed_before = torch.zeros(H, dtype=torch.bool)
        self.feats = torch.empty((capacity, feat_dim) if store_features else (0, 0), dtype=dtype,
                                 device=device)
        self.store_features = store_features
        jit.warm()  # the compiled kernels loaded now, not in the first minibatch (once per process)

    def _views(self) -> tuple[np.ndarray, ...]:
        """numpy views of slot_of, slot_pos, score, miss_count, missed (the same memory), made once
        per tensor: `.numpy()` costs 2-6 us a call, ~15 calls a minibatch on the compiled path.
        Rebuilt when an attribute is another tensor (missed is swapped each window)."""
        got = self._np_views
        if got is not None:
            t = got[0]
            if (t[0] is self.slot_of and t[1] is self.slot_pos and t[2] is self.score
                    and t[3] is self.miss_count and t[4] is self.missed):
                return got[1]
        ts = (self.slot_of, self.slot_pos, self.score, self.miss_count, self.missed)
        got = self._np_views = (ts, tuple(t.numpy() for t in ts))
        return got[1]

    def __getstate__(self) -> dict:
        """A copy (deepcopy: a replay's fork; pickle) makes its own views of its own tensors."""
        state = self.__dict__.copy()
        state["_np_views"] = None
        return state

    def __deepcopy__(self, memo: dict) -> "HaloBuffer":
        """A copy with state of its own (a replay's fork, the judge's branches), which shares
        the sampled minibatches' ids and positions that its caches hold (the lookahead memo, the
        next-use window): nothing writes them; a memo finds a minibatch by its tensor's storage,
        so a copy would never be found again; and each is a slice of the trace, whose deep copy
        is the whole trace's storage (0.9 s a fork for a 45 MB trace)."""
        shared = [*self._pos_memo.values(), *(self._next_use.window if self._next_use else ())]
        for entry in shared:
            memo.setdefault(id(entry), entry)
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
        return new

    # ---- lookup ---------------------------------------------------------------------------
    def _build_index(self) -> None:
        """The direct map over ids [0, span) when it is small enough (MAP_SPAN_PER_HALO), else
        buckets of 2^shift consecutive ids, about one halo node per bucket: memory O(H)."""
        H = self.halo.numel()
        span = int(self.halo[-1]) + 1 if H else 1
        self._pos_map = None
        if H and int(self.halo[0]) >= 0 and span <= self.MAP_SPAN_PER_HALO * H:
            self._pos_map = torch.full((span,), -1, dtype=torch.int32)
            self._pos_map[self.halo] = torch.arange(H, dtype=torch.int32)
            return
        self._shift = max(0, (span - 1).bit_length() - max(H, 1).bit_length())
        nb = (span >> self._shift) + 1
        self._bucket_off = torch.searchsorted(self.halo >> self._shift, torch.arange(nb + 1))
        occupancy = int((self._bucket_off[1:] - self._bucket_off[:-1]).max()) if H else 0
        self._search_steps = max(occupancy, 1).bit_length()

    def halo_positions(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(is_halo mask, halo position) for each id; position is garbage where not halo.
        A binary search restricted to the id's bucket: a few gathers over the whole batch."""
        if self.index is not None:
            return self._remote_positions(ids)
        H = self.halo.numel()
        if H == 0 or ids.numel() == 0:
            z = torch.zeros(ids.numel(), dtype=torch.int64)
            return z.bool(), z
        k = jit.kernels()
        if self._pos_map is not None:
            return self._mapped_positions(ids, k)
        if k is not None:  # one compiled loop: each id's search at once (the same iterations)
            is_halo, pos = k.halo_search(self._bucket_off.numpy(), self.halo.numpy(), ids.numpy(),
                                         self._shift, self._search_steps)
            return torch.from_numpy(is_halo), torch.from_numpy(pos)
        # numpy on the tensors' memory (the same search; less dispatch per op)
        off, halo, x = self._bucket_off.numpy(), self.halo.numpy(), ids.numpy()
        nb = off.size - 1
        bk = np.clip(x >> self._shift, 0, nb - 1)
        lo, hi = off.take(bk), off.take(bk + 1)
        for _ in range(self._search_steps):
            mid = lo + hi
            mid >>= 1
            right = mid < hi
            right &= halo.take(np.minimum(mid, H - 1)) < x
            np.copyto(lo, mid + 1, where=right)
            np.copyto(hi, mid, where=~right)
        pos = np.minimum(lo, H - 1, out=lo)
        return torch.from_numpy(halo.take(pos) == x), torch.from_numpy(pos)

    def _mapped_positions(self, ids: torch.Tensor, k) -> tuple[torch.Tensor, torch.Tensor]:
        """halo_positions through the direct map: position 0 where not halo (ids outside the
        map's span are not halo)."""
        pos_map, x = self._pos_map.numpy(), ids.numpy()
        if k is not None:
            is_halo, pos = k.halo_map(pos_map, x)
            return torch.from_numpy(is_halo), torch.from_numpy(pos)
        inside = (x >= 0) & (x < pos_map.size)
        pos = np.where(inside, pos_map.take(np.where(inside, x, 0)), -1).astype(np.int64)
        is_halo = pos >= 0
        return torch.from_numpy(is_halo), torch.from_numpy(np.maximum(pos, 0, out=pos))

    # ---- the remote universe (universe="remote") -------------------------------------------
    def _remote_positions(self, ids: torch.Tensor, insert: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(known, position) of each id in the RemoteIndex; `insert`: ids seen first get a
        position (no room: bypassed, known False). An id that gives its position up is neither
        buffered, nor in the lookahead window, nor this minibatch's, nor in a memoised minibatch
        (`_pinned`); its miss count restarts at 0 (a newcomer to the index knows no history)."""
        ids = ids.to(torch.int64)
        if insert and ids.numel():
            pos, evicted = self.index.insert(ids, self.miss_count, self._pinned)
            if evicted.numel():
                self.miss_count.index_fill_(0, evicted, 0.0)
                self.missed.index_fill_(0, evicted, False)  # the position's next id is another node
                self.missed_before.index_fill_(0, evicted, False)
        else:
            pos = self.index.lookup(ids)[1]
        known = pos >= 0
        return known, pos.clamp(min=0)

    def _pinned(self) -> torch.Tensor:
        """Positions whose ids must keep them: buffered, this minibatch's, used in the
        lookahead window or memoised for a sampled-ahead minibatch (their positions are held)."""
        keep = self.slot_of >= 0
        keep.index_fill_(0, torch.cat([self._held, *(m[3] for m in self._pos_memo.values())]), True)
        if self._next_use is not None:
            keep |= self._next_use.used()
        return keep

    def lookup(self, remote_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Splits remote ids into hits and misses: (hit mask, slot or -1)."""
        _, _, slots = self.locate(remote_ids)
        return slots >= 0, slots

    def locate(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(is_halo, halo position, slot or -1) for each id: one search serves lookup and record.
        A minibatch that an earlier lookahead round saw ahead is not searched again (memo)."""
        is_halo, pos = self._positions(ids)
        slots = self.slot_of.numpy().take(pos.numpy())
        slots[~is_halo.numpy()] = -1
        return is_halo, pos, torch.from_numpy(slots)

    def _positions(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(is_halo, halo position) of each id, from the memo or a search; with a remote index
        the minibatch's positions are pinned until the next minibatch."""
        hit = self._memo(ids)
        is_halo, pos = (hit[1], hit[2]) if hit is not None else self.halo_positions(ids)
        if self.index is not None:
            self._held = pos.masked_select(is_halo)
        return is_halo, pos

    def split(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`locate` and the hit/miss split of one minibatch (unique ids): (is_halo, halo position,
        hit mask, hit slots, miss ids, missed halo positions), the last four in id order."""
        k = jit.kernels()
        if k is not None:  # one compiled pass instead of ~8 numpy ones (the same selections)
            is_halo, pos = self._positions(ids)
            parts = k.split(self._views()[0], is_halo.numpy(), pos.numpy(), ids.numpy())
            return (is_halo, pos, *(torch.from_numpy(t) for t in parts))
        is_halo, pos, slots = self.locate(ids)
        sl = slots.numpy()
        hit = sl >= 0
        miss = ~hit
        return (is_halo, pos, torch.from_numpy(hit), torch.from_numpy(sl[hit]),
                torch.from_numpy(ids.numpy()[miss]), torch.from_numpy(pos.numpy()[is_halo.numpy() & miss]))

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Copies rows out, on the buffer's device: the caller's tensor never aliases the buffer
        (safe to replace later). `slots` may be on the CPU (the index's side)."""
        return self.feats.index_select(0, slots.to(self.feats.device))

    def gather_into(self, out: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """out[rows] = the buffered rows of `slots`: on the CPU as one numpy copy of whole rows;
        elsewhere through a scratch tensor kept between minibatches (no fresh allocation, no
        page faults each minibatch). The scratch never
        leaves this call, so reusing it is safe while earlier outputs are still being trained on;
        the thread that runs steps is the only caller."""
        if copy_rows(out, rows, self.feats, slots):  # both CPU: whole rows' bytes
            return
        n = slots.numel()
        if self._scratch is None or self._scratch.shape[0] < n or self._scratch.dtype != self.feats.dtype:
            self._scratch = self.feats.new_empty((n + n // 4, self.feats.shape[1]))
        got = torch.index_select(self.feats, 0, slots.to(self.feats.device), out=self._scratch[:n])
        out.index_copy_(0, rows.to(out.device), got)

    @property
    def device(self) -> torch.device:
        return self.feats.device

    @property
    def feat_bytes(self) -> int:
        """Memory of the buffered rows on their device."""
        return self.feats.numel() * self.feats.element_size()

    def write_rows(self, slots: torch.Tensor, feats: torch.Tensor) -> None:
        """Rows into slots (of ids `apply` put there); rows pulled on the CPU cross to the
        device here (newcomers only)."""
        if copy_rows(self.feats, slots, feats):  # CPU, same dtype: whole rows' bytes
            return
        self.feats.index_copy_(0, slots.to(self.feats.device), feats.to(self.feats.device, self.feats.dtype))

    # ---- bookkeeping ----------------------------------------------------------------------
    def record(self, hit_slots: torch.Tensor, missed_pos: torch.Tensor, count_misses: bool = True):
        """One minibatch of scores: every slot decays, a hit slot skips this decay (the score is
        (1-alpha)^(minibatches not hit since filled), never recovering); each sampled halo node
        not buffered gets +1 miss (not on replacement minibatches: the reference skips them).
        hit_slots: distinct slots hit; missed_pos: halo positions of the non-buffered halo
        nodes sampled (ids are unique within a minibatch, so both are duplicate-free)."""
        k = jit.kernels()
        filled = self._filled_end()  # empty slots' scores stay 0
        if k is not None:  # one compiled loop per array (rudder.prefetch.jit): the same arithmetic
            _, _, score, miss_count, missed = self._views()
            k.record(score[:filled], self.decay, hit_slots.numpy(), miss_count, missed, missed_pos.numpy(),
                     count_misses)
            return
        score = self.score.numpy()[:filled]  # numpy on the tensors' memory: the same arithmetic, less dispatch
        score *= self.decay
        if hit_slots.numel():
            hs = hit_slots.numpy()
            score[hs] = score[hs] / self.decay
        if count_misses and missed_pos.numel():
            self.miss_count.numpy()[missed_pos.numpy()] += 1.0
        if missed_pos.numel():  # pulled on every minibatch, a round's or not
            self.missed.numpy()[missed_pos.numpy()] = True

    def roll_misses(self) -> dict:
        """Closes the metrics window's set of missed halo nodes against the window before's and
        opens the next: missed_nodes = |A| (distinct nodes missed in this window), missed_again =
        |A & B| (also missed in the window before), missed_union = |A | B|. The Jaccard overlap
        missed_again / missed_union says how much the misses' node set moved (0: all new nodes,
        1: the same nodes). O(H) elementwise, once per window."""
        now, before = self.missed, self.missed_before
        out = {"missed_nodes": int(now.sum()), "missed_again": int((now & before).sum()),
               "missed_union": int((now | before).sum())}
        self.missed_before, self.missed = now, before.zero_()
        return out

    def stale_threshold(self, stale_after: float | None = None) -> float:
        """The score below which a filled slot is stale: (1-alpha)^period, or for one round
        (1-alpha)^stale_after (minibatches without a hit; the agent's `evict` knob)."""
        return self.threshold if stale_after is None else self.decay ** float(stale_after)

    def stale_slots(self, stale_after: float | None = None) -> torch.Tensor:
        """Filled slots whose score fell below (1-alpha)^period (or ^stale_after), lowest score
        first; then empties."""
        filled = self.slot_pos >= 0
        stale = torch.nonzero(filled & (self.score < self.stale_threshold(stale_after))).flatten()
        stale = stale[torch.argsort(self.score[stale], stable=True)]
        empty = torch.nonzero(~filled).flatten()
        return torch.cat([empty, stale])

    @staticmethod
    def _memo_key(ids: torch.Tensor) -> tuple:
        return (ids.data_ptr(), ids.numel(), ids.stride(0) if ids.dim() else 1)

    def _memo(self, ids: torch.Tensor) -> tuple | None:
        """(ids, is_halo, pos, halo positions) of a minibatch a lookahead round looked at, or None.
        The memo holds the ids tensor, so its storage stays alive: another tensor with the same
        address, length and stride is a view of the same ids (the simulator re-slices each step)."""
        hit = self._pos_memo.get(self._memo_key(ids))
        if hit is None or hit[0].untyped_storage().data_ptr() != ids.untyped_storage().data_ptr():
            return None
        return hit

    def _future_positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Halo positions of a sampled-ahead minibatch, memoised: each one is looked at on
        every round until it is trained on (the tensors stay alive in the lookahead queue), and
        `locate` reuses them when it is (one search per minibatch)."""
        hit = self._memo(ids)
        if hit is None:
            is_halo, pos = self.halo_positions(ids)
            hit = (ids, is_halo, pos, torch.from_numpy(pos.numpy()[is_halo.numpy()]))
            self._pos_memo[self._memo_key(ids)] = hit
            while len(self._pos_memo) > 16:
                self._pos_memo.pop(next(iter(self._pos_memo)))
        return hit[3]

    def window_missing(self, future: list[torch.Tensor]) -> int:
        """Distinct halo nodes of the `future` minibatches not buffered. Read off the round's
        next-use index when the last round's window is `future` (O(H) elementwise, no sort);
        else a unique over the window."""
        nu = self._next_use
        if future and nu is not None and nu.holds(future):
            return int((nu.used() & (self.slot_of < 0)).sum())
        if not future:
            return 0
        ids = torch.unique(torch.cat(future))
        if self.index is not None:  # every remote id counts; a look only (nothing inserted)
            known, pos = self._remote_positions(ids, insert=False)
            return int((~(known & (self.slot_of.index_select(0, pos) >= 0))).sum())
        is_halo, _ = self.halo_positions(ids)
        hit, _ = self.lookup(ids[is_halo])
        return int((~hit).sum())

    def stale_count(self, stale_after: float | None = None) -> int:
        threshold = self.stale_threshold(stale_after)
        n = self._filled_end()  # only filled slots can be stale
        k = jit.kernels()
        if k is not None:
            _, slot_pos, score, _, _ = self._views()
            return int(k.fill_counts(slot_pos[:n], score[:n], threshold)[1])
        return int(np.count_nonzero((self.slot_pos.numpy()[:n] >= 0) & (self.score.numpy()[:n] < threshold)))

    # ---- replacement plans (which slots get which halo nodes) -----------------------------
    def plan_massivegnn(self, max_rows: int | None = None,
                        stale_after: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Stale slots <- most-missed non-buffered halo nodes, as many as both lists allow.
        stale_after: this round counts slots stale after that many minibatches without a hit
        (threshold (1-alpha)^stale_after) instead of `period`; the rule is otherwise the same."""
        victims, pos = self.massivegnn_plans([stale_after], max_rows)[stale_after]
        return (victims, self._newcomers(pos)) if victims.numel() else (_EMPTY, _EMPTY)

    def massivegnn_plans(self, stale_afters: list[float | None], max_rows: int | None = None
                         ) -> dict[float | None, tuple[torch.Tensor, torch.Tensor]]:
        """plan_massivegnn's plan for each stale threshold, as (victim slots, newcomers' halo
        positions), planning nothing (no `apply` follows). One sort serves every threshold: a
        stricter threshold's stale slots are a prefix of the loosest one's in score order, and
        the newcomers' order does not depend on the threshold. A smaller max_rows's plan is a
        prefix of this one's."""
        thresholds = {sa: self.stale_threshold(sa) for sa in stale_afters}
        filled = self.slot_pos >= 0
        empty = torch.nonzero(~filled).flatten()
        stale = torch.nonzero(filled & (self.score < max(thresholds.values()))).flatten()
        stale = stale[torch.argsort(self.score[stale], stable=True)]  # lowest score first
        cand = torch.nonzero((self.slot_of < 0) & (self.miss_count > 0)).flatten()
        cap = 1 << 62 if max_rows is None else max_rows
        most = min(empty.numel() + stale.numel(), cand.numel(), cap)
        # most missed first; ties to the lower node id (stable sort: deterministic everywhere)
        top = cand[torch.sort(-self.miss_count[cand], stable=True).indices[:most]] if most > 0 else _EMPTY
        scores = self.score[stale]
        plans = {}
        for sa, threshold in thresholds.items():
            k = int(torch.searchsorted(scores, torch.tensor([threshold], dtype=scores.dtype)))  # scores < threshold
            n = min(empty.numel() + k, cand.numel(), cap)
            plans[sa] = (torch.cat([empty, stale[:k]])[:n], top[:n]) if n > 0 else (_EMPTY, _EMPTY)
        return plans

    def _newcomers(self, pos: torch.Tensor) -> torch.Tensor:
        """A plan's newcomer ids; `apply` takes their positions from here instead of searching."""
        ids = self.halo.index_select(0, pos)
        self._planned = (ids, pos)
        return ids

    def planned_positions(self, new_ids: torch.Tensor) -> torch.Tensor | None:
        """Halo positions of `new_ids` if it is the very tensor this buffer's last plan made."""
        planned = self._planned
        return planned[1] if planned is not None and planned[0] is new_ids else None

    def rows_at(self, pos: torch.Tensor, rows: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """rows[i] where pos[i] == q, for each q of `query` (every q among `pos`, `pos` unique):
        through a map over the halo kept between calls, not a sort."""
        if self._row_map is None:
            self._row_map = torch.empty(self.halo.numel(), dtype=torch.int64)
        self._row_map.scatter_(0, pos, rows)
        return self._row_map.index_select(0, query)

    def plan_lookahead(
        self,
        future: list[torch.Tensor],
        max_rows: int | None = None,
        free_pos: torch.Tensor | None = None,
        admit: str = "misses",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Belady's rule on the known window: admit the non-buffered halo nodes used soonest
        (then most often) in `future`; evict the slots used latest or never in the window
        (never-used ones by lowest eviction score: history is the fallback beyond the window).
        A swap happens only if the newcomer's next use is sooner than the victim's, so the
        pairs form a prefix of the two sorted lists.

        `free_pos`: halo positions of this minibatch's misses, pulled anyway. admit="misses" admits only them:
        a row pulled ahead of its use saves nothing over pulling it at that use and admitting
        it then, so demand admission is never worse in rows (Belady's own setting) and the
        round pulls no extra row. admit="any" also pulls rows ahead (more hits, same or more
        rows); free nodes still win ties there."""
        if admit not in ("misses", "any"):
            raise ValueError(f"unknown admit mode {admit!r}; valid: misses, any")
        victims, pos = self._lookahead_round(future, max_rows, free_pos, admit)
        if free_pos is not None and free_pos.numel():
            victims, pos = self._fill_empty(victims, pos, free_pos, max_rows)
        if not victims.numel():
            return _EMPTY, _EMPTY
        return victims, self._newcomers(pos)

    def _fill_empty(self, victims: torch.Tensor, pos: torch.Tensor, free_pos: torch.Tensor,
                    max_rows: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty slots the round left take this minibatch's misses it left out (pulled anyway:
        no extra row, no eviction), within the round's row budget. Belady's rule admits only
        nodes used again in the window, but a miss with no known reuse may be used beyond it
        (the next epoch), and an empty slot holds nothing to lose: in the window these slots
        rank as victims like empty ones (no known next use), so no hit there is given up."""
        room = (max_rows if max_rows is not None else 1 << 62) - victims.numel()
        if room <= 0 or self._filled >= self.capacity:  # a full buffer: no scan of its slots
            return victims, pos
        fp = free_pos.numpy()
        left = fp[self.slot_of.numpy()[fp] < 0]
        if pos.numel():
            left = left[~np.isin(left, pos.numpy())]
        if left.size == 0:
            return victims, pos
        start = self._empty_from()
        if start >= 0:  # empty slots [start, C): the round's empty victims are their lowest ones
            first = start + int(np.count_nonzero(victims.numpy() >= start))
            empty = np.arange(first, min(first + min(room, left.size), self.capacity))
        else:
            empty = self.slot_pos.numpy() < 0
            empty[victims.numpy()] = False  # the round fills these
            empty = np.flatnonzero(empty)
        n = min(room, empty.size, left.size)
        if n == 0:
            return victims, pos
        return (torch.cat([victims, torch.from_numpy(empty[:n])]),
                torch.cat([pos, torch.from_numpy(np.ascontiguousarray(left[:n]))]))

    def _lookahead_round(self, future: list[torch.Tensor], max_rows: int | None,
                         free_pos: torch.Tensor | None, admit: str) -> tuple[torch.Tensor, torch.Tensor]:
        """plan_lookahead's Belady round: (victim slots, newcomers' halo positions)."""
        H = self.halo.numel()
        if H == 0 or self.capacity == 0 or not future:
            return _EMPTY, _EMPTY
        # The round runs in numpy on views of the buffer's tensors (shared memory): the same
        # values as torch ops, with less dispatch per op. The two rankings stay torch.topk on the
        # same keys, so the same victims and newcomers, ties included.
        INF = len(future) + 1
        if self.incremental_next_use:  # kept up to date as the window slides (rudder.prefetch.nextuse)
            if self._next_use is None:
                self._next_use = WindowNextUse(H)
            nu = self._next_use
            nu.sync(future, self._future_positions)
            k = jit.kernels()
            if k is not None:  # the whole round below as one compiled pass (same keys, same topk)
                slot_of, slot_pos, score, _, _ = self._views()
                victims, cand = k.round_lookahead(
                    nu.state, nu.window[0][2], INF, slot_of, slot_pos, score,
                    free_pos.numpy() if free_pos is not None else _EMPTY_NP,
                    admit == "any", max_rows if max_rows is not None else 1 << 62, self._empty_from())
                if not victims.size:
                    return _EMPTY, _EMPTY
                return torch.from_numpy(victims), torch.from_numpy(cand)
            next_use_of, freq_of = nu.next_use_np, nu.freq_np
        else:
            nu = None
            next_use, freq = (t.numpy() for t in next_use_scratch([self._future_positions(f) for f in future], H))
            next_use_of, freq_of = next_use.take, freq.take
        slot_of = self.slot_of.numpy()
        has_free = free_pos is not None and free_pos.numel() > 0
        if admit == "misses":  # candidates: the free nodes (sorted, as a scan of the halo gives them)
            if not has_free:
                return _EMPTY, _EMPTY
            fp = free_pos.numpy()
            keep = slot_of[fp] < 0
            keep &= next_use_of(fp) < INF
            # distinct and ascending (ties below go by this order); a minibatch's positions are
            # distinct, so a sort is a unique unless the caller repeats one
            cand = np.sort(fp[keep])
            if cand.size > 1:
                new = cand[1:] != cand[:-1]
                if not new.all():
                    cand = cand[np.concatenate(([True], new))]
            cand_next = next_use_of(cand)
            not_free = 0  # all free
        else:
            used = nu.freq != 0 if nu is not None else next_use < INF
            cand = np.flatnonzero((slot_of < 0) & used)
            cand_next = next_use_of(cand)
            free = np.zeros(H, dtype=bool)  # a mask, not isin: that sorts
            if has_free:
                free[free_pos.numpy()] = True
            not_free = (~free[cand]).astype(np.int64)
        n = min(cand.size, self.capacity, max_rows if max_rows is not None else 1 << 62)
        if n == 0:
            return _EMPTY, _EMPTY
        # one integer key: next use ascending, then free first, then frequency descending
        F = len(future) + 1
        ckey = (cand_next * 2 + not_free) * (F + 1) + (F - freq_of(cand))
        start = self._empty_from()
        if start >= 0 and n <= self.capacity - start:
            # empty slots rank first as victims and every candidate is used in the window, so
            # the n swaps fill the n lowest empty slots: no pass over the slots
            top = torch.topk(torch.from_numpy(ckey), n, largest=False, sorted=True).indices.numpy()
            return torch.arange(start, start + n), torch.from_numpy(cand[top])
        slot_pos = self.slot_pos.numpy()
        filled = slot_pos >= 0
        # empty slots first (INF + 1), then latest next use; ties (e.g. unused in the window) by
        # lowest score
        vnext = np.where(filled, next_use_of(np.maximum(slot_pos, 0)), INF + 1)
        if int(cand_next.min()) >= int(vnext.max()):
            # no newcomer is used sooner than any slot's node: the prefix below is empty
            return _EMPTY, _EMPTY
        top = torch.topk(torch.from_numpy(ckey), n, largest=False, sorted=True).indices.numpy()
        cand, cand_next = cand[top], cand_next[top]
        vkey = vnext.astype(np.float64)
        vkey *= 1e12
        vkey -= self.score.numpy()
        victims = torch.topk(torch.from_numpy(vkey), n, largest=True, sorted=True).indices
        ok = cand_next < vnext[victims.numpy()]
        k = int(ok.sum())  # a prefix (cand next-use ascending, victim next-use descending)
        return victims[:k], torch.from_numpy(cand[:k])

    # ---- mutation -------------------------------------------------------------------------
    def fill(self, ids: torch.Tensor, feats: torch.Tensor | None = None) -> None:
        """Initial fill of slots 0..k-1 with score 1; `feats` rows in the order of `ids`."""
        if ids.numel() > self.capacity or torch.unique(ids).numel() != ids.numel():
            raise ValueError("initial fill must be unique ids, at most capacity of them")
        is_halo, pos = self.halo_positions(ids)
        if not bool(is_halo.all()):
            raise ValueError("initial fill contains ids that are not halo nodes")
        k = ids.numel()
        slots = torch.arange(k)
        self.slot_pos[:k] = pos
        self.slot_of[pos] = slots
        self.score[:k] = 1.0
        self._filled = int(np.count_nonzero(self.slot_pos.numpy() >= 0))
        self._suffix = bool((self.slot_pos.numpy()[:self._filled] >= 0).all())
        if self.store_features and feats is not None:
            self.write_rows(slots, feats)

    def apply(self, slots: torch.Tensor, new_ids: torch.Tensor, feats: torch.Tensor | None = None):
        """Puts new_ids into slots, with the score hand-over of the reference: the evicted node's
        miss count restarts from its old eviction score; the new slot's score starts from the
        newcomer's miss count."""
        if slots.numel() == 0:
            return
        new_pos = self.planned_positions(new_ids)
        self._planned = None
        if new_pos is None:
            _, new_pos = (self.halo_positions(new_ids) if self.index is None
                          else self._remote_positions(new_ids, insert=False))
        # (slots, old and new positions are each duplicate-free: a fancy assignment is a scatter
        # here); numpy on the tensors' memory, as in the lookup
        sl, npos = slots.numpy(), new_pos.numpy()
        k = jit.kernels()
        if k is not None:
            slot_of, slot_pos, score, miss_count, _ = self._views()
            self._note_filled(*k.apply(slot_pos, slot_of, score, miss_count, sl, npos))
            if self.store_features and feats is not None:
                self.write_rows(slots, feats)
            return
        slot_pos, slot_of = self.slot_pos.numpy(), self.slot_of.numpy()
        score, miss_count = self.score.numpy(), self.miss_count.numpy()
        old_pos = slot_pos[sl]
        had = old_pos >= 0
        was_empty = sl[~had]
        self._note_filled(was_empty.size, int(was_empty.max()) if was_empty.size else -1)
        old = old_pos[had]
        miss_count[old] = score[sl[had]]
        slot_of[old] = -1
        score[sl] = miss_count[npos]
        slot_pos[sl] = npos
        slot_of[npos] = sl
        if self.store_features and feats is not None:
            self.write_rows(slots, feats)

    def _note_filled(self, filled: int, top: int) -> None:
        """`filled` empty slots were just filled, the highest `top`: they were the lowest empty
        ones (the suffix stays a suffix) iff they were [_filled, _filled + filled)."""
        if filled:
            self._suffix = self._suffix and int(top) == self._filled + filled - 1
            self._filled += int(filled)

    def _empty_from(self) -> int:
        """The first empty slot when the empty slots are exactly [it, C), else -1."""
        return self._filled if self._suffix else -1

    def _filled_end(self) -> int:
        """Every filled slot is below this: _filled while the empty slots are the suffix, else C."""
        return self._filled if self._suffix else self.capacity

    # ---- inspection -----------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Slots holding a node (a counter: the pipeline asks every minibatch)."""
        return self._filled

    def contents(self) -> torch.Tensor:
        return self.halo[self.slot_pos[self.slot_pos >= 0]]

    def universe_nodes(self) -> int:
        """Ids the buffer's universe holds now: the halo, or the remote ids the index keeps."""
        return self.num_halo if self.index is None else len(self.index)

    def verify(self) -> None:
        """Invariants (tests call this): maps are inverse, no duplicates, within capacity."""
        filled = torch.nonzero(self.slot_pos >= 0).flatten()
        pos = self.slot_pos[filled]
        assert pos.unique().numel() == pos.numel(), "a node is buffered twice"
        assert bool((self.slot_of[pos] == filled).all()), "slot_of/slot_pos disagree"
        assert int((self.slot_of >= 0).sum()) == filled.numel(), "stray slot_of entries"
        assert filled.numel() <= self.capacity
        assert self._filled == filled.numel(), "the fill counter disagrees with the slots"
        if self._suffix:
            assert bool((self.slot_pos[:self._filled] >= 0).all()), "the empty slots are not a suffix"
        if self.index is not None:
            self.index.verify()
            assert bool((self.halo[pos] >= 0).all()), "a buffered position lost its id"


_EMPTY = torch.empty(0, dtype=torch.int64)
_EMPTY_NP = _EMPTY.numpy()


def _byte_rows(*ts: torch.Tensor) -> bool:
    """Whether these 2-D tensors can be moved row by row as numpy byte items: all on the CPU,
    contiguous, of one dtype, with non-empty rows."""
    t0 = ts[0]
    return all(t.device.type == "cpu" and t.dim() == 2 and t.is_contiguous() and t.dtype == t0.dtype
               and t.shape[1] == t0.shape[1] and t.shape[1] > 0 for t in ts)


def copy_rows(out: torch.Tensor, rows: torch.Tensor, src: torch.Tensor, slots: torch.Tensor | None = None) -> bool:
    """out[rows] = src[slots] (src's rows in order without `slots`) as whole rows' bytes, bit for
    bit, in one pass (the compiled kernel where numba is there: no temporary; 2-3x faster than
    index_select + index_copy_, ~7x than a torch fancy assignment). False, nothing copied, unless
    both are row-contiguous CPU tensors of one dtype (_byte_rows)."""
    if not _byte_rows(out, src):
        return False
    r = rows.cpu().numpy()
    if slots is None:  # a contiguous source: one numpy pass
        _rows(out)[r] = _rows(src)
        return True
    k = jit.kernels()
    if k is not None:
        k.copy_rows(_words(out), r, _words(src), slots.cpu().numpy())
    else:
        _rows(out)[r] = _rows(src).take(slots.cpu().numpy())
    return True


def _rows(t: torch.Tensor) -> np.ndarray:
    """A contiguous 2-D CPU tensor as a 1-D numpy array of one opaque item per row (its bytes; any
    dtype, bfloat16 too): fancy indexing then copies whole rows, bit for bit."""
    raw = t.view(torch.uint8).numpy()
    return raw.view(np.dtype((np.void, raw.shape[1]))).reshape(t.shape[0])


def _words(t: torch.Tensor) -> np.ndarray:
    """A contiguous 2-D CPU tensor's bytes as a 2-D numpy array of the widest unsigned integers
    that tile a row (8 bytes where the row's size allows): copying them copies the rows bit for bit."""
    raw = t.view(torch.uint8).numpy()
    width = raw.shape[1]
    for w in (np.uint64, np.uint32, np.uint16):
        if width % np.dtype(w).itemsize == 0:
            return raw.view(w)
    return raw


def choose_initial(
    halo_ids: torch.Tensor, capacity: int, init: str, degrees: torch.Tensor | None = None, seed: int = 0
) -> torch.Tensor:
    """Initial fill ids (sorted): `degree` (top in-degree halo nodes; `degrees` aligned with
    `halo_ids`), `random`, or `empty`."""
    order = torch.argsort(halo_ids)
    halo_ids = halo_ids[order]
    degrees = degrees[order] if degrees is not None else None
    if init == "empty" or capacity == 0:
        return _EMPTY
    if init == "random":
        g = torch.Generator().manual_seed(seed)
        return torch.sort(halo_ids[torch.randperm(halo_ids.numel(), generator=g)[:capacity]]).values
    if init == "degree":
        if degrees is None:
            raise ValueError("init=degree needs the halo nodes' degrees")
        top = torch.topk(degrees.to(torch.float64), min(capacity, halo_ids.numel())).indices
        return torch.sort(halo_ids[top]).values
    raise ValueError(f"unknown init {init!r}; valid: degree, random, empty")
