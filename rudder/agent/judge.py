"""Where a decision is judged: every rule that says whether a decision was right, in one place.

A decision is judged on what happened after it, in one of five senses, each used where it fits:
  prediction  the agent's predicted directions came true in the window after it
              (`reflect`: Decision.correct, Pass@1; the history the prompts show)
  action      the action paid for itself within one window (`LabelRule`: the classifiers'
              labels and their decision records' `correct`)
  hindsight   replacing beat keeping in a replay of both branches from the same buffer state
              (`hindsight_label` on rudder.agent.hindsight.counterfactual_gains)
  counterfactual  the decision's action was the right one by that replay (`counterfactual`:
              DecisionRecord.correct_cf, counterfactual Pass@1; rudder.agent.hindsight.judge_run)
  label       an answer agrees with a window's label (`agrees`: the eval suite's accuracy and
              the hindsight check of labelled windows)
During a run, one place applies the first two to every decision: `Steering._judge`
(rudder.agent.steering), whatever the decider.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rudder.agent.signals import per_minibatch
from rudder.records import outcome_fields

if TYPE_CHECKING:
    from rudder.agent.messages import Decision

REPLACE_MARGIN = 0.005  # a replacement must save more than 0.5% of the horizon's remote rows
KEEP_MARGIN = 0.0  # keep is right when replacing saves nothing


# ---- prediction ----------------------------------------------------------------------------
def measure(judged: dict, after: dict) -> tuple[float | None, float | None]:
    """(hit-rate delta, relative fetched-rows-per-minibatch delta) from `judged` to `after`."""
    hit = None
    if judged.get("hit_rate") is not None and after.get("hit_rate") is not None:
        hit = float(after["hit_rate"]) - float(judged["hit_rate"])
    a, b = per_minibatch(judged, "fetched_rows"), per_minibatch(after, "fetched_rows")
    rows = None if a is None or b is None else (b - a) / max(a, 1.0)
    return hit, rows


def reflect(d: "Decision", judged: dict, after: dict) -> tuple[float | None, float | None]:
    """Sets d.outcome_* (directions and deltas) and d.correct from the window after the
    decision; returns the deltas."""
    hit, rows = measure(judged, after)
    for k, v in outcome_fields(hit, rows).items():
        setattr(d, k, v)
    if d.fallback or d.outcome_hit_rate is None or d.outcome_remote_rows is None:
        d.correct = None
    else:
        d.correct = (d.expected_hit_rate == d.outcome_hit_rate
                     and d.expected_remote_rows == d.outcome_remote_rows)
    return hit, rows


# ---- action --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LabelRule:
    """Whether an action was right, judged on the window after it (the formulas:
    rudder.agent.trajectories' docstring)."""

    margin: float = 0.01  # one hit-rate point: smaller changes count as "nothing happened"
    cost: str = "time"  # "time" (the paper: RPC time) or "rows" (deterministic volume)
    cost_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.cost not in ("time", "rows"):
            raise ValueError(f"label cost must be 'time' or 'rows', got {self.cost!r}")

    def net_gain(self, pre: dict, post: dict) -> float:
        dh = float(post["hit_rate"]) - float(pre["hit_rate"])
        key = "t_fetch" if self.cost == "time" else "fetched_rows"
        c0, c1 = float(pre.get(key) or 0), float(post.get(key) or 0)
        if key == "t_fetch" and (c0 <= 0 or c1 <= 0):  # no timing: fall back on the volume
            c0, c1 = float(pre.get("fetched_rows") or 0), float(post.get("fetched_rows") or 0)
        dc = (c1 - c0) / c0 if c0 > 0 else 0.0
        return dh - self.cost_weight * dc

    def correct(self, replace: bool, pre: dict, post: dict) -> bool:
        g = self.net_gain(pre, post)
        return g > self.margin if replace else g >= -self.margin

    def label(self, replace: bool, pre: dict, post: dict) -> int:
        ok = self.correct(replace, pre, post)
        return int(ok if replace else not ok)


# ---- hindsight -----------------------------------------------------------------------------
def hindsight_label(cf: dict | None, replace_margin: float = REPLACE_MARGIN,
                    keep_margin: float = KEEP_MARGIN) -> bool | None:
    """replace (True) when the counterfactual gain beats replace_margin of the horizon's remote
    rows; keep (False) when it is at most keep_margin; None in between (too close to call)."""
    if cf is None:
        return None
    if cf["share"] > replace_margin:
        return True
    if cf["share"] <= keep_margin:
        return False
    return None


def counterfactual(replace: bool | None, fallback, replace_share: float | None) -> bool | None:
    """correct_cf: a decision's predicted effect is that its action beats the alternative
    (replace: replacing saves rows net of the rows it pulls; keep: replacing would not), so it
    is true when the action agrees with `hindsight_label` of what replacing saved
    (replace_share); None for a fallback (its action was not the decision's), an unjudged
    decision, or a saving too close to call (0 < share <= REPLACE_MARGIN)."""
    if fallback or replace is None or replace_share is None:
        return None
    return agrees(bool(replace), hindsight_label({"share": replace_share}))


# ---- label ---------------------------------------------------------------------------------
def agrees(replace: bool | None, label_replace: bool | None, fallback: str | None = None) -> bool | None:
    """An answer (replace, or a fallback: never right) against a window's label; None when the
    window has no label."""
    if label_replace is None:
        return None
    return fallback is None and replace == bool(label_replace)
