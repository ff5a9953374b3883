"""How fast a run's epochs could have been: two lower bounds from its own minibatch records.

  compute-only  Σ over an epoch's steps of the step's compute time: features and sampling free.
  pipeline      per rank Σ over its steps of max(t_sample, compute): features free, the loader
                sampling the next minibatch while the trainer computes this one; the epoch's
                bound is its slowest rank's.

A step's compute is the least t_compute over the ranks: a rank's t_compute includes waiting at
the gradient all-reduce for the slowest rank (often one still fetching), so the least is the
work itself. The same definition as the results store's `vs_none` query (bound_s). A run's
bound is the mean over its epochs, set beside its epoch time (the slowest rank's t_epoch, mean
over epochs); the ratios epoch / bound are >= 1 for any real run.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass


@dataclass
class Bounds:
    epochs: int  # epochs with minibatch records
    compute_s: float | None  # compute-only bound, mean per epoch
    pipeline_s: float | None  # pipeline bound, mean per epoch
    epoch_s: float | None  # epoch time (slowest rank), mean over the epochs that have one
    epoch_over_compute: float | None
    epoch_over_pipeline: float | None
    per_epoch: list[dict]  # {epoch, compute_s, pipeline_s, epoch_s}

    def to_dict(self) -> dict:
        return asdict(self)


def _f(x) -> float:
    return float(x) if x is not None else 0.0


def run_bounds(minibatches: Mapping[int, Iterable[Mapping]],
               epochs: Mapping[int, Iterable[Mapping]] | None = None) -> Bounds:
    """minibatches / epochs: rank -> its MinibatchRecord / EpochRecord dicts (the lines of
    minibatches-r<R>.jsonl, epochs-r<R>.jsonl). A missing time counts as 0."""
    mbs = {r: list(v) for r, v in minibatches.items()}
    compute: dict[tuple[int, int], float] = {}  # (epoch, step) -> least t_compute over ranks
    for recs in mbs.values():
        for m in recs:
            k = (int(m["epoch"]), int(m["step"]))
            c = _f(m.get("t_compute"))
            compute[k] = min(compute.get(k, c), c)
    comp_ep: dict[int, float] = defaultdict(float)
    for (e, _), c in compute.items():
        comp_ep[e] += c
    pipe_ep: dict[int, float] = {}
    for recs in mbs.values():
        rank_ep: dict[int, float] = defaultdict(float)
        for m in recs:
            e = int(m["epoch"])
            rank_ep[e] += max(_f(m.get("t_sample")), compute[(e, int(m["step"]))])
        for e, v in rank_ep.items():
            pipe_ep[e] = max(pipe_ep.get(e, 0.0), v)
    t_ep: dict[int, float] = {}
    for recs in (epochs or {}).values():
        for r in recs:
            if r.get("t_epoch") is not None:
                e = int(r["epoch"])
                t_ep[e] = max(t_ep.get(e, 0.0), float(r["t_epoch"]))
    per_epoch = [{"epoch": e, "compute_s": comp_ep[e], "pipeline_s": pipe_ep[e],
                  "epoch_s": t_ep.get(e)} for e in sorted(comp_ep)]
    # means over the epochs that have an epoch time (as the store does); all of them if none has
    timed = [p for p in per_epoch if p["epoch_s"] is not None] or per_epoch

    def mean(key: str) -> float | None:
        vals = [p[key] for p in timed if p[key] is not None]
        return sum(vals) / len(vals) if vals else None

    c, p, t = mean("compute_s"), mean("pipeline_s"), mean("epoch_s")
    return Bounds(len(per_epoch), c, p, t, t / c if t is not None and c else None,
                  t / p if t is not None and p else None, per_epoch)


def epoch_bounds(epoch: int, per_rank: Iterable[tuple[Iterable[float], Iterable[float], float]]) -> dict:
    """One epoch's bounds from every rank's (t_sample per step, t_compute per step, t_epoch), as
    the trainers gather them at the epoch's end: the EpochRecord's t_epoch_max, bound_compute_s,
    bound_pipeline_s, epoch_over_compute, epoch_over_pipeline (run_bounds' definitions)."""
    mbs, eps = {}, {}
    for r, (samples, computes, t_epoch) in enumerate(per_rank):
        mbs[r] = [{"epoch": epoch, "step": i, "t_sample": s, "t_compute": c}
                  for i, (s, c) in enumerate(zip(samples, computes))]
        eps[r] = [{"epoch": epoch, "t_epoch": t_epoch}]
    b = run_bounds(mbs, eps)
    return {"t_epoch_max": b.epoch_s, "bound_compute_s": b.compute_s, "bound_pipeline_s": b.pipeline_s,
            "epoch_over_compute": b.epoch_over_compute, "epoch_over_pipeline": b.epoch_over_pipeline}
