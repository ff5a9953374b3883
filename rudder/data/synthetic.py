"""Synthetic node-classification graphs, deterministic by seed.

A degree-corrected stochastic block model: every node gets a community and a power-law degree
propensity `theta`; each undirected edge picks its source in proportion to `theta` and its
destination in proportion to `theta` either inside the source's community (probability
`p_in`) or anywhere. Node ids are shuffled, so ids say nothing about communities (a `random`
partition then really is random, and METIS has something to find).

`structure: ring` puts the communities on a ring (community c next to c-1 and c+1, mod k): an
edge end drawn outside the source's community goes to a community at most `ring_width` steps
away, never anywhere. Cut edges then follow the ring, so seeds taken community after community
(`train.order: cluster | proximity`) touch a remote set that drifts instead of being redrawn.

Labels follow communities: every community has a class, and a node takes it with probability
`1 - label_noise` (else a random class). Features are the node's class centroid plus Gaussian
noise, loud enough that features alone predict the label well above chance but not perfectly;
averaging the neighbours' features (what a GraphSAGE layer does) removes much of the noise,
because most neighbours share the community and so mostly the class.

Everything is vectorised numpy (Chung-Lu stubs grouped by community, de-duplication by sorting
packed pair keys): the 1M-node / 20M-edge preset generates in seconds.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # dgl is slow to import; only the builder below needs it
    import dgl

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of one synthetic graph. Edges are counted directed, after symmetrising:
    `avg_degree` is the mean in-degree (= out-degree) of the final graph."""

    nodes: int
    avg_degree: float = 16.0
    communities: int = 64
    feat_dim: int = 32
    classes: int = 8
    seed: int = 0
    p_in: float = 0.85  # share of edge ends drawn inside the source's community
    degree_exponent: float = 2.3  # P(deg = k) ~ k^-gamma; real web/co-purchase graphs: 2-3
    max_degree_frac: float = 0.05  # cap on a node's expected degree, as a share of nodes
    community_size_sigma: float = 0.6  # lognormal spread of community sizes
    label_noise: float = 0.15  # share of nodes whose label is not their community's class
    feat_noise: float = 2.5  # noise std relative to unit-norm class centroids
    structure: str = "sbm"  # sbm: outside ends anywhere; ring: only to communities near on a ring
    ring_width: int = 1  # ring: an outside end goes to a community 1..ring_width steps away
    train_frac: float = 0.5
    val_frac: float = 0.15
    test_frac: float = 0.35

    def __post_init__(self) -> None:
        problems = []
        if self.nodes < 2:
            problems.append(f"nodes={self.nodes} (need >= 2)")
        if not 0 < self.avg_degree < self.nodes:
            problems.append(f"avg_degree={self.avg_degree} (need 0 < avg_degree < nodes)")
        if not 1 <= self.communities <= self.nodes:
            problems.append(f"communities={self.communities} (need 1..nodes)")
        if self.feat_dim < 1:
            problems.append(f"feat_dim={self.feat_dim} (need >= 1)")
        if not 2 <= self.classes <= self.nodes:
            problems.append(f"classes={self.classes} (need 2..nodes)")
        if not 0 <= self.p_in <= 1:
            problems.append(f"p_in={self.p_in} (need 0..1)")
        if self.degree_exponent <= 2:
            problems.append(f"degree_exponent={self.degree_exponent} (need > 2: finite mean)")
        if not 0 <= self.label_noise <= 1:
            problems.append(f"label_noise={self.label_noise} (need 0..1)")
        if self.structure not in ("sbm", "ring"):
            problems.append(f"structure={self.structure!r} (need 'sbm' or 'ring')")
        if self.structure == "ring" and not 1 <= self.ring_width <= max(1, self.communities // 2):
            problems.append(f"ring_width={self.ring_width} (need 1..communities/2)")
        fracs = (self.train_frac, self.val_frac, self.test_frac)
        if min(fracs) < 0 or sum(fracs) > 1 + 1e-9 or self.train_frac == 0:
            problems.append(f"train/val/test fractions {fracs} (need >= 0, train > 0, sum <= 1)")
        if problems:
            raise ValueError("invalid synthetic spec: " + "; ".join(problems))

    @property
    def undirected_edges(self) -> int:
        return int(round(self.nodes * self.avg_degree / 2))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SyntheticSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown synthetic spec keys {unknown}; valid: {sorted(names)}")
        return cls(**d)


# Presets. Class count and the train share follow what each size is for. feat_noise is set per
# preset because separability grows with feat_dim; measured with a logistic regression (test
# accuracy, features alone -> features + mean of the neighbours' features):
#   tiny 0.69 -> 0.82, small 0.79 -> 0.90, medium ~0.68 -> ~0.86, bench ~0.55 -> ~0.83
#   (ogbn-products: MLP 0.61, GraphSAGE 0.79).
PRESETS: dict[str, SyntheticSpec] = {
    # unit tests: builds in ~0.1 s
    "synth-tiny": SyntheticSpec(nodes=2_000, avg_degree=10, communities=16, feat_dim=16,
                                classes=4, train_frac=0.6, val_frac=0.2, test_frac=0.2),
    # integration tests with 2-4 machines: generates in <1 s, partitions in a few seconds
    "synth-small": SyntheticSpec(nodes=20_000, avg_degree=16, communities=64, feat_dim=32,
                                 classes=8, train_frac=0.5, val_frac=0.15, test_frac=0.35),
    # the size of the planning trace study (200k nodes, 100 communities)
    "synth-medium": SyntheticSpec(nodes=200_000, avg_degree=16, communities=100, feat_dim=64,
                                  classes=16, feat_noise=3.5, train_frac=0.25, val_frac=0.05,
                                  test_frac=0.7),
    # ogbn-products-like: 1M nodes, ~20M directed edges, 128-d float32, 47 classes, small
    # train share (products: 8%). Many small communities keep a minibatch's 2-hop
    # neighbourhood local, so one minibatch touches a few percent of the graph, as on products.
    # (measured: 1000 seeds with fanout 10,25 touch ~7% of the nodes; METIS edge cut ~10% at
    # P=2 with ~250k halo nodes per partition)
    "synth-bench": SyntheticSpec(nodes=1_000_000, avg_degree=20, communities=20_000,
                                 feat_dim=128, classes=47, p_in=0.95, degree_exponent=2.1,
                                 feat_noise=4.5, train_frac=0.1, val_frac=0.02,
                                 test_frac=0.88),
    # communities on a ring (scenario (c), configs/scenarios/ring_cluster.yaml; tests): cut
    # edges only between neighbouring communities
    "synth-ring": SyntheticSpec(nodes=20_000, avg_degree=12, communities=100, feat_dim=32,
                                classes=8, p_in=0.8, structure="ring", train_frac=0.5,
                                val_frac=0.15, test_frac=0.35),
    # the ring benchmark's graph (benchmarks/bench_scenarios.py's ring_spec reads this preset):
    # ~1000 nodes per community, 80% of edge ends inside it, the rest to a ring neighbour;
    # average degree 10; 10% training nodes. feat_dim 32 as synth-ring keeps it small to train.
    "synth-ring-bench": SyntheticSpec(nodes=1_000_000, avg_degree=10, communities=1_000,
                                      feat_dim=32, classes=8, p_in=0.8, structure="ring",
                                      ring_width=1, train_frac=0.1, val_frac=0.02,
                                      test_frac=0.1),
}


def resolve_spec(name_or_spec: str | SyntheticSpec | dict[str, Any], seed: int | None = None
                 ) -> SyntheticSpec:
    """A preset name, a SyntheticSpec or a dict of its fields -> SyntheticSpec (seed applied)."""
    if isinstance(name_or_spec, SyntheticSpec):
        spec = name_or_spec
    elif isinstance(name_or_spec, dict):
        spec = SyntheticSpec.from_dict(name_or_spec)
    elif name_or_spec in PRESETS:
        spec = PRESETS[name_or_spec]
    else:
        raise ValueError(f"unknown synthetic preset {name_or_spec!r}; valid: {', '.join(sorted(PRESETS))}")
    if seed is not None:
        spec = dataclasses.replace(spec, seed=seed)
    return spec


@dataclass
class SyntheticArrays:
    """The generated graph as plain numpy arrays (what the DGL builder and tests consume)."""

    src: np.ndarray  # int64, directed, symmetric (both directions present), no self loops
    dst: np.ndarray
    feat: np.ndarray  # float32 [nodes, feat_dim]
    label: np.ndarray  # int64
    community: np.ndarray  # int64 (kept for analysis; not stored in the DGL graph)
    train_mask: np.ndarray  # bool
    val_mask: np.ndarray
    test_mask: np.ndarray


def sorted_unique(keys: np.ndarray) -> np.ndarray:
    """np.unique for int64 via sort + neighbour compare: numpy 2.4's hash-based np.unique is
    ~20x slower on tens of millions of keys."""
    keys = np.sort(keys)
    if keys.shape[0] == 0:
        return keys
    keep = np.empty(keys.shape[0], dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def generate_arrays(spec: SyntheticSpec) -> SyntheticArrays:
    rng = np.random.default_rng(spec.seed)
    n, k = spec.nodes, spec.communities

    # Communities: lognormal sizes, every community non-empty; node ids shuffled afterwards.
    weights = rng.lognormal(0.0, spec.community_size_sigma, k)
    sizes = 1 + rng.multinomial(n - k, weights / weights.sum())
    community_sorted = np.repeat(np.arange(k, dtype=np.int64), sizes)
    perm = rng.permutation(n)  # node id of the i-th node in community order
    community = np.empty(n, dtype=np.int64)
    community[perm] = community_sorted

    # Degree propensities: Pareto tail with index gamma-1, capped.
    tail = spec.degree_exponent - 1.0
    theta = (1.0 - rng.random(n)) ** (-1.0 / tail)
    mean_theta = theta.mean()
    cap = max(1.0, spec.max_degree_frac * n / spec.avg_degree) * mean_theta
    theta = np.minimum(theta, cap)
    theta_sorted = theta[perm]  # in community order
    comm_start = np.cumsum(sizes) - sizes

    target = spec.undirected_edges
    max_pairs = n * (n - 1) // 2
    if target > max_pairs:
        raise ValueError(f"avg_degree={spec.avg_degree} needs {target} undirected edges but "
                         f"{n} nodes allow only {max_pairs}")
    keys = np.empty(0, dtype=np.int64)
    yield_ = 1 / 1.08  # new distinct edges per draw; duplicates grow as the graph fills up
    for _round in range(8):
        missing = target - keys.shape[0]
        if _round > 0 and missing <= int(0.002 * target):
            break
        # Stubs (Chung-Lu): node at community-order position i gets Poisson(theta_i * scale)
        # edge ends. The stub array is sorted by position, hence grouped by community, so a
        # theta-proportional draw inside community c is one random index into its stub range.
        m_want = int(missing / max(yield_, 0.05) * 1.02) + 16
        counts = rng.poisson(theta_sorted * (m_want / theta_sorted.sum()))
        stubs = np.repeat(np.arange(n, dtype=np.int64), counts)
        m = stubs.shape[0]
        if m == 0:
            continue
        src_pos = stubs  # edge order is irrelevant: destinations are drawn independently
        per_comm = np.add.reduceat(counts, comm_start)  # stubs per community
        stub_start = np.cumsum(per_comm) - per_comm
        s_comm = community_sorted[src_pos]
        inside = (rng.random(m) < spec.p_in) & (per_comm[s_comm] > 0)
        if spec.structure == "ring":  # outside ends: a community 1..ring_width steps either way
            step = rng.integers(1, spec.ring_width + 1, m) * np.where(rng.random(m) < 0.5, -1, 1)
            t_comm = np.where(inside, s_comm, (s_comm + step) % k)
            inside = per_comm[t_comm] > 0  # (a community without stubs: anywhere)
            s_comm = t_comm
        base = np.where(inside, stub_start[s_comm], 0)
        span = np.where(inside, per_comm[s_comm], m)
        pick = base + np.minimum((rng.random(m) * span).astype(np.int64), span - 1)
        d_pos = stubs[pick]
        a, b = perm[src_pos], perm[d_pos]
        ok = a != b  # no self loops
        a, b = a[ok], b[ok]
        before = keys.shape[0]
        keys = sorted_unique(np.concatenate([keys, np.minimum(a, b) * n + np.maximum(a, b)]))
        yield_ = (keys.shape[0] - before) / m
    if keys.shape[0] > target:  # drop a random surplus (the order of keys is sorted)
        keep = np.sort(rng.choice(keys.shape[0], target, replace=False))
        keys = keys[keep]
    u, v = keys // n, keys % n
    src = np.concatenate([u, v])
    dst = np.concatenate([v, u])

    # Labels: a class per community (every class used when k >= classes), with noise.
    c = spec.classes
    comm_class = rng.permutation(np.arange(max(k, c)) % c)[:k].astype(np.int64)
    label = comm_class[community]
    flip = rng.random(n) < spec.label_noise
    label[flip] = rng.integers(0, c, int(flip.sum()))

    # Features: unit-norm class centroids + isotropic noise with std feat_noise/sqrt(dim)
    # per coordinate, so the noise norm is ~feat_noise times the centroid norm.
    # The noise is drawn by torch (multi-threaded, ~10x numpy's speed on 128M values) from a
    # generator seeded by this rng, so it stays deterministic by seed.
    import torch

    centroids = rng.standard_normal((c, spec.feat_dim)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    feat_t = torch.randn((n, spec.feat_dim), generator=gen, dtype=torch.float32)
    feat_t.mul_(float(spec.feat_noise / np.sqrt(spec.feat_dim)))
    feat_t.add_(torch.from_numpy(centroids)[torch.from_numpy(label)])
    feat = feat_t.numpy()

    # Masks: a random split, disjoint.
    order = rng.permutation(n)
    n_train = max(1, int(round(spec.train_frac * n)))
    n_val = int(round(spec.val_frac * n))
    n_test = min(n - n_train - n_val, int(round(spec.test_frac * n)))
    masks = []
    for lo_i, hi_i in ((0, n_train), (n_train, n_train + n_val),
                       (n_train + n_val, n_train + n_val + n_test)):
        mask = np.zeros(n, dtype=bool)
        mask[order[lo_i:hi_i]] = True
        masks.append(mask)
    return SyntheticArrays(src, dst, feat, label, community, *masks)


def arrays_to_graph(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                    ndata: dict[str, np.ndarray]) -> "dgl.DGLGraph":
    import dgl
    import torch

    g = dgl.graph((torch.from_numpy(np.ascontiguousarray(src, dtype=np.int64)),
                   torch.from_numpy(np.ascontiguousarray(dst, dtype=np.int64))),
                  num_nodes=num_nodes)
    for key, value in ndata.items():
        g.ndata[key] = torch.from_numpy(np.ascontiguousarray(value))
    return g


def generate(name_or_spec: str | SyntheticSpec | dict[str, Any] = "synth-tiny",
             seed: int | None = None) -> "dgl.DGLGraph":
    """Build a synthetic graph: a preset name (see PRESETS), a SyntheticSpec or a dict of its
    fields (nodes, avg_degree, communities, feat_dim, classes, seed, ...). `seed` overrides the
    spec's seed. Returns a DGLGraph with ndata feat (float32), label (int64) and
    train_mask/val_mask/test_mask (bool); same spec and seed -> identical graph."""
    import dgl  # noqa: F401  (imported before the timer: its import takes seconds)

    spec = resolve_spec(name_or_spec, seed)
    t0 = time.perf_counter()
    arr = generate_arrays(spec)
    g = arrays_to_graph(arr.src, arr.dst, spec.nodes, {
        "feat": arr.feat, "label": arr.label, "train_mask": arr.train_mask,
        "val_mask": arr.val_mask, "test_mask": arr.test_mask})
    log.info("generated %d nodes, %d edges (seed %d) in %.1f s", g.num_nodes(), g.num_edges(),
             spec.seed, time.perf_counter() - t0)
    return g
