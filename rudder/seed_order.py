"""The order of a trainer's training seeds in each epoch (`train.order`), shared by the trainer
and the trace generator so that replays see the stream training sees.

  shuffle    a fresh random permutation every epoch (DGL's shuffle=True; the default)
  proximity  breadth-first order over the graph of the partition's own nodes, from a random root
             every epoch (ties inside a BFS level broken at random; a new random root when a
             component is exhausted): consecutive minibatches are neighbours, so the nodes they
             touch -- and the remote ones among them -- drift instead of being redrawn (BGL's
             proximity-aware ordering)
  cluster    seeds grouped into clusters, each cluster's seeds consecutive: the order of the
             clusters and the order inside each are reshuffled every epoch, so training stays
             stochastic at the granularity of clusters (ClusterGCN-like). Clusters are
             consecutive runs of `cluster_size` seeds in one fixed BFS order (seeded, the same
             every epoch): connected regions of the graph, found without a partitioner
             and without community labels (a real graph has none)

Everything works on positions into `seeds` (what DGL's loaders index) and is deterministic by
(seed, epoch). The graph is given as directed edges (src, dst) between any node ids; nodes that
are not seeds are walked through but not ordered (seeds are a sample of the partition's nodes).
"""
from __future__ import annotations

import numpy as np

ORDERS = ("shuffle", "proximity", "cluster")


def check_order(mode: str) -> str:
    if mode not in ORDERS:
        raise ValueError(f"unknown train.order {mode!r}; valid: {', '.join(ORDERS)}")
    return mode


class _Graph:
    """CSR over the compacted ids of seeds + edge ends (undirected: both directions)."""

    def __init__(self, seeds: np.ndarray, src: np.ndarray, dst: np.ndarray):
        ids = np.unique(np.concatenate([seeds, src, dst]))
        self.seed_node = np.searchsorted(ids, seeds)  # compact id of each seed position
        s, d = np.searchsorted(ids, src), np.searchsorted(ids, dst)
        s, d = np.concatenate([s, d]), np.concatenate([d, s])
        o = np.argsort(s, kind="stable")
        self.nbr = d[o]
        self.indptr = np.zeros(ids.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(s, minlength=ids.size), out=self.indptr[1:])
        self.n = ids.size

    def bfs(self, rng: np.random.Generator) -> np.ndarray:
        """Every node once, in BFS order from random roots (one per component, in random order),
        each level's new nodes in random order."""
        prio = rng.permutation(self.n)  # random rank of every node: level order and roots
        roots = np.argsort(prio)
        seen = np.zeros(self.n, dtype=bool)
        out, r = [], 0
        deg = np.diff(self.indptr)
        while True:
            while r < self.n and seen[roots[r]]:
                r += 1
            if r == self.n:
                break
            frontier = roots[r:r + 1]
            seen[frontier] = True
            while frontier.size:
                out.append(frontier)
                cnt = deg[frontier]
                if not cnt.sum():
                    break
                # neighbours of the whole frontier at once: ranges indptr[f]..indptr[f+1]
                start = np.repeat(self.indptr[frontier] - np.cumsum(cnt) + cnt, cnt)
                nb = self.nbr[start + np.arange(cnt.sum())]
                nb = np.unique(nb[~seen[nb]])
                nb = nb[np.argsort(prio[nb])]
                seen[nb] = True
                frontier = nb
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


class SeedOrder:
    """order.epoch(e): the positions 0..len(seeds)-1 in epoch e's order (a permutation).
    src/dst: the graph among the partition's nodes (needed by proximity and cluster)."""

    def __init__(self, seeds, mode: str = "shuffle", seed: int = 0, src=None, dst=None,
                 cluster_size: int = 4000):
        self.mode, self.seed = check_order(mode), int(seed)
        seeds = np.asarray(seeds, dtype=np.int64)
        self.n = seeds.size
        if cluster_size < 1:
            raise ValueError(f"cluster_size must be >= 1, got {cluster_size}")
        self.graph = None
        if mode != "shuffle":
            if src is None or dst is None:
                raise ValueError(f"train.order {mode!r} needs the graph (src, dst) of the partition")
            self.graph = _Graph(seeds, np.asarray(src, np.int64), np.asarray(dst, np.int64))
        if mode == "cluster":
            pos = self._bfs_positions(np.random.default_rng([self.seed, 1 << 30]))
            self.cluster = np.empty(self.n, dtype=np.int64)  # cluster id of every position
            self.cluster[pos] = np.arange(self.n) // cluster_size
            self.clusters = int(self.cluster.max()) + 1 if self.n else 0

    def _bfs_positions(self, rng: np.random.Generator) -> np.ndarray:
        """Seed positions in the BFS order of the graph."""
        g = self.graph
        rank = np.full(g.n, -1, dtype=np.int64)
        order = g.bfs(rng)
        rank[order] = np.arange(order.size)
        # a seed listed twice keeps both positions, next to each other
        return np.argsort(rank[g.seed_node], kind="stable")

    def epoch(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(epoch)])
        if self.mode == "shuffle":
            return rng.permutation(self.n)
        if self.mode == "proximity":
            return self._bfs_positions(rng)
        # cluster: clusters in a random order, a random order inside each
        crank = rng.permutation(self.clusters)
        return np.lexsort((rng.random(self.n), crank[self.cluster]))


class OrderedLoader:
    """A DGL DistNodeDataLoader made with shuffle=False, iterated in SeedOrder's order: each
    iter() is the next epoch (the trainer iterates once per epoch)."""

    def __init__(self, loader, order: SeedOrder):
        self.loader, self.order, self.epoch = loader, order, 0

    def __iter__(self):
        import torch

        # DistDataLoader batches dataset[data_idx[i:i+batch]]; shuffle=False keeps data_idx as set
        self.loader.data_idx = torch.from_numpy(self.order.epoch(self.epoch))
        self.epoch += 1
        return iter(self.loader)


def trainer_order(part, tc) -> SeedOrder:
    """The SeedOrder of a DistDGL trainer's seeds over its local partition's own nodes (edges
    between two inner nodes, in global ids)."""
    if tc.order == "shuffle":  # needs no graph
        return SeedOrder(part.train_nids.numpy(), "shuffle", tc.seed + part.rank)
    inner = part.inner.numpy().astype(bool)
    src, dst = (x.numpy() for x in part.g.local_partition.edges())
    both = inner[src] & inner[dst]
    ids = part.local_ids.numpy()
    return SeedOrder(part.train_nids.numpy(), tc.order, tc.seed + part.rank, ids[src[both]],
                     ids[dst[both]], cluster_size=tc.cluster_size)
