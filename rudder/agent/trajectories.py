"""Trajectories for the offline-trained classifier baselines (the paper's comparison).

A *decision point* is the close of a metrics window. The collector (`TrajectoryPolicy`, policy
name `collect`) picks replace or skip there with a seeded RNG, lets the choice act on the next
window, and writes one line per decision point to runs/<id>/trajectories-r<R>.jsonl.
A replace acts as the agent's does (one steering skeleton, rudder.agent.steering): with the
lookahead mechanism it holds a lookahead round on every minibatch until the next decision point;
without lookahead it is one MassiveGNN round at the next minibatch. So the action a label judges
is the action a classifier's positive prediction later triggers, and the one an agent's
replace=true triggers.

  {"window", "decided_step", "action", "features": {FEATURE_NAMES...}, "pre": {...},
   "post": {...}, "net_gain", "correct", "label", "rule", "dataset", "policy"}

`pre` / `post` are the window the decision saw and the window right after it (`WindowStats`).
The label (`LabelRule`, rudder.agent.judge) is defined once and used by the collector, the trainer
(`rudder classifiers train --margin/--cost` relabels from the raw pre/post fields) and
`ClassifierPolicy` (its decision records' `correct`):

  hit-rate change   dh   = post.hit_rate - pre.hit_rate                (fractions, 0..1)
  fetch-cost change dc   = (post.c - pre.c) / pre.c                    (relative)
                    c    = mean fetch time per minibatch (cost="time"; it includes the
                           replacement rows, which are pulled with the misses), or fetched rows
                           per minibatch (cost="rows"; also used when a time is missing or 0)
  net_gain               = dh - cost_weight * dc
  a replace was right    iff net_gain >  margin   (it paid for itself within one window)
  a skip was right       iff net_gain >= -margin  (nothing was lost by waiting)
  label (target)         = 1 iff "replace" is the right action here
                         = correct        for a replace decision
                         = 1 - correct    for a skip decision

so both classes are learnable from a trajectory that mixes both actions. Every feature is known
when the window closes (nothing from `post` leaks into `features`).
"""
from __future__ import annotations

import logging
import random
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rudder.agent.judge import LabelRule  # noqa: F401 (the label: defined in judge, re-exported)
from rudder.agent.steering import Decider, Steering, Verdict
from rudder.agent.windows import DecisionPoint, WindowAccumulator, WindowStats  # noqa: F401 (re-exported)
from rudder.config import PrefetchConfig
from rudder.prefetch.policy import RunContext, mechanism_for
from rudder.prefetch.policy import budget_rows as share_rows
from rudder.records import JsonlWriter, read_jsonl, read_run

log = logging.getLogger(__name__)

# Datasets the paper and its code name get their own one-hot column; any other name is hashed
# (crc32, stable across processes) into one of the `ds_other*` buckets.
DATASET_VOCAB = [
    "ogbn-products", "reddit", "ogbn-papers100M", "ogbn-arxiv", "orkut", "friendster", "yelp",
]
OTHER_BUCKETS = 4
DATASET_COLUMNS = [f"ds_{n}" for n in DATASET_VOCAB] + [f"ds_other{i}" for i in range(OTHER_BUCKETS)]

# The feature vector (SPEC: rank, batch size, total/partition/remote node counts, buffer size,
# interval id, number evicted, pre-window hit rate and RPC time, dataset one-hot), plus a few
# scale-free companions that give a model a chance to carry over to other graphs.
BASE_FEATURES = [
    "rank", "num_parts", "batch_size",
    "num_nodes", "partition_nodes", "halo_nodes", "capacity", "capacity_frac",
    "window", "progress",
    "evict_rows",  # rows a replacement would change now: budget rows, capped by stale slots
    "stale_slots", "buffer_fill_frac",
    "pre_hit_rate", "pre_t_fetch",  # window mean: hits/remote rows; seconds per minibatch
    "pre_fetched_rows", "pre_remote_rows",  # per minibatch
    "pre_replaced_rows",  # rows admitted during the window (a recent replacement)
    "pre_hit_rate_delta",  # hit rate change from the window before (0 for the first)
]
FEATURE_NAMES = BASE_FEATURES + DATASET_COLUMNS


def dataset_onehot(name: str | None) -> dict[str, float]:
    out = dict.fromkeys(DATASET_COLUMNS, 0.0)
    if not name:
        return out
    if name in DATASET_VOCAB:
        out[f"ds_{name}"] = 1.0
    else:
        out[f"ds_other{zlib.crc32(name.encode()) % OTHER_BUCKETS}"] = 1.0
    return out


# ---- features -----------------------------------------------------------------------------
def budget_rows(ctx: RunContext, budget: float) -> int:
    """The shared rule (rudder.prefetch.policy.budget_rows); none without a buffer."""
    return share_rows(budget, ctx.capacity) if ctx.capacity > 0 else 0


def context_dataset(ctx: RunContext, override: str | None = None) -> str | None:
    """Dataset name: explicit argument, then ctx.extra['dataset'], then run.json's config."""
    if override:
        return override
    name = ctx.extra.get("dataset") if ctx.extra else None
    if name:
        return str(name)
    if ctx.run_dir:
        try:
            cfg = read_run(ctx.run_dir).get("config", {})
            return cfg.get("dataset", {}).get("name")
        except (OSError, ValueError, AttributeError):
            return None
    return None


def build_features(
    ctx: RunContext,
    stats: WindowStats,
    prev: WindowStats | None,
    *,
    budget: float,
    dataset: str | None,
) -> dict[str, float]:
    """The feature vector at a decision point (names: FEATURE_NAMES)."""
    rows = budget_rows(ctx, budget)
    mech = mechanism_for(ctx.depth)
    evict = min(rows, stats.stale_slots) if mech == "massivegnn" and stats.stale_slots else rows
    total_steps = max(1, ctx.steps_per_epoch * ctx.epochs)
    f = {
        "rank": float(ctx.rank),
        "num_parts": float(ctx.num_parts),
        "batch_size": float(ctx.batch_size),
        "num_nodes": float(ctx.num_nodes),
        "partition_nodes": float(ctx.partition_nodes),
        "halo_nodes": float(ctx.halo_nodes),
        "capacity": float(ctx.capacity),
        "capacity_frac": ctx.capacity / ctx.halo_nodes if ctx.halo_nodes else 0.0,
        "window": float(stats.window),
        "progress": min(1.0, (stats.last_step + 1) / total_steps),
        "evict_rows": float(evict),
        "stale_slots": float(stats.stale_slots),
        "buffer_fill_frac": stats.buffer_fill / ctx.capacity if ctx.capacity else 0.0,
        "pre_hit_rate": stats.hit_rate,
        "pre_t_fetch": stats.t_fetch,
        "pre_fetched_rows": stats.fetched_rows,
        "pre_remote_rows": stats.remote_rows,
        "pre_replaced_rows": stats.replaced_rows,
        "pre_hit_rate_delta": stats.hit_rate - prev.hit_rate if prev is not None else 0.0,
    }
    f.update(dataset_onehot(dataset))
    return f


# ---- deciders on the feature vector ---------------------------------------------------------
class FeatureDecider(Decider):
    """A decider that answers from the feature vector of the window (the classifier, and the
    collector, which writes the vector the classifiers learn from). Its records:
      decided_step  the window's last step (the answer is synchronous)
      staleness     applied_step - decided_step (1 = the very next minibatch)
      budget        prefetch.budget (share of capacity a replace may change); 0 for a skip
      correct       LabelRule.correct(replace, pre, post): was the action right (the agent's
                    `correct` is instead whether its predicted directions came true)
    The outcome fields are the agent's (rudder.records.outcome_fields), measured on WindowStats.
    """

    def __init__(self, *, rule: LabelRule | None = None, dataset: str | None = None):
        super().__init__(rule)
        self.dataset_override = dataset

    def setup(self, steer: Steering) -> None:
        super().setup(steer)
        self.dataset = context_dataset(steer.ctx, self.dataset_override)

    def features(self, point: DecisionPoint) -> dict[str, float]:
        """The window's feature vector (a subclass may add to it)."""
        return build_features(self.steer.ctx, point.stats, point.prev, budget=self.steer.cfg.budget,
                              dataset=self.dataset)

    def decide(self, point: DecisionPoint) -> Verdict:
        feats = self.features(point)
        replace, info = self.choose(feats, point.stats)
        return self.verdict(point, replace, raw=info.get("raw"), reason=info.get("reason"),
                            latency_s=info.get("latency_s", 0.0), memo=feats)

    def choose(self, features: dict[str, float], stats: WindowStats) -> tuple[bool, dict]:
        """(replace?, {"raw", "reason", "latency_s"})"""
        raise NotImplementedError


# ---- the collector --------------------------------------------------------------------------
class RandomDecider(FeatureDecider):
    """Replaces with probability `p_replace` (seeded RNG: `seed` + rank), so both actions and
    both labels appear in the trajectory, which it writes as each decision is judged."""

    label = "collect"
    backend = "random"

    def __init__(self, *, p_replace: float = 0.5, seed: int | None = None, path: str | None = None,
                 rule: LabelRule | None = None, dataset: str | None = None):
        if not 0.0 <= p_replace <= 1.0:
            raise ValueError(f"p_replace must be in [0, 1], got {p_replace}")
        super().__init__(rule=rule, dataset=dataset)
        self.p_replace = p_replace
        self.seed = seed
        self.path = path
        self.trajectories: list[dict] = []
        self._writer: JsonlWriter | None = None

    def setup(self, steer: Steering) -> None:
        super().setup(steer)
        ctx = steer.ctx
        seed = self.seed if self.seed is not None else int(ctx.extra.get("seed", 0) or 0)
        self.rng = random.Random(seed * 1_000_003 + ctx.rank)
        path = self.path or (
            str(Path(ctx.run_dir) / f"trajectories-r{ctx.rank}.jsonl") if ctx.run_dir else None)
        self._writer = JsonlWriter(Path(path)) if path else None

    def choose(self, features: dict[str, float], stats: WindowStats) -> tuple[bool, dict]:
        replace = self.rng.random() < self.p_replace
        return replace, {"raw": None, "reason": "schedule", "latency_s": 0.0}

    def judged(self, v: Verdict, post: DecisionPoint, hit, rows) -> None:
        rec, pre_d, post_d = v.record, asdict(v.point.stats), asdict(post.stats)
        traj = {
            "window": rec.window,
            "decided_step": rec.decided_step,
            "applied_step": rec.applied_step,
            "action": int(rec.replace),
            "features": v.memo,
            "pre": pre_d,
            "post": post_d,
            "net_gain": self.rule.net_gain(pre_d, post_d),
            "correct": bool(rec.correct),
            "label": self.rule.label(rec.replace, pre_d, post_d),
            "rule": asdict(self.rule),
            "dataset": self.dataset,
            "max_rows": self.steer.max_rows,
            "mechanism": self.steer.mechanism,
        }
        self.trajectories.append(traj)
        if self._writer is not None:
            self._writer.write(traj)

    def close(self) -> list[Verdict]:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return super().close()


class TrajectoryPolicy(Steering):
    """Collection mode (`collect[:k]`): at every k-th window close, the RandomDecider.

    extra: every, p_replace, seed, dataset, margin, cost, path (default
    <run_dir>/trajectories-r<rank>.jsonl; in memory only when the run has no directory).
    """

    name = "collect"

    def __init__(self, cfg: PrefetchConfig, *, every: int | None = None, p_replace: float = 0.5,
                 seed: int | None = None, dataset: str | None = None, margin: float = 0.01,
                 cost: str = "time", path: str | None = None, model_name: str | None = None,
                 **_ignored: Any):
        if every is None:
            if model_name and not model_name.isdigit():
                raise ValueError(f"policy 'collect:{model_name}': the argument is the number of "
                                 "windows between decision points, e.g. collect:2")
            every = int(model_name) if model_name else 1
        decider = RandomDecider(p_replace=p_replace, seed=seed, path=path, dataset=dataset,
                                rule=LabelRule(margin=margin, cost=cost))
        super().__init__(cfg, decider, decide_every=every)

    @property
    def trajectories(self) -> list[dict]:
        return self.decider.trajectories


# ---- reading trajectories back --------------------------------------------------------------
def trajectory_files(paths: Iterable[str | Path]) -> list[Path]:
    """Run dirs (searched recursively for trajectories-r*.jsonl) or trajectory files."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.rglob("trajectories-r*.jsonl")))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such run directory or trajectory file: {p}")
    return files


@dataclass
class TrajectorySet:
    """Feature matrix, labels and provenance, in FEATURE_NAMES order."""

    X: "Any"  # numpy array [n, len(feature_names)]
    y: "Any"  # numpy int array [n]
    feature_names: list[str]
    records: list[dict] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.y)


ACTIONS = {"all": None, "replace": 1, "skip": 0}


def load_trajectories(paths: Iterable[str | Path], rule: LabelRule | None = None,
                      feature_names: list[str] | None = None,
                      actions: str = "all") -> TrajectorySet:
    """Reads trajectory lines; `rule` relabels from the raw pre/post fields (None: the label
    stored at collection). Features absent from a line (an older vocabulary) read as 0.
    actions: "all", or only the "replace" decisions (whose label is unambiguous: did this
    replacement pay?) or only the "skip" ones. A skip label is ambiguous where the hit rate is
    low but steady: skipping lost nothing (label keep) though replacing might have gained."""
    import numpy as np

    if actions not in ACTIONS:
        raise ValueError(f"actions must be one of {', '.join(ACTIONS)}, got {actions!r}")
    want = ACTIONS[actions]
    names = list(feature_names or FEATURE_NAMES)
    files = trajectory_files(paths)
    records: list[dict] = []
    for f in files:
        for r in read_jsonl(f):
            if "features" not in r or not ("label" in r or ("pre" in r and "post" in r)):
                continue
            if want is not None and int(r.get("action", -1)) != want:
                continue
            r["_source"] = str(f)
            records.append(r)
    if not records:
        where = ", ".join(str(p) for p in files) or "the given paths"
        raise ValueError(
            f"no trajectories found in {where}; collect some with prefetch policy 'collect' "
            "(trajectories-r<R>.jsonl in each run directory)")
    X = np.array([[float(r["features"].get(n, 0.0)) for n in names] for r in records],
                 dtype=np.float64)
    if rule is None:
        y = np.array([int(r["label"]) for r in records], dtype=np.int64)
    else:
        raw = [r for r in records if not ("pre" in r and "post" in r and "action" in r)]
        if raw:
            raise ValueError(f"cannot relabel: {len(raw)} trajectories (e.g. in "
                             f"{raw[0]['_source']}) lack the raw action/pre/post fields")
        y = np.array([rule.label(bool(r["action"]), r["pre"], r["post"]) for r in records],
                     dtype=np.int64)
    return TrajectorySet(X, y, names, records, [str(f) for f in files])
