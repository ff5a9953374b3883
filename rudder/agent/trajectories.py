"""Trajectories for the offline-trained classifier baselines (the paper's comparison).

A *decision point* is the close of a metrics window. The collector (`TrajectoryPolicy`, policy
name `collect`) picks replace or skip there with a seeded RNG, lets the choice act on the next
window, and writes one line per decision point to runs/<id>/trajectories-r<R>.jsonl.
A replace acts as the agent's does (WindowedDecisionPolicy): with the lookahead mechanism it
holds a lookahead round on every minibatch until the next decision point; without lookahead it
is one MassiveGNN round at the next minibatch. So the action a label judges is the action a
classifier's positive prediction later triggers, and the one an agent's replace=true triggers.

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
import threading
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rudder.agent.judge import LabelRule  # noqa: F401 (the label: defined in judge, re-exported)
from rudder.agent.steering import Regime
from rudder.config import PrefetchConfig
from rudder.prefetch.policy import Policy, Replace, RunContext, StepInfo, mechanism_for
from rudder.prefetch.policy import budget_rows as share_rows
from rudder.records import DecisionRecord, JsonlWriter, outcome_fields, read_jsonl, read_run

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


# ---- window statistics --------------------------------------------------------------------
@dataclass
class WindowStats:
    """One metrics window, aggregated by the policy itself from the per-minibatch records it
    observed (so it does not depend on how the trainer aggregates its window record)."""

    window: int
    first_step: int
    last_step: int
    minibatches: int
    hit_rate: float  # sum(hits) / sum(remote_rows): the SPEC's %-hits over the window
    t_fetch: float  # mean seconds per minibatch
    fetched_rows: float  # mean per minibatch (misses + replaced rows)
    remote_rows: float  # mean per minibatch
    replaced_rows: float  # total in the window
    stale_slots: int = 0
    buffer_fill: int = 0


class WindowAccumulator:
    """Sums MINIBATCH_FIELDS records until the trainer closes a window."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.n = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.hits = self.remote = self.fetched = self.replaced = 0.0
        self.t_fetch = 0.0

    def add(self, m: dict) -> None:
        self.n += 1
        gs = int(m.get("global_step", self.n - 1))
        self.first_step = gs if self.first_step is None else self.first_step
        self.last_step = gs
        self.remote += float(m.get("remote_rows") or 0)
        self.hits += float(m.get("hits") or 0)
        self.fetched += float(m.get("fetched_rows") or 0)
        self.replaced += float(m.get("replaced_rows") or 0)
        self.t_fetch += float(m.get("t_fetch") or 0)

    def close(self, window: dict, index: int) -> WindowStats:
        if self.n == 0:  # no per-minibatch records seen: fall back on the trainer's aggregate
            mb = max(1, int(window.get("minibatches") or 1))
            stats = WindowStats(
                window=int(window.get("window", index)),
                first_step=int(window.get("first_step", 0)),
                last_step=int(window.get("last_step", 0)),
                minibatches=mb,
                hit_rate=float(window.get("hit_rate") or 0.0),
                t_fetch=float(window.get("t_fetch") or 0.0) / mb,
                fetched_rows=float(window.get("fetched_rows") or 0.0) / mb,
                remote_rows=float(window.get("remote_rows") or 0.0) / mb,
                replaced_rows=float(window.get("replaced_rows") or 0.0),
            )
        else:
            n = self.n
            stats = WindowStats(
                window=int(window.get("window", index)),
                first_step=int(self.first_step or 0),
                last_step=int(self.last_step or 0),
                minibatches=n,
                hit_rate=self.hits / self.remote if self.remote > 0 else 0.0,
                t_fetch=self.t_fetch / n,
                fetched_rows=self.fetched / n,
                remote_rows=self.remote / n,
                replaced_rows=self.replaced,
            )
        stats.stale_slots = int(window.get("stale_slots") or 0)
        stats.buffer_fill = int(window.get("buffer_fill") or 0)
        self._reset()
        return stats


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
    mech = mechanism_for(ctx.lookahead)
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


# ---- the shared windowed-policy skeleton ----------------------------------------------------
class WindowedDecisionPolicy(Policy):
    """Decides at each window close, applies at the next plan(), judges one window later.

    A replace decision behaves as the agent's (rudder.agent.policy): with the lookahead
    mechanism (ctx.lookahead > 0) it sets a regime, Replace("lookahead", budget rows) on every
    plan() until the next decision is taken; without lookahead it is one MassiveGNN round at the
    first plan() after the decision. A skip runs no round until the next decision.

    Subclasses implement `decide(features, stats) -> (replace, info)`; the skeleton keeps the
    pending Replace, the DECISION_FIELDS records and their outcomes. Record semantics (those of
    the agent where they overlap):
      decided_step  the latest global step seen when deciding (the window's last step: the
                    decision is synchronous)
      applied_step  the minibatch whose plan() took it (skips too; None if none came)
      staleness     applied_step - decided_step (1 = the very next minibatch)
      outcome_hit_delta    post-window hit rate - pre-window hit rate (0..1 units)
      outcome_rows_delta   relative change of fetched rows per minibatch (misses + replaced
                           rows), post vs pre, as the agent's `rows_delta`
      outcome_hit_rate, outcome_remote_rows  the same as directions (up|down|flat; flat under
                           1 pt / 2%), as the agent writes them (rudder.records.outcome_fields)
      correct       LabelRule.correct(replace, pre, post): was the action right (the agent's
                    `correct` is instead whether its predicted directions came true)
      budget        share of capacity a replace may change (cfg.budget); 0 for a skip
    """

    name = "windowed"
    records_decisions = True
    backend = ""
    model_label: str | None = None

    def __init__(self, cfg: PrefetchConfig, *, rule: LabelRule | None = None,
                 dataset: str | None = None, decide_every: int = 1):
        if decide_every < 1:
            raise ValueError(f"decide_every must be >= 1, got {decide_every}")
        self.cfg = cfg
        self.budget = cfg.budget
        self.rule = rule or LabelRule()
        self.dataset_override = dataset
        self.decide_every = decide_every
        self._acc = WindowAccumulator()
        self._windows_seen = 0
        self._prev: WindowStats | None = None
        self._pending: dict | None = None  # decided, not yet taken by plan()
        self._regime = Regime()  # repeated by plan() until the next decision
        # decided, awaiting their outcome window: (record, pre-window, features)
        self._open: list[tuple[dict, WindowStats, dict[str, float]]] = []
        self._ready: list[dict] = []
        self._count = 0
        # plan() may run in the loader thread and observe() in the training loop's
        self._lock = threading.Lock()

    # -- Policy interface --
    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.max_rows = budget_rows(ctx, self.budget)
        self.mechanism = mechanism_for(ctx.lookahead)
        self.dataset = context_dataset(ctx, self.dataset_override)

    def plan(self, step: StepInfo) -> Replace | None:
        with self._lock:
            rec, self._pending = self._pending, None
        if rec is None:
            return self._regime.standing  # a lookahead round every minibatch, or none
        rec["applied_step"] = step.global_step
        rec["staleness"] = step.global_step - rec["decided_step"]
        replace = rec["replace"] and self.max_rows > 0
        return self._regime.apply(
            Replace(self.mechanism, self.max_rows, rec["policy"], self.cfg.admit) if replace else None)

    def observe(self, metrics: dict, window: dict | None = None) -> None:
        if metrics:
            self._acc.add(metrics)
        if window is None:
            return
        stats = self._acc.close(window, self._windows_seen)
        self._windows_seen += 1
        with self._lock:
            self._judge(stats)
            if self._windows_seen % self.decide_every == 0:
                self._decide_at(stats)
        self._prev = stats

    def decisions(self) -> list[dict]:
        with self._lock:
            out, self._ready = self._ready, []
        return out

    def close(self) -> None:
        # Decisions whose outcome window never came: reported without an outcome.
        with self._lock:
            self._ready.extend(rec for rec, _, _ in self._open)
            self._open = []
            self._pending = None
        self._regime.end()

    # -- to implement --
    def decide(self, features: dict[str, float], stats: WindowStats) -> tuple[bool, dict]:
        raise NotImplementedError

    def on_outcome(self, rec: dict, features: dict, pre: WindowStats, post: WindowStats) -> None:
        """Hook: a decision's outcome window has closed (rec already holds the outcome)."""

    # -- internals --
    def _decide_at(self, stats: WindowStats) -> None:
        feats = build_features(self.ctx, stats, self._prev, budget=self.budget,
                               dataset=self.dataset)
        replace, info = self.decide(feats, stats)
        rec = DecisionRecord(
            decision=self._count, window=stats.window, decided_step=stats.last_step,
            policy=self.policy_label(), model=self.model_label, backend=self.backend,
            raw=info.get("raw"), replace=bool(replace), budget=self.budget if replace else 0.0,
            reason=info.get("reason"), latency_s=info.get("latency_s", 0.0),
        ).to_dict()
        self._count += 1
        self._pending = rec
        self._open.append((rec, stats, feats))

    def _judge(self, post: WindowStats) -> None:
        """The window that just closed is the outcome of every decision still open (they were
        taken at the previous close). One never taken by plan() keeps applied_step None."""
        self._pending = None
        for rec, pre, feats in self._open:
            pre_d, post_d = asdict(pre), asdict(post)
            rec.update(outcome_fields(
                post.hit_rate - pre.hit_rate,
                (post.fetched_rows - pre.fetched_rows) / pre.fetched_rows
                if pre.fetched_rows > 0 else None))
            rec["correct"] = self.rule.correct(rec["replace"], pre_d, post_d)
            self.on_outcome(rec, feats, pre, post)
            self._ready.append(rec)
        self._open = []

    def policy_label(self) -> str:
        return self.name


# ---- the collector --------------------------------------------------------------------------
class TrajectoryPolicy(WindowedDecisionPolicy):
    """Collection mode: at every `every`-th window close, replace with probability `p_replace`
    (seeded RNG: `seed` + rank), so both actions and both labels appear in the trajectory.

    Registry: "collect" -> TrajectoryPolicy(cfg, **extra); "collect:<k>" sets every=k.
    extra: every, p_replace, seed, dataset, margin, cost, path (default
    <run_dir>/trajectories-r<rank>.jsonl; in memory only when the run has no directory).
    """

    name = "collect"
    backend = "random"

    def __init__(self, cfg: PrefetchConfig, *, every: int | None = None, p_replace: float = 0.5,
                 seed: int | None = None, dataset: str | None = None, margin: float = 0.01,
                 cost: str = "time", path: str | None = None, model_name: str | None = None,
                 **_ignored: Any):
        if every is None:
            if model_name and not model_name.isdigit():
                raise ValueError(f"policy 'collect:{model_name}': the argument is the number of "
                                 "windows between decision points, e.g. collect:2")
            every = int(model_name) if model_name else 1
        if not 0.0 <= p_replace <= 1.0:
            raise ValueError(f"p_replace must be in [0, 1], got {p_replace}")
        super().__init__(cfg, rule=LabelRule(margin=margin, cost=cost), dataset=dataset,
                         decide_every=every)
        self.p_replace = p_replace
        self.seed = seed
        self.path = path
        self.trajectories: list[dict] = []
        self._writer: JsonlWriter | None = None

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        seed = self.seed if self.seed is not None else int(ctx.extra.get("seed", 0) or 0)
        self.rng = random.Random(seed * 1_000_003 + ctx.rank)
        path = self.path or (
            str(Path(ctx.run_dir) / f"trajectories-r{ctx.rank}.jsonl") if ctx.run_dir else None)
        self._writer = JsonlWriter(Path(path)) if path else None

    def decide(self, features: dict[str, float], stats: WindowStats) -> tuple[bool, dict]:
        replace = self.rng.random() < self.p_replace
        return replace, {"raw": None, "reason": "schedule", "latency_s": 0.0}

    def on_outcome(self, rec: dict, features: dict, pre: WindowStats, post: WindowStats) -> None:
        pre_d, post_d = asdict(pre), asdict(post)
        traj = {
            "window": rec["window"],
            "decided_step": rec["decided_step"],
            "applied_step": rec["applied_step"],
            "action": int(rec["replace"]),
            "features": features,
            "pre": pre_d,
            "post": post_d,
            "net_gain": self.rule.net_gain(pre_d, post_d),
            "correct": bool(rec["correct"]),
            "label": self.rule.label(rec["replace"], pre_d, post_d),
            "rule": asdict(self.rule),
            "dataset": self.dataset,
            "max_rows": self.max_rows,
            "mechanism": self.mechanism,
        }
        self.trajectories.append(traj)
        if self._writer is not None:
            self._writer.write(traj)

    def close(self) -> None:
        super().close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


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
